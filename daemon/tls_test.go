package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/runtime/fake"
)

// testCA issues server certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1000),
		Subject:               pkix.Name{CommonName: "hearth test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a PEM certificate and key for 127.0.0.1 with this serial.
func (ca *testCA) issue(t *testing.T, serial int64, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// certDir lays files out like certbot: cert.pem and key.pem are symlinks
// into a versioned archive, swapped on renewal.
type certDir struct {
	dir     string
	version int
}

func (d *certDir) cert() string { return filepath.Join(d.dir, "cert.pem") }
func (d *certDir) key() string  { return filepath.Join(d.dir, "key.pem") }

// renew writes a new version and swaps the symlinks to it, one at a time
// as certbot does.
func (d *certDir) renew(t *testing.T, certPEM, keyPEM []byte) {
	t.Helper()
	d.version++
	for _, f := range []struct {
		link string
		name string
		data []byte
	}{{d.cert(), "cert", certPEM}, {d.key(), "key", keyPEM}} {
		target := filepath.Join(d.dir, "archive", f.name+strings.Repeat("I", d.version)+".pem")
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := f.link + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.link); err != nil {
			t.Fatal(err)
		}
	}
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitFor polls cond until it holds or the functional deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tlsAPI is the deployment API over HTTPS with a reloading certificate.
type tlsAPI struct {
	url      string
	rt       *fake.Runtime
	secret   string
	reloader *CertReloader
	ca       *testCA
	files    *certDir
}

func startTLSAPI(t *testing.T, fc fake.Config) *tlsAPI {
	t.Helper()
	ca := newTestCA(t)
	files := &certDir{dir: t.TempDir()}
	c, k := ca.issue(t, 1, time.Now().Add(24*time.Hour))
	files.renew(t, c, k)
	r, err := NewCertReloader(files.cert(), files.key(), discardLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); r.Run(ctx, 50*time.Millisecond) }()

	rt := fake.New(fc)
	keys := apikeys.NewStatic()
	secret, _ := keys.Add("test")
	api := NewAPI(APIConfig{
		Model: testModel, Version: "test", MaxConcurrent: 8, MaxQueue: 8,
		MaxBodyBytes: 64 << 10, WriteStallTimeout: 5 * time.Second,
	}, rt, keys, metrics.NewNode("test"), discardLog())
	api.SetWarm(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.Server(30*time.Second, 30*time.Second)
	go func() { _ = srv.Serve(tls.NewListener(ln, r.TLSConfig())) }()
	t.Cleanup(func() {
		api.Close()
		_ = srv.Shutdown()
		cancel()
		<-runDone
	})
	return &tlsAPI{
		url: "https://" + ln.Addr().String() + "/api/v1", rt: rt, secret: secret,
		reloader: r, ca: ca, files: files,
	}
}

// connRecorder is an http.RoundTripper noting, per request, the server
// certificate's serial and whether the connection was reused.
type connRecorder struct {
	base *http.Transport
	mu   sync.Mutex
	seen []connSeen
}

type connSeen struct {
	serial int64
	reused bool
}

func newConnRecorder(pool *x509.CertPool) *connRecorder {
	return &connRecorder{base: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		MaxIdleConnsPerHost: 1,
	}}
}

func (c *connRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	resp, err := c.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		return nil, err
	}
	s := connSeen{serial: -1, reused: reused}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		s.serial = resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	c.mu.Lock()
	c.seen = append(c.seen, s)
	c.mu.Unlock()
	return resp, nil
}

func (c *connRecorder) last(t *testing.T) connSeen {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) == 0 {
		t.Fatal("no request recorded")
	}
	return c.seen[len(c.seen)-1]
}

func (ta *tlsAPI) client(rec *connRecorder) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(ta.url),
		option.WithAPIKey(ta.secret),
		option.WithHTTPClient(&http.Client{Transport: rec}),
		option.WithMaxRetries(0),
	)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

// newConnSerial makes one request on a fresh connection and returns the
// serial of the certificate it was served.
func (ta *tlsAPI) newConnSerial(t *testing.T) int64 {
	t.Helper()
	rec := newConnRecorder(ta.ca.pool)
	defer rec.base.CloseIdleConnections()
	c := ta.client(rec)
	if _, err := c.Models.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := rec.last(t)
	if s.reused {
		t.Fatal("fresh client reused a connection")
	}
	return s.serial
}

