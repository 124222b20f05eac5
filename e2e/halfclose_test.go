package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// A client that sends a whole request and shuts its write side, on every
// route that reaches the real runtime, gets its answer or a closed
// connection: never a success without a body.
func TestHalfClosedRequests(t *testing.T) {
	shared.ollama.ForEach(t, testHalfClosedRequests)
}

func testHalfClosedRequests(t *testing.T, inst *ollamatest.Instance) {
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL}})
	m := inst.Model
	for _, c := range []struct{ path, body string }{
		{"/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"Tell a story."}]}`, m)},
		{"/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Tell a story."}]}`, m)},
		{"/responses", fmt.Sprintf(`{"model":%q,"max_output_tokens":64,"input":"Tell a story."}`, m)},
		{"/completions", fmt.Sprintf(`{"model":%q,"max_tokens":64,"prompt":"Once upon a time"}`, m)},
		{"/embeddings", fmt.Sprintf(`{"model":%q,"input":["a story","another one"]}`, m)},
	} {
		for range 3 {
			conn := dialRaw(t, h.root)
			rawPost(conn, "/api/v1"+c.path, h.secret, len(c.body), c.body)
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				conn.Close()
				continue // closed without an answer
			}
			b, err := io.ReadAll(resp.Body)
			conn.Close()
			if resp.StatusCode/100 == 2 && (len(b) == 0 || err != nil) {
				t.Fatalf("%s %s: %d with a body of %d bytes (%v)", c.path, c.body, resp.StatusCode, len(b), err)
			}
		}
	}
}
