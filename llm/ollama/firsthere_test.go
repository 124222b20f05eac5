package ollama

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/evloop"
	"github.com/hearthd/hearth/llm"
)

// A polled generation is sent and its first line read in the caller's
// goroutine (firstHere), over a connection of an event loop: real sockets,
// so no synctest bubble here, and nothing below waits for a duration.

// heldRuntime is a runtime on loopback whose every connection is handed
// to the test once a request has been read from it (only its head, when
// headOnly).
type heldRuntime struct {
	url   string
	conns chan *heldConn
}

type heldConn struct {
	net.Conn
	br *bufio.Reader
}

func startHeldRuntime(t *testing.T) *heldRuntime { return startHeldRuntimeWith(t, false) }

func startHeldRuntimeWith(t *testing.T, headOnly bool) *heldRuntime {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &heldRuntime{url: "http://" + ln.Addr().String(), conns: make(chan *heldConn, 8)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func() {
				hc := &heldConn{Conn: c, br: bufio.NewReader(c)}
				if headOnly {
					if _, err := http.ReadRequest(hc.br); err == nil {
						r.conns <- hc
					}
				} else if hc.request() == nil {
					r.conns <- hc
				}
			}()
		}
	}()
	return r
}

// request reads one request and its body.
func (c *heldConn) request() error {
	req, err := http.ReadRequest(c.br)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err
}

const (
	heldHead  = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
	heldToken = `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n"
	heldFinal = `{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}` + "\n"
)

// chunk frames line as one HTTP/1.1 chunk, as Ollama's net/http writes a
// flushed line.
func chunk(line string) string {
	return strconv.FormatInt(int64(len(line)), 16) + "\r\n" + line + "\r\n"
}

// closedByClient waits until the client closes c.
func (c *heldConn) closedByClient(t *testing.T) {
	t.Helper()
	if _, err := io.Copy(io.Discard, c.br); err != nil {
		t.Fatalf("runtime's read of the closed request: %v", err)
	}
}

// stillOpen fails t if the client has closed c already (a read that does
// not wait: a close the client made before now is there to read).
func (c *heldConn) stillOpen(t *testing.T) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	_, err := c.br.ReadByte()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the request was closed before the runtime answered (read: %v)", err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
}

func polledBackend(t *testing.T, url string, fbt time.Duration) *Backend {
	t.Helper()
	loop, err := evloop.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, url, func(cfg *Config) { cfg.Loop, cfg.FirstByteTimeout = loop, fbt })
	t.Cleanup(func() { loop.Close() })
	return b
}

func polledChat(ctx context.Context, b *Backend) (llm.Stream, error) {
	return b.Chat(ctx, &llm.Request{Messages: userSays("hi"), Polled: true})
}

// A caller that leaves before any of the answer arrived returns at once;
// the request stays open until its first line comes (ollama/ollama#17131),
// then it is closed and RuntimeDone closes.
func TestPolledGenerationAbandoned(t *testing.T) {
	for _, c := range []struct {
		name    string
		fbt     time.Duration
		leave   bool // the caller's context ends; else the first byte timeout
		wantErr error
	}{
		{"caller gone", time.Hour, true, context.Canceled},
		{"first byte timeout", time.Nanosecond, false, llm.ErrTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			rt := startHeldRuntime(t)
			b := polledBackend(t, rt.url, c.fbt)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				s, err := polledChat(ctx, b)
				if s != nil {
					s.Close()
				}
				errc <- err
			}()
			conn := <-rt.conns
			if c.leave {
				cancel()
			}
			err := <-errc
			var ab llm.Abandoned
			if !errors.As(err, &ab) || !errors.Is(err, c.wantErr) {
				t.Fatalf("Chat: %v, want an abandoned request and %v", err, c.wantErr)
			}
			select {
			case <-ab.RuntimeDone():
				t.Fatal("RuntimeDone closed before the runtime answered")
			default:
			}
			conn.stillOpen(t)
			if _, err := io.WriteString(conn, heldHead+chunk(heldToken)); err != nil {
				t.Fatal(err)
			}
			<-ab.RuntimeDone()
			conn.closedByClient(t)
		})
	}
}

// A caller that leaves once the answer has begun (here its head without
// a first line) is not held: the request is closed, and Chat reports the
// caller's end, not an abandoned request.
func TestPolledGenerationLeftAfterTheHead(t *testing.T) {
	rt := startHeldRuntime(t)
	b := polledBackend(t, rt.url, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.answerBegun = cancel
	errc := make(chan error, 1)
	go func() {
		_, err := polledChat(ctx, b)
		errc <- err
	}()
	conn := <-rt.conns
	if _, err := io.WriteString(conn, heldHead); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	var ab llm.Abandoned
	if errors.As(err, &ab) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Chat: %v, want context.Canceled, not abandoned", err)
	}
	conn.closedByClient(t)
}

// A caller that leaves while its request is still being written (a long
// prompt to a runtime that does not read it) is not held either: the
// write gives up, the request, sent in part, is closed.
func TestPolledGenerationLeftWhileWriting(t *testing.T) {
	rt := startHeldRuntimeWith(t, true)
	b := polledBackend(t, rt.url, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Far more than loopback's socket buffers hold.
	prompt := strings.Repeat("go on ", 8<<20)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Chat(ctx, &llm.Request{Messages: userSays(prompt), Polled: true})
		errc <- err
	}()
	conn := <-rt.conns // the request's head read, its body not
	cancel()
	err := <-errc
	var ab llm.Abandoned
	if errors.As(err, &ab) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Chat: %v, want context.Canceled, not abandoned", err)
	}
	n, err := io.Copy(io.Discard, conn.br)
	if err != nil {
		t.Fatalf("runtime's read of the closed request: %v", err)
	}
	if n >= int64(len(prompt)) {
		t.Fatalf("the runtime got %d bytes of a %d-byte prompt: the request was written whole", n, len(prompt))
	}
}

// A polled connection the runtime closed while it was idle in the pool is
// found closed when the next request's answer is awaited: the request is
// sent again on a new connection.
func TestPolledGenerationSentAgainAfterAnIdleClose(t *testing.T) {
	rt := startHeldRuntime(t)
	b := polledBackend(t, rt.url, time.Hour)
	answer := func(conn *heldConn) {
		if _, err := io.WriteString(conn, heldHead+chunk(heldToken)+chunk(heldFinal)+"0\r\n\r\n"); err != nil {
			t.Error(err)
		}
	}
	for i := range 2 {
		done := make(chan result, 1)
		go func() {
			s, err := polledChat(context.Background(), b)
			if err != nil {
				done <- result{err: err}
				return
			}
			done <- collect(s)
		}()
		var conn *heldConn
		select {
		case conn = <-rt.conns:
		case r := <-done:
			t.Fatalf("request %d without a new connection: %q, %v", i, r.text, r.err)
		}
		answer(conn)
		r := <-done
		if r.err != nil || r.text != "Hi" {
			t.Fatalf("request %d: %q, %v", i, r.text, r.err)
		}
		if i == 0 {
			// The answer was read to its end: the connection is pooled.
			// The runtime closes it.
			conn.Close()
		}
	}
}
