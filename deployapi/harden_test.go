package deployapi

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
)

// rawExchange writes req on a fresh connection and returns every response
// the server sends before it closes the connection (or 3 s pass).
func rawExchange(t *testing.T, ta *testAPI, req string) []*http.Response {
	t.Helper()
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	var out []*http.Response
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp)
	}
}

// RFC 9112 §6.1: a message with both Content-Length and Transfer-Encoding
// is answered and the connection closed, so nothing smuggled after it is
// read as a second request: whatever its key (the framing is checked
// before it), its body (an empty chunked body, one byte, more than a bad
// key may send) and the order of the two headers.
func TestContentLengthWithTransferEncodingClosesTheConnection(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1}, nil)
	body := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	smuggled := "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret + "\r\n\r\n"
	keys := map[string]string{"good key": "Authorization: Bearer " + ta.secret + "\r\n",
		"bad key": "Authorization: Bearer hearth_live_nope\r\n", "no key": ""}
	for keyName, auth := range keys {
		for bodyName, b := range map[string]string{"body": body, "one byte": "{", "empty": ""} {
			for _, teFirst := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/te first %v", keyName, bodyName, teFirst), func(t *testing.T) {
					cl, te := "Content-Length: "+itoa(len(b))+"\r\n", "Transfer-Encoding: chunked\r\n"
					framing := cl + te
					if teFirst {
						framing = te + cl
					}
					chunks := "0\r\n\r\n"
					if b != "" {
						chunks = hexLen(len(b)) + "\r\n" + b + "\r\n" + chunks
					}
					resps := rawExchange(t, ta, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+
						"Content-Type: application/json\r\n"+framing+"\r\n"+chunks+smuggled)
					if len(resps) != 1 {
						t.Fatalf("%d responses, want exactly 1 and the connection closed", len(resps))
					}
					if resps[0].StatusCode != 400 || !resps[0].Close {
						t.Fatalf("status %d, Connection: close %v; want 400 and close", resps[0].StatusCode, resps[0].Close)
					}
				})
			}
		}
	}
	// A chunked request alone is served, and its connection kept.
	resps := rawExchange(t, ta, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+ta.secret+
		"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+hexLen(len(body))+"\r\n"+body+"\r\n0\r\n\r\n"+smuggled)
	if len(resps) != 2 || resps[0].StatusCode != 200 || resps[1].StatusCode != 200 {
		t.Fatalf("a chunked request and the next one: %d responses", len(resps))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func hexLen(n int) string { return strconv.FormatInt(int64(n), 16) }

// Any framing error is answered and the connection closed: what follows
// the broken message is never read as a request.
func TestFramingErrorClosesTheConnection(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1}, nil)
	next := "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret + "\r\n\r\n"
	for name, req := range map[string]string{
		"bad chunk size": "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n" + next,
		"two lengths":    "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}" + next,
		"bad length":     "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -2\r\n\r\n{}" + next,
		"te gzip":        "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}" + next,
	} {
		t.Run(name, func(t *testing.T) {
			resps := rawExchange(t, ta, req)
			if len(resps) > 1 {
				t.Fatalf("%d responses: the request after a framing error was served", len(resps))
			}
			if len(resps) == 1 && (resps[0].StatusCode < 400 || resps[0].StatusCode >= 500) {
				t.Fatalf("status %d, want a 4xx", resps[0].StatusCode)
			}
		})
	}
}

// The key is checked before the body is read: a request with a bad key that
// announces 4 MiB and sends none of it is answered 401 at once (reading the
// body first would wait for it, then time out with 408), and the connection
// is closed since the body was never read.
func TestBadKeyIsRefusedBeforeTheBody(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1}, nil)
	for name, auth := range map[string]string{"bad key": "Bearer hearth_live_nope", "no key": ""} {
		t.Run(name, func(t *testing.T) {
			hdr := "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4194304\r\n"
			if auth != "" {
				hdr += "Authorization: " + auth + "\r\n"
			}
			resps := rawExchange(t, ta, hdr+"\r\n{")
			if len(resps) != 1 || resps[0].StatusCode != 401 || !resps[0].Close {
				var codes []int
				for _, r := range resps {
					codes = append(codes, r.StatusCode)
				}
				t.Fatalf("statuses %v, want one 401 with the connection closed", codes)
			}
		})
	}
	// A good key still gets its 413 for a body over the limit.
	resps := rawExchange(t, ta, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+ta.secret+
		"\r\nContent-Length: 4194304\r\n\r\n{")
	if len(resps) != 1 || resps[0].StatusCode != 413 {
		t.Fatalf("good key, body over the limit: %d responses", len(resps))
	}
}