func TestTLSServesAndRenews(t *testing.T) {
	short := fake.Config{Tokens: []string{"x"}, TokenCount: 5}
	ta := startTLSAPI(t, short)
	ctx := context.Background()
	rec := newConnRecorder(ta.ca.pool)
	defer rec.base.CloseIdleConnections()
	c := ta.client(rec)

	// A chat completion over HTTPS with the SDK, trusting only the test CA.
	resp, err := c.Chat.Completions.New(ctx, chatParams())
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != "xxxxx" {
		t.Fatalf("content %q", got)
	}
	if s := rec.last(t); s.serial != 1 || s.reused {
		t.Fatalf("first request: %+v", s)
	}
	// TLS only: the same port refuses plain HTTP.
	plain := strings.Replace(ta.url, "https://", "http://", 1) + "/models"
	if r, err := http.Get(plain); err == nil {
		r.Body.Close()
		if r.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %d", r.StatusCode)
		}
	}

	// The first connection now sits idle in keep-alive; a second client
	// has a stream in flight...
	// The stream lasts long enough (3s) to still be running once the
	// renewal has been picked up (normally within 100ms).
	const tokens = 150
	ta.rt.SetConfig(fake.Config{Tokens: []string{"x"}, TokenCount: tokens, TokenDelay: 20 * time.Millisecond})
	recStream := newConnRecorder(ta.ca.pool)
	defer recStream.base.CloseIdleConnections()
	cs := ta.client(recStream)
	stream := cs.Chat.Completions.NewStreaming(ctx, chatParams())
	var content strings.Builder
	for content.Len() < 3 && stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if s := recStream.last(t); s.serial != 1 {
		t.Fatalf("stream connection: %+v", s)
	}
	streamInfo := ta.rt.LastStream()
	ta.rt.SetConfig(short)

	// ...survives a renewal to the same paths.
	c2, k2 := ta.ca.issue(t, 2, time.Now().Add(48*time.Hour))
	ta.files.renew(t, c2, k2)
	// (b) A new connection sees the new certificate within a few seconds.
	waitFor(t, "new connections get the renewed certificate", 5*time.Second, func() bool {
		return ta.newConnSerial(t) == 2
	})

	if streamInfo.Finished() {
		t.Fatal("the stream ended before the renewal was picked up; it proves nothing")
	}
	// (a) The stream opened before the renewal runs to its end.
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream across renewal: %v", err)
	}
	stream.Close()
	if content.String() != strings.Repeat("x", tokens) {
		t.Fatalf("stream content %q", content.String())
	}
	// ...and the idle keep-alive connection still serves, in its session.
	if _, err := c.Chat.Completions.New(ctx, chatParams()); err != nil {
		t.Fatal(err)
	}
	if s := rec.last(t); s.serial != 1 || !s.reused {
		t.Fatalf("keep-alive connection after renewal: %+v", s)
	}
	if got := ta.reloader.Certificate().SerialNumber.Int64(); got != 2 || ta.reloader.Reloads() != 1 {
		t.Fatalf("reloader serves serial %d after %d reloads", got, ta.reloader.Reloads())
	}

	// (c) A broken renewal keeps the current certificate serving.
	failures := ta.reloader.Failures()
	if err := os.WriteFile(ta.files.cert(), []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "broken renewal noticed", 5*time.Second, func() bool { return ta.reloader.Failures() > failures })
	if got := ta.newConnSerial(t); got != 2 {
		t.Fatalf("after a broken renewal new connections get serial %d", got)
	}
	// A later good renewal is picked up again.
	c3, k3 := ta.ca.issue(t, 3, time.Now().Add(72*time.Hour))
	ta.files.renew(t, c3, k3)
	waitFor(t, "recovery after a broken renewal", 5*time.Second, func() bool {
		return ta.newConnSerial(t) == 3
	})
}

func TestTLSConfig(t *testing.T) {
	ca := newTestCA(t)
	d := &certDir{dir: t.TempDir()}
	c, k := ca.issue(t, 7, time.Now().Add(time.Hour))
	d.renew(t, c, k)
	r, err := NewCertReloader(d.cert(), d.key(), discardLog())
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.TLSConfig()
	if cfg.MinVersion != tls.VersionTLS12 || len(cfg.NextProtos) != 1 || cfg.NextProtos[0] != "http/1.1" {
		t.Fatalf("tls config %+v", cfg)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = conn.(*tls.Conn).Handshake()
				conn.Close()
			}()
		}
	}()
	// TLS 1.1 is refused; 1.2 and 1.3 are served, with HTTP/1.1 over ALPN.
	old := &tls.Config{RootCAs: ca.pool, MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}
	if conn, err := tls.Dial("tcp", ln.Addr().String(), old); err == nil {
		conn.Close()
		t.Fatal("TLS 1.1 handshake succeeded")
	}
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
			RootCAs: ca.pool, MinVersion: v, MaxVersion: v, NextProtos: []string{"h2", "http/1.1"},
		})
		if err != nil {
			t.Fatalf("version %x: %v", v, err)
		}
		st := conn.ConnectionState()
		conn.Close()
		if st.NegotiatedProtocol != "http/1.1" || st.PeerCertificates[0].SerialNumber.Int64() != 7 {
			t.Fatalf("version %x: alpn %q serial %v", v, st.NegotiatedProtocol, st.PeerCertificates[0].SerialNumber)
		}
	}
}

