package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// serveWith runs hearth-control serve in this process with extra flags and
// returns its address.
func serveWith(t *testing.T, extra ...string) string {
	t.Helper()
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &signalWriter{want: "control plane serving", seen: make(chan struct{})}
	done := make(chan error, 1)
	args := append([]string{"serve", "--listen", addr, "--metrics-listen", "", "--state-dir", t.TempDir()}, extra...)
	go func() { done <- run(ctx, args, logs, logs) }()
	select {
	case <-logs.seen:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return addr
}

// closedWithin reports whether the server closes conn within a bound that
// only a missing timeout can exceed (whatever it answered first).
func closedWithin(t *testing.T, conn net.Conn) bool {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return err == nil || !(errorAs(err, &ne) && ne.Timeout())
}

func errorAs(err error, ne *net.Error) bool {
	e, ok := err.(net.Error)
	if ok {
		*ne = e
	}
	return ok
}

// Every connection is bounded: a body trickled to the unauthenticated
// enroll endpoint is cut off at the read timeout, an idle keep-alive is
// closed at the idle timeout, and one source cannot hold more than its
// share of connections.
func TestConnectionsAreBounded(t *testing.T) {
	addr := serveWith(t, "--read-timeout", "300ms", "--idle-timeout", "300ms")

	t.Run("trickled body", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "POST /v1/nodes/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		if !closedWithin(t, conn) {
			t.Fatal("a trickling client stayed connected")
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("openapi: %v", err)
		}
		resp.Body.Close()
		if !closedWithin(t, conn) {
			t.Fatal("an idle keep-alive stayed open")
		}
	})

	t.Run("per source", func(t *testing.T) {
		// Its own server: here the held connections must not idle out.
		addr := serveWith(t, "--max-conns-per-source", "4")
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		// Hold 4 keep-alive connections.
		for range 4 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			held = append(held, c)
		}
		extra, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		io.WriteString(extra, "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = extra.SetReadDeadline(time.Now().Add(15 * time.Second))
		b, _ := io.ReadAll(extra)
		if strings.Contains(string(b), "200 OK") {
			t.Fatal("a fifth connection from one source was served")
		}
	})
}
