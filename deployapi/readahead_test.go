package deployapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/llm/fake"
)

// loopbackPair returns both ends of a loopback TCP connection.
func loopbackPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// fasthttp's one-byte read on a kept connection takes what came with that
// byte in the same system call: the reads after it are served from the
// buffer (they succeed with the socket's read deadline past, which fails
// any read that reaches the socket), up to aheadSize; the rest stays in
// the socket.
func TestKeptConnReadsAhead(t *testing.T) {
	server, client := loopbackPair(t)
	k := &keptConn{Conn: server, idleSet: &keptSet{}}
	sent := bytes.Repeat([]byte("0123456789abcdef"), 400) // 6 400 bytes: more than aheadSize
	if _, err := client.Write(sent); err != nil {
		t.Fatal(err)
	}
	var got []byte
	var one [1]byte
	// The bytes may come in more than one segment: wait until the first
	// read ahead has a full buffer's worth to take.
	for {
		if n, err := k.Read(one[:]); n != 1 || err != nil {
			t.Fatalf("first byte: %d, %v", n, err)
		}
		got = append(got, one[0])
		if k.ahead != nil && len(k.pending) == aheadSize-1 {
			break
		}
		if len(got) > 100 {
			t.Fatalf("no read took a full buffer ahead (pending %d)", len(k.pending))
		}
		buf := make([]byte, len(k.pending))
		n, _ := k.Read(buf)
		got = append(got, buf[:n]...)
	}
	if err := server.SetReadDeadline(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	n, err := k.Read(buf)
	if err != nil || n != aheadSize-1 {
		t.Fatalf("read after the first byte, deadline past: %d, %v; want %d from the buffer", n, err, aheadSize-1)
	}
	got = append(got, buf[:n]...)
	if k.ahead != nil || k.pending != nil {
		t.Fatal("the buffer is not given back once served")
	}
	if _, err := k.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the buffer, deadline past: %v, want the deadline's error", err)
	}
	if err := server.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	for len(got) < len(sent) {
		n, err := k.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("the bytes read differ from those sent")
	}

	// Waiting: the deadline and the peer's close end the one-byte read
	// with an error, as a plain read's would.
	if err := server.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := k.Read(one[:]); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("one-byte read past the deadline: %d, %v", n, err)
	}
	if err := server.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	client.Close()
	if n, err := k.Read(one[:]); n != 0 || err != io.EOF {
		t.Fatalf("one-byte read after the peer's close: %d, %v", n, err)
	}
}

// Requests that reach a kept connection together, after a stream (a long
// one, past the read-ahead buffer, and a short one behind it), are each
// answered, in order, on the event loop's path and on the other.
func TestRequestsArriveTogetherOnAKeptConnection(t *testing.T) {
	long := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("hi ", 3000) + `"}]}`
	for _, polled := range []bool{false, true} {
		t.Run(map[bool]string{false: "hijacked", true: "polled"}[polled], func(t *testing.T) {
			var ta *testAPI
			if polled {
				ta = startPolledAPI(t, &fakeOllama{tokens: []string{"a", "b"}}, nil)
			} else {
				ta = startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 2}, nil)
			}
			conn, br := ta.dialRaw(t)
			short := ta.rawPost("/chat/completions", streamBody)
			models := "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret + "\r\n\r\n"
			if _, err := io.WriteString(conn, short); err != nil {
				t.Fatal(err)
			}
			readStream(t, br)
			for round := range 3 {
				// The connection is kept and waits; then both come at once.
				if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", long)+short+models); err != nil {
					t.Fatal(err)
				}
				readStream(t, br)
				readStream(t, br)
				readModels(t, br, fmt.Sprintf("round %d: models", round))
			}
		})
	}
}
