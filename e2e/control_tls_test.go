package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/internal/testutil"
)

// controlTLS is a control plane serving HTTPS with a certificate for
// 127.0.0.1 from a test CA, laid out like certbot's so it can be renewed.
type controlTLS struct {
	*controlPlane
	ca     *certtest.CA
	certs  *certtest.Dir
	caFile string // the CA's certificate, for --control-ca-file
	pin    string // the leaf's SHA-256, for --control-cert-sha256
}

func startControlTLS(t *testing.T, args ...string) *controlTLS {
	t.Helper()
	c := &controlTLS{ca: certtest.NewCA(t), certs: certtest.NewDir(t)}
	certPEM, keyPEM := c.ca.Issue(t, 2, time.Now().Add(24*time.Hour))
	c.certs.Renew(t, certPEM, keyPEM)
	c.pin = certSHA256(t, certPEM)
	c.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(c.caFile, c.ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	c.controlPlane = startControl(t, append([]string{"--tls-cert", c.certs.Cert(), "--tls-key", c.certs.Key()}, args...)...)
	if !strings.HasPrefix(c.url, "https://127.0.0.1:") {
		t.Fatalf("control plane with a certificate serves at %s", c.url)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: c.ca.Pool}
	c.client = &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

func certSHA256(t *testing.T, certPEM []byte) string {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM certificate")
	}
	sum := sha256.Sum256(b.Bytes)
	return hex.EncodeToString(sum[:])
}

// startTLSNode starts a hearthd node (in front of a mock runtime) that
// enrolls with ctl using the given certificate check.
func startTLSNode(t *testing.T, ctl *controlTLS, check ...string) *hearthd {
	t.Helper()
	mock := startMockRuntime(t, "node-model", bench.MockConfig{Tokens: 4})
	args := append([]string{"--metrics-listen", "", "--model", "node-model", "--ollama-url", mock.URL,
		"--control-url", ctl.url, "--enrollment-token", ctl.enrollmentToken(1),
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40"}, check...)
	return startHearthd(t, hearthdOpts{args: args})
}

// nodeLinkWorks: the node enrolls, and the desired state of a server
// created through the API reaches it and its report comes back.
func nodeLinkWorks(t *testing.T, ctl *controlTLS) (nodeID, serverID string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "node enrolled over TLS", func() bool { return len(ctl.nodes()) == 1 })
	nodeID = ctl.nodes()[0].ID
	serverID = ctl.mustCreate("/v1/servers", map[string]any{"name": "tls-web", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "deployment", "model": "node-model", "billing": "monthly"})
	ctl.mustCreate("/v1/servers/"+serverID+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "action": "allow"})
	ctl.applied(nodeID, 30*time.Second)
	if n := ctl.node(nodeID); n.ServerID != serverID {
		t.Fatalf("node %s holds %q, want %s", nodeID, n.ServerID, serverID)
	}
	return nodeID, serverID
}

var pinLogRe = regexp.MustCompile(`msg="nodes may pin this certificate" control_cert_sha256=([0-9a-f]{64})`)

// TestControlTLSWithCA runs the node link over HTTPS, the node trusting
// the control plane's private CA (--control-ca-file); a renewed
// certificate is served without a restart and the link keeps working.
func TestControlTLSWithCA(t *testing.T) {
	ctl := startControlTLS(t)
	if m := ctl.findLog(pinLogRe, 0); m == nil || m[1] != ctl.pin {
		t.Fatalf("logged pin %v, want %s:\n%s", m, ctl.pin, ctl.logs())
	}
	startTLSNode(t, ctl, "--control-ca-file", ctl.caFile)
	nodeID, serverID := nodeLinkWorks(t, ctl)

	certPEM, keyPEM := ctl.ca.Issue(t, 3, time.Now().Add(48*time.Hour))
	ctl.certs.Renew(t, certPEM, keyPEM)
	host := strings.TrimPrefix(ctl.url, "https://")
	testutil.WaitFor(t, 20*time.Second, "the renewed certificate served", func() bool {
		conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: ctl.ca.Pool})
		if err != nil {
			return false
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64() == 3
	})
	ctl.client.CloseIdleConnections()
	before := ctl.node(nodeID).Revision
	ctl.mustCreate("/v1/servers/"+serverID+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "443", "action": "allow"})
	if rev := ctl.applied(nodeID, 30*time.Second); rev <= before {
		t.Fatalf("revision %d after the renewal, was %d", rev, before)
	}
}

// TestControlTLSPinnedCertificate: a node given only the certificate's
// fingerprint (no CA, as for a self-signed certificate) runs the link.
func TestControlTLSPinnedCertificate(t *testing.T) {
	ctl := startControlTLS(t)
	out, err := exec.Command(ctl.bin, "enrollment-tokens", "create", "--state-dir", ctl.stateDir,
		"--tls-cert", ctl.certs.Cert()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--control-cert-sha256 "+ctl.pin) {
		t.Fatalf("enrollment-tokens create does not show the pin: %v\n%s", err, out)
	}
	// openssl's form, upper case with colons, works as well.
	var colons []string
	for i := 0; i < len(ctl.pin); i += 2 {
		colons = append(colons, strings.ToUpper(ctl.pin[i:i+2]))
	}
	startTLSNode(t, ctl, "--control-cert-sha256", strings.Join(colons, ":"))
	nodeLinkWorks(t, ctl)
}

// TestControlTLSWrongPinRefused: a node whose pin does not match the
// control plane's certificate never enrolls: its enrollment token is never
// sent, and it says why.
func TestControlTLSWrongPinRefused(t *testing.T) {
	ctl := startControlTLS(t)
	wrong := strings.Repeat("ab", 32)
	node := startTLSNode(t, ctl, "--control-cert-sha256", wrong)
	node.waitLog(regexp.MustCompile(`enrollment failed; retrying.*matches no pinned fingerprint`), 0, 30*time.Second)
	if n := ctl.nodes(); len(n) != 0 {
		t.Fatalf("a node enrolled with a wrong pin: %+v", n)
	}
	if strings.Contains(ctl.logs(), "node enrolled") {
		t.Fatalf("the control plane enrolled a node:\n%s", ctl.logs())
	}
}

// TestControlPlainHTTPRefusedOffLoopback: neither side starts plain HTTP
// towards the network. hearth-control will not serve it on a non-loopback
// address without --allow-plain-http, and hearthd will not send its
// enrollment token over it to anything but loopback.
func TestControlPlainHTTPRefusedOffLoopback(t *testing.T) {
	out := startFailingControl(t, "--state-dir", t.TempDir(), "--listen", "0.0.0.0:0")
	if !strings.Contains(out, "config listen") || !strings.Contains(out, "allow-plain-http") {
		t.Fatalf("hearth-control's refusal:\n%s", out)
	}
	for _, u := range []string{"http://10.0.0.1:8400", "http://control.example.com"} {
		cmd := exec.Command(binary(t, "hearthd"), "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "",
			"--state-dir", t.TempDir(), "--control-url", u, "--enrollment-token", "hce_secret")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 || !strings.Contains(string(out), "config control-url") ||
			!strings.Contains(string(out), "in the clear") || strings.Contains(string(out), "hce_secret") {
			t.Fatalf("hearthd with control-url %s: %v\n%s", u, err, out)
		}
	}
}
