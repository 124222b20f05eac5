package ollama

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/llm"
)

// pipeRuntime is a Config.HTTPClient over the default transport whose
// connections are in memory (net.Pipe, on which a synctest bubble can
// wait, where it cannot on a socket), each served by serve in a goroutine
// of its own. dials counts the connections dialled.
func pipeRuntime(serve func(net.Conn)) (hc *http.Client, dials *atomic.Int64) {
	dials = new(atomic.Int64)
	tr := loopbackTransport(0)
	tr.DialContext = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		c, srv := net.Pipe()
		go func() {
			defer srv.Close()
			serve(srv)
		}()
		return c, nil
	}
	return &http.Client{Transport: tr}, dials
}

// silentRuntime makes b's transport dial a runtime that reads each
// request and never answers, as an Ollama whose model has lost its
// parallel slots does. It reports the (bubble) time at which each
// connection was closed by the client.
func silentRuntime() (*http.Client, <-chan time.Time) {
	closed := make(chan time.Time, 8)
	hc, _ := pipeRuntime(func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		// No answer: the read ends when the client closes.
		_, _ = br.ReadByte()
		closed <- time.Now()
	})
	return hc, closed
}

// An abandoned request whose runtime never answers is not held for
// long: it is closed abandonWait after it was abandoned (FirstByteTimeout,
// a minute at least), which frees the runtime's side of it, and
// RuntimeDone (the caller's slot) closes then.
func TestAbandonedRequestIsClosedWhenTheRuntimeNeverAnswers(t *testing.T) {
	for _, c := range []struct {
		name      string
		fbt       time.Duration // FirstByteTimeout
		callerEnd time.Duration // when the caller's context ends; 0: never
		abandoned time.Duration // when Chat returns
		closed    time.Duration // when the request is closed
	}{
		{"first byte timeout", 30 * time.Second, 0, 30 * time.Second, 30*time.Second + time.Minute},
		{"caller gone", 30 * time.Second, time.Second, time.Second, time.Second + time.Minute},
		{"caller gone, long first byte timeout", 3 * time.Minute, time.Second, time.Second, time.Second + 3*time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hc, closed := silentRuntime()
				b := newBackend(t, "http://127.0.0.1:1", func(cfg *Config) { cfg.FirstByteTimeout, cfg.HTTPClient = c.fbt, hc })
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if c.callerEnd > 0 {
					time.AfterFunc(c.callerEnd, cancel)
				}
				start := time.Now()
				_, err := b.Chat(ctx, &llm.Request{Messages: userSays("hi")})
				var ab llm.Abandoned
				if !errors.As(err, &ab) {
					t.Fatalf("err = %v, want an abandoned request", err)
				}
				if got := time.Since(start); got != c.abandoned {
					t.Fatalf("Chat returned after %v, want %v", got, c.abandoned)
				}
				<-ab.RuntimeDone()
				if got := time.Since(start); got != c.closed {
					t.Fatalf("RuntimeDone after %v, want %v", got, c.closed)
				}
				synctest.Wait()
				select {
				case at := <-closed:
					if got := at.Sub(start); got != c.closed {
						t.Fatalf("the runtime saw its request closed after %v, want %v", got, c.closed)
					}
				default:
					t.Fatal("RuntimeDone closed while the request was still open")
				}
			})
		})
	}
}
