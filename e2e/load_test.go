package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/testutil"
)

// Load and abuse on the deployment API, all on loopback and bounded in
// count and time, while a well-behaved client keeps asking: it must keep
// being served.
func TestDeploymentAPIUnderAbuse(t *testing.T) {
	limit := raiseNoFile(t) // before hearthd starts: it inherits the limit
	mock := startMockRuntime(t, "abuse-model", bench.MockConfig{Tokens: 16})
	const (
		readTimeout = 2 * time.Second
		stall       = 2 * time.Second
		maxBody     = 64 << 10
		slots       = 4
		perSource   = 500
	)
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "abuse-model", "--ollama-url", mock.URL, "--metrics-listen", "",
		"--read-timeout", readTimeout.String(), "--idle-timeout", "5m", "--write-stall-timeout", stall.String(),
		"--max-concurrent", fmt.Sprint(slots), "--max-queue", "64", "--max-body-bytes", fmt.Sprint(maxBody),
		"--max-conns-per-source", fmt.Sprint(perSource)}})
	addr := strings.TrimPrefix(h.root, "http://")
	chatBody := `{"model":"abuse-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

	// The well-behaved client: one request every 50 ms for the whole test.
	var ok, failed atomic.Int64
	var lastErr atomic.Value
	stopBaseline := make(chan struct{})
	baselineDone := make(chan struct{})
	go func() {
		defer close(baselineDone)
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		for {
			select {
			case <-stopBaseline:
				return
			case <-time.After(50 * time.Millisecond):
			}
			req, _ := http.NewRequest("POST", h.url+"/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer "+h.secret)
			resp, err := hc.Do(req)
			if err != nil {
				failed.Add(1)
				lastErr.Store(err.Error())
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed.Add(1)
				lastErr.Store(fmt.Sprintf("%d %s", resp.StatusCode, b))
				continue
			}
			ok.Add(1)
		}
	}()

	t.Run("oversized", func(t *testing.T) {
		// Headers beyond the read buffer: 431 (or 400), never a crash.
		conn := dialRaw(t, h.root)
		defer conn.Close()
		fmt.Fprintf(conn, "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("oversized headers: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 431 && resp.StatusCode != 400 {
			t.Fatalf("oversized headers: %d", resp.StatusCode)
		}
		// A body over --max-body-bytes: 413 in the OpenAI error shape.
		status, b := postDeclaredBody(t, h.root, "/api/v1/chat/completions", h.secret, 2*maxBody)
		if status != http.StatusRequestEntityTooLarge {
			t.Fatalf("oversized body: %d %s", status, b)
		}
		if typ, code := openAIError(t, b); typ != "invalid_request_error" || code != "request_too_large" {
			t.Fatalf("oversized body error %q %q", typ, code)
		}
	})

	t.Run("slowloris", func(t *testing.T) {
		// Clients that trickle their headers are cut off by the read
		// timeout, each within it plus a margin.
		const n = 50
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					errs <- err
					return
				}
				defer conn.Close()
				start := time.Now()
				closed := make(chan struct{})
				go func() { _, _ = io.Copy(io.Discard, conn); close(closed) }()
				hdr := "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("s", 200)
				for i := 0; i < len(hdr); i++ {
					select {
					case <-closed:
						if d := time.Since(start); d > readTimeout+3*time.Second {
							errs <- fmt.Errorf("slow client cut after %v (read timeout %v)", d, readTimeout)
						}
						return
					case <-time.After(200 * time.Millisecond):
					}
					if _, err := conn.Write([]byte{hdr[i]}); err != nil {
						return // closed by the server
					}
				}
				errs <- fmt.Errorf("slow client sent %d header bytes over %v without being cut", len(hdr), time.Since(start))
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("slow readers", func(t *testing.T) {
		// Readers that stop reading a long stream take every slot; the
		// write-stall timeout ends their streams and frees the slots.
		mock.SetConfig(bench.MockConfig{Tokens: 1 << 30, FlushEvery: 64})
		defer mock.SetConfig(bench.MockConfig{Tokens: 16})
		body := `{"model":"abuse-model","stream":true,"messages":[{"role":"user","content":"go"}]}`
		var conns []net.Conn
		for range slots {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			// (No small SO_RCVBUF here: set after connect it leaves a
			// window the kernel cannot drain, which would hide the close.)
			conns = append(conns, c)
			rawPost(c, "/api/v1/chat/completions", h.secret, len(body), body)
		}
		testutil.WaitFor(t, 10*time.Second, "a generation for every slow reader", func() bool {
			return mock.Stats().Active == slots
		})
		// Not reading: buffers fill, hearthd's writes stall, and the
		// write-stall timeout ends the streams, which cancels their
		// generations (they would run for good otherwise). The
		// well-behaved client adds at most one short generation now and
		// then, so none active means the slow readers' are gone.
		testutil.WaitFor(t, stall+30*time.Second, "the unread streams' generations to be cancelled", func() bool {
			return mock.Stats().Active == 0
		})
		for i, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			got, err := io.ReadAll(c)
			c.Close()
			if err != nil {
				t.Fatalf("slow reader %d: the stream was not ended (read %d bytes): %v", i, len(got), err)
			}
			if bytes.Contains(got, []byte("[DONE]")) || !bytes.Contains(got, []byte(`"content"`)) {
				t.Fatalf("slow reader %d: want a stream cut short, got %d bytes ending %q", i, len(got), got[max(0, len(got)-200):])
			}
		}
		// The slots are free again: as many streams as slots complete.
		mock.SetConfig(bench.MockConfig{Tokens: 16})
		var wg sync.WaitGroup
		for range slots {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := postChat(t, h, h.secret, `{"model":"abuse-model","stream":true,"messages":[{"role":"user","content":"go"}]}`)
				lines, err := sseLines(r.Body)
				r.Body.Close()
				if r.StatusCode != 200 || err != nil || len(lines) == 0 || lines[len(lines)-1] != "[DONE]" {
					t.Errorf("stream after the slow readers: %d %v %q", r.StatusCode, err, tail(lines, 2))
				}
			}()
		}
		// Slots still pinned would leave these queued for good.
		freed := make(chan struct{})
		go func() { wg.Wait(); close(freed) }()
		select {
		case <-freed:
		case <-time.After(20 * time.Second):
			t.Fatal("streams after the slow readers were never served: their slots were not freed")
		}
	})

	t.Run("revoke during streams", func(t *testing.T) {
		// Streams of a key revoked mid-way finish or end cleanly; the key
		// is refused from then on.
		mock.SetConfig(bench.MockConfig{Tokens: 40, TPS: 20})
		defer mock.SetConfig(bench.MockConfig{Tokens: 16})
		key := h.createKey("doomed")
		const n = 3
		started := make(chan struct{}, n)
		results := make(chan []string, n)
		for range n {
			go func() {
				r := postChat(t, h, key, `{"model":"abuse-model","stream":true,"messages":[{"role":"user","content":"go"}]}`)
				defer r.Body.Close()
				if r.StatusCode != 200 {
					t.Errorf("stream with the key before revocation: %d", r.StatusCode)
					started <- struct{}{}
					results <- nil
					return
				}
				br := bufio.NewReader(r.Body)
				first, _ := br.ReadString('\n')
				started <- struct{}{}
				lines, err := sseLines(br)
				if err != nil {
					t.Errorf("stream broke after revocation: %v", err)
				}
				results <- append([]string{strings.TrimPrefix(strings.TrimSpace(first), "data: ")}, lines...)
			}()
		}
		for range n {
			<-started
		}
		h.keysCLI("revoke", keyID(h.keysCLI("list"), "doomed"))
		r := postChat(t, h, key, chatBody)
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("revoked key: %d %s", r.StatusCode, b)
		}
		for range n {
			lines := <-results
			if len(lines) == 0 || lines[len(lines)-1] != "[DONE]" {
				t.Fatalf("in-flight stream did not end cleanly: %q", tail(lines, 2))
			}
		}
	})

	t.Run("idle connections", func(t *testing.T) {
		// Many keep-alive connections, each idle after one request: all
		// held, none starving the well-behaved client. They come from
		// many addresses (127.0.0.2 on, all loopback), each within the
		// per-source cap. Each side of a connection is one descriptor in
		// its own process.
		n := min(10000, int(limit)-2000)
		if n < 10000 {
			t.Logf("open-files limit %d: %d idle connections", limit, n)
		}
		conns := make([]net.Conn, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		var dialErr atomic.Value
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					c, err := dialFrom(fmt.Sprintf("127.0.0.%d", 2+i/perSource), addr)
					if err != nil {
						dialErr.Store(err.Error())
						return
					}
					conns[i] = c
					if err := healthz(c); err != nil {
						dialErr.Store(err.Error())
						return
					}
				}
			}()
		}
		wg.Wait()
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}()
		if e := dialErr.Load(); e != nil {
			t.Fatalf("opening %d connections: %v", n, e)
		}
		// Idle past the read timeout; the keep-alive idle timeout holds
		// them. (The time has to pass for real: it is what is tested.)
		time.Sleep(readTimeout + time.Second)
		for i := 0; i < n; i += n / 50 {
			if err := healthz(conns[i]); err != nil {
				t.Fatalf("idle connection %d dropped: %v", i, err)
			}
		}
	})

	t.Run("one source beyond its cap", func(t *testing.T) {
		// One address holds at most its cap; the connections past it are
		// closed before anything is read, and nobody else notices.
		const src = "127.0.0.250"
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		refused := 0
		for range perSource + 20 {
			c, err := dialFrom(src, addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			if healthz(c) != nil {
				refused++
			}
		}
		if refused != 20 {
			t.Fatalf("%d of %d connections from one address refused, want the 20 past its cap of %d", refused, perSource+20, perSource)
		}
	})

	close(stopBaseline)
	<-baselineDone
	total := ok.Load() + failed.Load()
	t.Logf("well-behaved client: %d of %d requests served during the abuse", ok.Load(), total)
	if total < 50 || float64(ok.Load()) < 0.98*float64(total) {
		t.Fatalf("well-behaved client served %d of %d (last error %v)", ok.Load(), total, lastErr.Load())
	}
}

// healthz sends GET /healthz on a keep-alive connection and reads the answer.
// dialFrom connects to addr from the local address src.
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	return d.Dial("tcp", addr)
}

func healthz(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("healthz: %d", resp.StatusCode)
	}
	return nil
}
