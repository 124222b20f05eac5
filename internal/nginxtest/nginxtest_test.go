package nginxtest

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A stuck proxy must fail the test, not hang it; the passing path never
// waits for this.
const stuck = 30 * time.Second

// TestStreamsUnbuffered: the first SSE event reaches the client through
// nginx while the upstream is still holding the rest back, and a request
// body reaches the upstream while the client is still sending it. (nginx
// 1.22 passes an early event on even with proxy_buffering on; what "off"
// adds, no spooling of a slow client's stream to memory and disk, shows
// only under load. The request half fails with proxy_request_buffering on.)
func TestStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	gotFirstPart := make(chan string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "data: second\n\ndata: [DONE]\n\n")
		case "/upload":
			buf := make([]byte, 5)
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			gotFirstPart <- string(buf)
			rest, _ := io.ReadAll(r.Body)
			io.WriteString(w, string(buf)+string(rest))
		}
	}))
	defer upstream.Close()
	proxy := Start(t, Config{Upstream: upstream.Listener.Addr().String()})

	ctx, cancel := context.WithTimeout(context.Background(), stuck)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", proxy.URL+"/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first event before the upstream finished: %q, %v (nginx buffers the response)", line, err)
	}
	close(release)
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "\ndata: second\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest of the stream: %q, %v", rest, err)
	}

	// The request body: the upstream reads its first part while the
	// client holds back the rest.
	pr, pw := io.Pipe()
	req, _ = http.NewRequestWithContext(ctx, "POST", proxy.URL+"/upload", pr)
	answered := make(chan error, 1)
	var body string
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		answered <- err
	}()
	io.WriteString(pw, "hello")
	select {
	case got := <-gotFirstPart:
		if got != "hello" {
			t.Fatalf("upstream read %q", got)
		}
	case <-ctx.Done():
		t.Fatal("the upstream got no part of the body while the client was still sending (nginx buffers the request)")
	}
	io.WriteString(pw, " world")
	pw.Close()
	if err := <-answered; err != nil || body != "hello world" {
		t.Fatalf("upload answer %q, %v", body, err)
	}
}

// TestUpstreamKeepAlive: sequential requests through one worker reuse one
// upstream connection.
func TestUpstreamKeepAlive(t *testing.T) {
	var conns atomic.Int32
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("Connection")+"|"+r.Proto)
	}))
	upstream.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	upstream.Start()
	defer upstream.Close()
	proxy := Start(t, Config{Upstream: upstream.Listener.Addr().String(), WorkerProcesses: 1})
	for i := range 5 {
		resp, err := http.Get(proxy.URL + "/n/" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// HTTP/1.1 to the upstream and no "Connection: close".
		if string(b) != "|HTTP/1.1" {
			t.Fatalf("upstream saw Connection %q", b)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for 5 sequential requests, want 1 kept alive", n)
	}
}

func TestConfigAndProcesses(t *testing.T) {
	upstream := httptest.NewServer(http.NotFoundHandler())
	defer upstream.Close()
	proxy := Start(t, Config{Upstream: upstream.Listener.Addr().String(), WorkerProcesses: 2, WorkerConnections: 3000})
	for _, want := range []string{
		"worker_processes 2;", "worker_connections 3000;", "worker_rlimit_nofile 4024;",
		"keepalive 64;", "proxy_buffering off;", "proxy_request_buffering off;",
		"proxy_http_version 1.1;", `proxy_set_header Connection "";`, "listen " + proxy.Addr,
	} {
		if !strings.Contains(proxy.Config, want) {
			t.Errorf("config lacks %q", want)
		}
	}
	// Workers are forked after the master listens, and set their limit
	// before they accept: a request through each proves both.
	deadline := time.Now().Add(stuck)
	for len(proxy.PIDs()) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("PIDs() = %v, want the master and 2 workers", proxy.PIDs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if resp, err := http.Get(proxy.URL); err != nil || resp.StatusCode != 404 {
		t.Fatalf("through nginx: %v, %v", resp, err)
	}
	for _, pid := range proxy.PIDs()[1:] {
		waitNofile(t, pid, 4024)
	}

	pids, dir := proxy.PIDs(), proxy.Dir
	proxy.Close()
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("nginx process %d still running after Close", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s not removed: %v", dir, err)
	}
}

// TestOpenFilesBeyondTheHardLimit: workers get a limit above the hard one
// only where they may raise it; elsewhere New says so instead of letting
// nginx run short of descriptors under load.
func TestOpenFilesBeyondTheHardLimit(t *testing.T) {
	upstream := httptest.NewServer(http.NotFoundHandler())
	defer upstream.Close()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	want := int(min(lim.Max, 1<<20-2048)) + 1024
	p, err := New(Config{Upstream: upstream.Listener.Addr().String(), WorkerConnections: want - 1024})
	if os.Geteuid() != 0 || !effectiveCap(unix.CAP_SYS_RESOURCE) {
		if err == nil || !strings.Contains(err.Error(), "hard limit") {
			p.Close()
			t.Fatalf("New above the hard limit %d without CAP_SYS_RESOURCE: %v", lim.Max, err)
		}
		t.Logf("as expected without CAP_SYS_RESOURCE: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if resp, err := http.Get(p.URL); err != nil || resp.StatusCode != 404 {
		t.Fatalf("through nginx: %v, %v", resp, err)
	}
	waitNofile(t, p.PIDs()[1], want)
}

// waitNofile waits until worker pid's open files limit is want: a worker
// sets it during its start-up.
func waitNofile(t *testing.T, pid, want int) {
	t.Helper()
	deadline := time.Now().Add(stuck)
	for {
		got := nofile(t, pid)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %d: open files limit %d, want %d", pid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nofile returns the soft open-files limit of pid.
func nofile(t *testing.T, pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			n, err := strconv.Atoi(strings.Fields(rest)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no open files limit")
	return 0
}

func TestBadConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("started without an upstream")
	}
	if _, err := New(Config{Upstream: "no-port"}); err == nil {
		t.Error("started with an upstream without a port")
	}
	if _, err := New(Config{Upstream: "127.0.0.1:1", Bin: "/nonexistent/nginx"}); err == nil {
		t.Error("started with a missing binary")
	}
}