func TestNewCertReloaderErrors(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	c1, k1 := ca.issue(t, 1, time.Now().Add(time.Hour))
	_, k2 := ca.issue(t, 2, time.Now().Add(time.Hour))
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, otherKey := write("c.pem", c1), write("k.pem", k1), write("k2.pem", k2)
	garbage := write("g.pem", []byte("not PEM"))
	missing := filepath.Join(dir, "absent.pem")

	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"missing cert", missing, key, []string{"read certificate", missing}},
		{"missing key", cert, missing, []string{"read key", missing}},
		{"mismatched key", cert, otherKey, []string{cert, otherKey, "does not match"}},
		{"garbage cert", garbage, key, []string{garbage}},
		{"garbage key", cert, garbage, []string{garbage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCertReloader(tc.cert, tc.key, discardLog())
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Errorf("error echoes key material: %q", err)
			}
		})
	}

	// An expired certificate still starts (a renewal may be on its way),
	// but is reported.
	ce, ke := ca.issue(t, 9, time.Now().Add(-time.Minute))
	var logBuf bytes.Buffer
	r, err := NewCertReloader(write("ce.pem", ce), write("ke.pem", ke), slog.New(slog.NewTextHandler(&logBuf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if r.Certificate().SerialNumber.Int64() != 9 || !strings.Contains(logBuf.String(), "expired") {
		t.Fatalf("expired certificate: serial %v, log %q", r.Certificate().SerialNumber, logBuf.String())
	}
}

func TestReloadKeepsCurrentOnBadRenewal(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	put := func(certPEM, keyPEM []byte) {
		t.Helper()
		// In place, not by rename: contents decide, not inode or mtime.
		if certPEM != nil {
			if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if keyPEM != nil {
			if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	c1, k1 := ca.issue(t, 1, time.Now().Add(time.Hour))
	put(c1, k1)
	r, err := NewCertReloader(certPath, keyPath, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		cert, err := r.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return cert.Leaf.SerialNumber.Int64()
	}

	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("unchanged files: changed %v err %v", changed, err)
	}

	// A renewal caught half-way: new certificate, old key.
	c2, k2 := ca.issue(t, 2, time.Now().Add(2*time.Hour))
	put(c2, nil)
	if changed, err := r.Reload(); changed || err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched pair: changed %v err %v", changed, err)
	}
	if serial() != 1 || r.Failures() != 1 {
		t.Fatalf("after mismatch: serial %d failures %d", serial(), r.Failures())
	}
	// Checking again without a change neither retries nor counts.
	if changed, err := r.Reload(); changed || err != nil || r.Failures() != 1 {
		t.Fatalf("recheck: changed %v err %v failures %d", changed, err, r.Failures())
	}
	// The key lands: the pair is now valid.
	put(nil, k2)
	if changed, err := r.Reload(); !changed || err != nil || serial() != 2 || r.Reloads() != 1 {
		t.Fatalf("completed renewal: changed %v err %v serial %d reloads %d", changed, err, serial(), r.Reloads())
	}

	// An expired replacement is refused.
	c3, k3 := ca.issue(t, 3, time.Now().Add(-time.Minute))
	put(c3, k3)
	if changed, err := r.Reload(); changed || err == nil || !strings.Contains(err.Error(), "expired") || serial() != 2 {
		t.Fatalf("expired renewal: changed %v err %v serial %d", changed, err, serial())
	}
	// A vanished file is counted once, however often it is checked.
	failures := r.Failures()
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.Reload(); err == nil {
			t.Fatal("missing key: no error")
		}
	}
	if r.Failures() != failures+1 || serial() != 2 {
		t.Fatalf("missing key: failures %d (was %d), serial %d", r.Failures(), failures, serial())
	}
}

// A client that leaves an HTTPS request before the first token cancels the
// generation, as over plain HTTP: its TLS close_notify alert arrives ahead
// of the FIN and must not be taken for a pipelined request.
func TestTLSDisconnectBeforeFirstToken(t *testing.T) {
	ta := startTLSAPI(t, fake.Config{FirstTokenDelay: 10 * time.Second})
	host := strings.TrimSuffix(strings.TrimPrefix(ta.url, "https://"), "/api/v1")
	conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: ta.ca.pool})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	if _, err := io.WriteString(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+ta.secret+
		"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "generation started", 2*time.Second, func() bool { return ta.rt.LastStream() != nil })
	st := ta.rt.LastStream()
	closedAt := time.Now()
	conn.Close()
	select {
	case <-st.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("generation still running 2 s after the client left")
	}
	if cancelled, at := st.Cancelled(); !cancelled || at.Sub(closedAt) > 100*time.Millisecond {
		t.Fatalf("cancelled %v, %v after disconnect", cancelled, at.Sub(closedAt))
	}
}
