package evloop

import (
	"io"
	"net"
	"testing"
)

// SocketFD gives a TCP connection's descriptor, which Write writes to, and
// refuses what is not a socket.
func TestSocketFD(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fd, ok := SocketFD(c)
	if !ok || fd < 0 {
		t.Fatalf("SocketFD of a TCP connection: %d, %v", fd, ok)
	}
	if n, err := Write(fd, []byte("hi")); n != 2 || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	got := make([]byte, 2)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "hi" {
		t.Fatalf("read %q, %v", got, err)
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if _, ok := SocketFD(p); ok {
		t.Error("SocketFD of a pipe reported a descriptor")
	}
}
