package command

import (
	"context"
	"io"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var got []string
	p := Program{Name: "prog", Usage: "usage: prog serve\n", Version: "1.2.3", Commands: map[string]Func{
		"serve": func(_ context.Context, args []string, _, _ io.Writer) error { got = args; return nil },
	}}
	for _, tc := range []struct {
		args              []string
		wantErr           string
		wantOut, wantErr2 string
	}{
		{args: []string{"serve", "--listen", "x"}},
		{args: []string{"version"}, wantOut: "1.2.3\n"},
		{args: []string{"--help"}, wantOut: p.Usage},
		{args: nil, wantErr: "missing command", wantErr2: p.Usage},
		{args: []string{"serv"}, wantErr: `unknown command "serv"`, wantErr2: p.Usage},
	} {
		var out, errb strings.Builder
		err := p.Run(context.Background(), tc.args, &out, &errb)
		if (err == nil) != (tc.wantErr == "") || err != nil && err.Error() != tc.wantErr {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.wantErr)
		}
		if out.String() != tc.wantOut || errb.String() != tc.wantErr2 {
			t.Errorf("%q: stdout %q stderr %q, want %q and %q", tc.args, out.String(), errb.String(), tc.wantOut, tc.wantErr2)
		}
	}
	if strings.Join(got, " ") != "--listen x" {
		t.Errorf("serve got %q, want the arguments after its name", got)
	}
}
