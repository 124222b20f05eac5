package connlimit

import (
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func TestPerSourceAndTotal(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 3, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	src := netip.MustParseAddr("127.0.0.1")
	a, b := dial(), dial()
	s1, s2 := <-accepted, <-accepted
	if n := l.Open(src); n != 2 {
		t.Fatalf("%d open from %v, want 2", n, src)
	}
	// A third from the same source is closed unread.
	c := dial()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("third connection from one source: read %v, want EOF", err)
	}
	// Closing one lets the next in.
	s1.Close()
	a.Close()
	d := dial()
	s3 := <-accepted
	if n := l.Open(src); n != 2 {
		t.Fatalf("%d open after one closed, want 2", n)
	}
	for _, x := range []net.Conn{b, c, d, s2, s3} {
		x.Close()
	}
}

func TestTotalWaits(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1, 0)
	first := make(chan net.Conn, 1)
	c1, _ := net.Dial("tcp", inner.Addr().String())
	go func() { c, _ := l.Accept(); first <- c }()
	s1 := <-first
	second := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			second <- c
		}
		close(second)
	}()
	c2, _ := net.Dial("tcp", inner.Addr().String())
	select {
	case <-second:
		t.Fatal("accepted beyond the total")
	default:
	}
	s1.Close()
	if s2, ok := <-second; !ok {
		t.Fatal("no accept after a slot freed")
	} else {
		s2.Close()
	}
	c1.Close()
	c2.Close()
	l.Close()
}

// TestConnHidesNoSocket: a connection accepted through the limits still
// gives its socket's descriptor and the connection beneath, for code that
// reads or watches the socket directly.
func TestConnHidesNoSocket(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 0, 1)
	defer l.Close()
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc, ok := s.(syscall.Conn)
	if !ok {
		t.Fatalf("%T hides the socket", s)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil || fd < 0 {
		t.Fatalf("descriptor %d, %v", fd, err)
	}
	if u, ok := s.(interface{ NetConn() net.Conn }); !ok {
		t.Fatalf("%T does not give the connection beneath", s)
	} else if _, tcp := u.NetConn().(*net.TCPConn); !tcp {
		t.Fatalf("%T does not give the connection beneath", s)
	}
}
