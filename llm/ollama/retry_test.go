package ollama

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/hearthd/hearth/llm"
)

// A connection the runtime closed while it sat in the pool (the runtime
// restarted, or closed it idle) costs no generation: one it never answered
// is sent again on a new connection.
func TestGenerationSentAgainWhenAKeptConnectionWasClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var requests atomic.Int64
		hc, dials := pipeRuntime(func(c net.Conn) {
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if requests.Add(1) == 2 {
					return // read, never answered: closed as a restarting runtime closes it
				}
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"+
					chunked(`{"model":"m","created_at":"t","message":{"role":"assistant","content":"Hi"},"done":false}`)+
					chunked(`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":1}`)+
					"0\r\n\r\n"); err != nil {
					return
				}
			}
		})
		b := newBackend(t, "http://127.0.0.1:1", func(cfg *Config) { cfg.HTTPClient = hc })
		for i := range 2 {
			s, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("hi")})
			if err != nil {
				t.Fatalf("generation %d: %v", i, err)
			}
			if r := collect(s); r.err != nil || r.text != "Hi" {
				t.Fatalf("generation %d: %q, %v", i, r.text, r.err)
			}
			s.Close()
			synctest.Wait() // the connection back in the pool
		}
		if n := dials.Load(); n != 2 {
			t.Fatalf("%d connections dialled, want 2 (the kept one, then a new one for the request it lost)", n)
		}
	})
}

// chunked frames an NDJSON line as the HTTP/1.1 chunk Ollama writes for it.
func chunked(line string) string {
	return fmt.Sprintf("%x\r\n%s\n\r\n", len(line)+1, line)
}
