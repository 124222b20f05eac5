package deployapi

import (
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// halfClosed sends a whole request for path with body on a fresh
// connection, shuts the connection's write side, and returns everything
// the server sent back until it closed.
func (ta *testAPI) halfClosed(t *testing.T, path, body string) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ta.root, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /api/v1" + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil && !isReset(err) {
		t.Fatalf("%s: %v after %q", path, err, got)
	}
	return string(got)
}

func isReset(err error) bool { return strings.Contains(err.Error(), "connection reset") }

// A client that sends a whole request and shuts its write side is taken
// for gone (a FIN is all the server sees) and its generation cancelled;
// it must never get a success without a body: the connection closes
// without an answer (or the answer is served).
func TestHalfClosedRequestGetsNoEmptySuccess(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	// Chat and completions wait in the runtime for the first token;
	// embeddings wait for Hold.
	ta := startAPI(t, fake.Config{ChatDelay: time.Hour, Hold: hold}, nil)
	for _, c := range []struct{ path, body string }{
		{"/chat/completions", hiBody},
		{"/chat/completions", chatBody("hi", `,"stream":true`)},
		{"/responses", `{"model":"hearth-tiny","input":"hi"}`},
		{"/responses", `{"model":"hearth-tiny","input":"hi","stream":true}`},
		{"/completions", `{"model":"hearth-tiny","prompt":"hi"}`},
		{"/completions", `{"model":"hearth-tiny","prompt":"hi","stream":true}`},
		{"/embeddings", `{"model":"hearth-tiny","input":"hi"}`},
	} {
		got := ta.halfClosed(t, c.path, c.body)
		if got != "" && (strings.HasPrefix(got, "HTTP/1.1 2") || !strings.HasPrefix(got, "HTTP/1.1 ")) {
			t.Errorf("%s %s: answered %q", c.path, c.body, got)
		}
	}
	// Nothing was left running.
	waitIdle(t, ta)
}

// A request queued behind busy slots whose client shuts its write side is
// not answered with an empty success either.
func TestHalfClosedWhileQueuedGetsNoEmptySuccess(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, Hold: hold}, func(c *APIConfig) { c.MaxConcurrent = 1 })
	resp := ta.post(t, chatBody("busy", `,"stream":true`), nil)
	defer resp.Body.Close()
	if got := ta.halfClosed(t, "/chat/completions", hiBody); got != "" && strings.HasPrefix(got, "HTTP/1.1 2") {
		t.Fatalf("queued: answered %q", got)
	}
}

func waitIdle(t *testing.T, ta *testAPI) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "no request left running", func() bool {
		return ta.api.lim.active() == 0 && ta.api.lim.queued() == 0
	})
}
