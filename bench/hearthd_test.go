package bench

import (
	"strings"
	"testing"
)

func TestParseCounter(t *testing.T) {
	exp := `# HELP go_memstats_mallocs_total Total number of mallocs.
# TYPE go_memstats_mallocs_total counter
go_memstats_mallocs_total_extra 7
go_memstats_mallocs_total 1.234567e+06
go_memstats_frees_total 1.2e+06
`
	v, err := parseCounter(strings.NewReader(exp), mallocsMetric)
	if err != nil || v != 1234567 {
		t.Fatalf("parseCounter = %v, %v; want 1234567", v, err)
	}
	if _, err := parseCounter(strings.NewReader("go_memstats_frees_total 3\n"), mallocsMetric); err == nil {
		t.Fatal("missing counter accepted")
	}
	if _, err := parseCounter(strings.NewReader("go_memstats_mallocs_total x\n"), mallocsMetric); err == nil {
		t.Fatal("bad value accepted")
	}
}