// No API key reaches the log at any level: requests that fasthttp cannot
// read (its own error printer quotes requests), bad bodies, bad keys and
// good requests, all carrying the key, logged at debug.
func TestNoKeyInTheLogs(t *testing.T) {
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	keys := apikeys.NewStatic()
	secret, _ := keys.Add("test")
	api := NewAPI(APIConfig{Model: testModel, Version: "test", MaxConcurrent: 2, MaxQueue: 2, MaxBodyBytes: 1 << 10,
		WriteStallTimeout: 5 * time.Second}, fake.New(fake.Config{Tokens: []string{"x"}, TokenCount: 1}), keys, metrics.NewNode("test"), log)
	api.SetWarm(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.Server(time.Second, time.Second)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { api.Close(); _ = srv.Shutdown() })
	ta := &testAPI{root: "http://" + ln.Addr().String(), secret: secret}

	auth := "Authorization: Bearer " + secret + "\r\n"
	wrong := "Authorization: Bearer " + secret + "x\r\n"
	body := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	for _, req := range []string{
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 2\r\n\r\n{}",
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body,
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + wrong + "Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body,
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 99999\r\n\r\n{",
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: bogus\r\n\r\n",
		"GARBAGE " + secret + "\r\n" + auth + "\r\n",
		"GET /api/v1/models HTTP/1.1\r\nHost: x\r\n" + auth + "X-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n",
		"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 10\r\n\r\n{", // times out
	} {
		rawExchange(t, ta, req)
	}
	srv.Shutdown()
	out := logs.String()
	if !strings.Contains(out, "fasthttp") {
		t.Fatalf("no fasthttp error lines logged, the test proves nothing:\n%s", out)
	}
	if strings.Contains(out, secret[len("hearth_live_"):len("hearth_live_")+12]) {
		t.Fatalf("the API key is in the logs:\n%s", out)
	}
}

// A client that sends a byte after its request (a pipelined request, or
// just noise) and then leaves still cancels its generation: bytes waiting
// on the connection do not stop the watch for the close.
func TestDisconnectWithBytesPendingCancels(t *testing.T) {
	overBoth(t, testDisconnectWithBytesPendingCancels)
}

func testDisconnectWithBytesPendingCancels(t *testing.T, overTLS bool) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ta := startAPIOver(t, overTLS, fake.Config{FirstTokenDelay: slowToken}, nil)
			conn, err := ta.dial()
			if err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"model":"hearth-tiny","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
			fmt.Fprintf(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", ta.secret, len(body), body)
			testutil.WaitFor(t, 10*time.Second, "the generation to start", func() bool { return ta.rt.LastStream() != nil })
			if _, err := conn.Write([]byte("G")); err != nil {
				t.Fatal(err)
			}
			leave(t, conn, ta.rt.LastStream())
		})
	}
}

// A body over the limit is answered with a 413 the client actually reads,
// not a connection reset, by Go's client, curl and Node's fetch alike.
func TestTooLargeIsAnAnswerNotAReset(t *testing.T) { overBoth(t, testTooLargeIsAnAnswerNotAReset) }

func testTooLargeIsAnAnswerNotAReset(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 1}, nil) // 64 KiB limit
	big := `{"model":"hearth-tiny","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`
	file := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(file, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	url := ta.url + "/chat/completions"
	clients := map[string]func() (string, error){
		"go": func() (string, error) {
			req, _ := http.NewRequest("POST", url, strings.NewReader(big))
			req.Header.Set("Authorization", "Bearer "+ta.secret)
			resp, err := ta.client.Do(req)
			if err != nil {
				return "", err
			}
			resp.Body.Close()
			return strconv.Itoa(resp.StatusCode), nil
		},
		"curl": func() (string, error) {
			args := []string{"-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Expect:",
				"-H", "Authorization: Bearer " + ta.secret, "--data-binary", "@" + file, url}
			if ta.caFile != "" {
				args = append(args, "--cacert", ta.caFile)
			}
			out, err := exec.Command("curl", args...).CombinedOutput()
			return string(out), err
		},
		"node fetch": func() (string, error) {
			js := `const fs=require("fs");fetch(process.argv[1],{method:"POST",headers:{Authorization:"Bearer "+process.argv[2]},body:fs.readFileSync(process.argv[3])}).then(r=>{process.stdout.write(String(r.status))},e=>{console.error(e.cause||e);process.exit(1)})`
			cmd := exec.Command("node", "-e", js, url, ta.secret, file)
			if ta.caFile != "" {
				cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+ta.caFile)
			}
			out, err := cmd.CombinedOutput()
			return string(out), err
		},
	}
	for name, do := range clients {
		t.Run(name, func(t *testing.T) {
			if name != "go" {
				if _, err := exec.LookPath(strings.Fields(name)[0]); err != nil {
					t.Fatalf("%s is needed (make test installs it): %v", name, err)
				}
			}
			for i := range 10 {
				got, err := do()
				if err != nil || got != "413" {
					t.Fatalf("try %d: %q %v, want 413", i, got, err)
				}
			}
		})
	}
}
