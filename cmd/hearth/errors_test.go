package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// TestExitCodes fixes the documented exit codes against a real control
// plane: each row is a command that must end with its code, and what its
// error output must say.
func TestExitCodes(t *testing.T) {
	h := newHarness(t)
	h.ctl.StartNode(controltest.NodeOptions{})
	create := []string{"server", "create", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare", "-o", "table"}
	h.ok(append(create, "--name", "taken")...)
	// A port nothing listens on: the API is unreachable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		says []string // on stderr
	}{
		{"ok", nil, []string{"server", "list"}, exitOK, nil},
		{"API 400", nil, append(create, "--name", "Bad_Name"), exitError,
			[]string{"Error: name must be", "HTTP 400 invalid_request, param: name, request id: req_"}},
		{"usage: unknown flag", nil, []string{"server", "list", "--colour"}, exitUsage, []string{"unknown flag: --colour"}},
		{"usage: missing flag", nil, []string{"server", "create", "--name", "x"}, exitUsage, []string{`required flag(s) "chip", "ram", "storage" not set`}},
		{"usage: extra argument", nil, []string{"server", "get", "a", "b"}, exitUsage, []string{"accepts 1 arg(s), received 2"}},
		{"usage: unknown command", nil, []string{"servre"}, exitUsage, []string{`unknown command`, "servre"}},
		{"usage: output", nil, []string{"server", "list", "-o", "yaml"}, exitUsage, []string{"--output must be table or json"}},
		{"usage: no model", nil, []string{"server", "create", "--name", "x", "--chip", "cpu", "--ram", "1", "--storage", "1"}, exitUsage,
			[]string{"--model is required"}},
		{"usage: no connection", map[string]string{"HEARTH_URL": "", "HEARTH_TOKEN": ""}, []string{"server", "list"}, exitUsage,
			[]string{"set HEARTH_URL and HEARTH_TOKEN"}},
		{"usage: half a connection", map[string]string{"HEARTH_TOKEN": ""}, []string{"server", "list"}, exitUsage,
			[]string{"must be set together"}},
		{"not found: ID", nil, []string{"server", "get", "srv_000000000000000000000000"}, exitNotFound,
			[]string{"HTTP 404 not_found, param: id, request id: req_"}},
		{"not found: name", nil, []string{"server", "delete", "nosuch"}, exitNotFound, []string{`no server with the ID or name "nosuch"`}},
		{"not found: sub-resource", nil, []string{"api-key", "delete", "dk_000000000000000000000000", "--server", "taken"}, exitNotFound,
			[]string{"param: key_id"}},
		{"unauthorized", map[string]string{"HEARTH_TOKEN": "hct_wrong"}, []string{"server", "list"}, exitAuth,
			[]string{"HTTP 401 unauthorized"}},
		{"conflict: name", nil, append(create, "--name", "taken"), exitConflict, []string{"HTTP 409 conflict, param: name"}},
		{"conflict: capacity", nil, append(create, "--name", "more"), exitConflict, []string{"HTTP 409 capacity_unavailable"}},
		{"unavailable", map[string]string{"HEARTH_URL": closed}, []string{"server", "list"}, exitUnavailable, []string{"connection refused"}},
		{"plain HTTP refused", map[string]string{"HEARTH_URL": "http://control.example.com"}, []string{"server", "list"}, exitError,
			[]string{"environment: control plane URL", "in the clear"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := *h
			sub.t = t
			sub.env = map[string]string{}
			for k, v := range h.env {
				sub.env[k] = v
			}
			for k, v := range tc.env {
				sub.env[k] = v
			}
			r := sub.run(append([]string{"-o", "table"}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("want exit %d, got %v", tc.code, r)
			}
			for _, s := range tc.says {
				if !strings.Contains(r.err, s) {
					t.Errorf("stderr lacks %q:\n%s", s, r.err)
				}
			}
		})
	}
}

// TestRateLimitedExitCode: a 429 whose Retry-After is longer than the
// client waits on its own ends the command with exit 6.
func TestRateLimitedExitCode(t *testing.T) {
	h := newHarness(t, "--rate-limit", "0.001", "--rate-burst", "1")
	h.ok("server", "list")
	r := h.fails(exitUnavailable, "server", "list", "-o", "table")
	if !strings.Contains(r.err, "HTTP 429 rate_limited") {
		t.Fatalf("stderr: %s", r.err)
	}
}

// TestErrorsAsJSON: with JSON output the error is JSON on stderr, with
// the API's code, param and request ID, and stdout stays empty.
func TestErrorsAsJSON(t *testing.T) {
	h := newHarness(t)
	r := h.fails(exitNotFound, "server", "get", "srv_000000000000000000000000", "-o", "json")
	var e struct {
		Error struct {
			Status    int     `json:"status"`
			Code      string  `json:"code"`
			Message   string  `json:"message"`
			Param     *string `json:"param"`
			RequestID string  `json:"request_id"`
			ExitCode  int     `json:"exit_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.err), &e); err != nil || r.out != "" {
		t.Fatalf("stderr is not one JSON error (%v): %v", err, r)
	}
	if e.Error.Status != 404 || e.Error.Code != "not_found" || e.Error.Param == nil || *e.Error.Param != "id" ||
		!strings.HasPrefix(e.Error.RequestID, "req_") || e.Error.ExitCode != exitNotFound || !strings.Contains(e.Error.Message, "srv_000000000000000000000000") {
		t.Fatalf("error %+v", e.Error)
	}
	r = h.fails(exitUsage, "server", "get", "-o", "json")
	e.Error.Code = ""
	if err := json.Unmarshal([]byte(r.err), &e); err != nil || e.Error.ExitCode != exitUsage || e.Error.Code != "" {
		t.Fatalf("usage error as JSON: %v", r)
	}
}

// TestExitCodeMapping covers what a real control plane does not answer
// today: 403 forbidden (a read-only token's write), 503, a reset
// connection, an untrusted certificate, an interrupt.
func TestExitCodeMapping(t *testing.T) {
	run := func(err error) error { return runError{err: err} }
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, exitOK},
		{errors.New("cobra: bad flag"), exitUsage},
		{run(usagef("x")), exitUsage},
		{run(fmt.Errorf("wrapped: %w", client.APIError{StatusCode: 403, Code: client.CodeForbidden})), exitAuth},
		{run(client.APIError{StatusCode: 401}), exitAuth},
		{run(client.APIError{StatusCode: 404}), exitNotFound},
		{run(client.APIError{StatusCode: 409, Code: client.CodeIdempotencyConflict}), exitConflict},
		{run(client.APIError{StatusCode: 429}), exitUnavailable},
		{run(client.APIError{StatusCode: 503}), exitUnavailable},
		{run(client.APIError{StatusCode: 500}), exitError},
		{run(client.APIError{StatusCode: 413}), exitError},
		{run(&url.Error{Op: "Get", URL: "x", Err: &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}}), exitUnavailable},
		{run(&url.Error{Op: "Get", URL: "x", Err: &net.DNSError{Err: "no such host", Name: "x"}}), exitUnavailable},
		{run(&url.Error{Op: "Get", URL: "x", Err: &tls.CertificateVerificationError{Err: errors.New("unknown authority")}}), exitError},
		{run(fmt.Errorf("server srv_x: %w: pull failed", client.ErrServerFailed)), exitFailed},
		{run(fmt.Errorf("%w", client.ErrServerDeleting)), exitFailed},
		{run(fmt.Errorf("%w: still changing", errWaitTimeout)), exitWaitTimeout},
		{run(fmt.Errorf("stopped waiting: %w", context.Canceled)), exitInterrupted},
		{run(notFoundError{msg: "context"}), exitNotFound},
		{run(errors.New("open key.pub: no such file")), exitError},
	} {
		if got := exitCode(tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// TestBinary runs the built hearth as a process: its exit status is the
// documented code, and with stdout not a terminal its output is JSON.
func TestBinary(t *testing.T) {
	h := newHarness(t)
	if r := h.exec("server", "list"); r.code != 0 || r.out != "[]\n" {
		t.Fatalf("server list: %v", r)
	}
	if r := h.exec("server", "get", "nosuch"); r.code != exitNotFound || r.out != "" || !strings.HasPrefix(r.err, `{"error":`) {
		t.Fatalf("server get nosuch: %v", r)
	}
	if r := h.exec("server", "list", "--bogus"); r.code != exitUsage {
		t.Fatalf("bad flag: %v", r)
	}
	h.env["HEARTH_TOKEN"] = "hct_wrong"
	if r := h.exec("ssh-key", "list", "-o", "table"); r.code != exitAuth || !strings.Contains(r.err, "HTTP 401 unauthorized") {
		t.Fatalf("wrong token: %v", r)
	}
	if r := h.exec("--version"); r.code != 0 || !strings.Contains(r.out, "dev") {
		t.Fatalf("--version: %v", r)
	}
}

// TestProjectsAndScopes: a read-only token reads and gets exit 4 on a
// write (403 forbidden); another project's server is not found (exit 3),
// exactly like an unknown one.
func TestProjectsAndScopes(t *testing.T) {
	h := newHarness(t)
	h.ctl.StartNode(controltest.NodeOptions{})
	var srv client.Server
	h.json(&srv, "server", "create", "--name", "web", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare")

	h.env["HEARTH_TOKEN"] = h.ctl.NewToken("default", "viewer", true)
	var list []client.Server
	if h.json(&list, "server", "list"); len(list) != 1 || list[0].ID != srv.ID {
		t.Fatalf("read-only list: %+v", list)
	}
	r := h.fails(exitAuth, "server", "delete", srv.ID, "-o", "table")
	if !strings.Contains(r.err, "HTTP 403 forbidden") || !strings.Contains(r.err, "request id: req_") {
		t.Fatalf("read-only delete: %v", r)
	}
	h.fails(exitAuth, "ssh-key", "add", "--public-key", testKey)

	h.env["HEARTH_TOKEN"] = h.ctl.NewProject("other")
	if h.json(&list, "server", "list"); len(list) != 0 {
		t.Fatalf("another project sees %+v", list)
	}
	foreign := h.fails(exitNotFound, "server", "get", srv.ID, "-o", "json")
	unknown := h.fails(exitNotFound, "server", "get", "srv_000000000000000000000000", "-o", "json")
	strip := func(s string) string {
		return regexp.MustCompile(`srv_\w{24}|req_\w+`).ReplaceAllString(s, "X")
	}
	if strip(foreign.err) != strip(unknown.err) {
		t.Fatalf("another project's server answers unlike an unknown one:\n%s\n%s", foreign.err, unknown.err)
	}
	h.fails(exitNotFound, "server", "get", "web") // names too: the list is the project's
}

// TestTLS: a control plane serving HTTPS with a private CA is reached
// through a context's --ca-file or HEARTH_CA_FILE, and refused without.
func TestTLS(t *testing.T) {
	tlsArgs, caFile := controltest.TLSArgs(t)
	h := newHarness(t, tlsArgs...)
	if !strings.HasPrefix(h.ctl.URL, "https://127.0.0.1:") {
		t.Fatalf("control plane URL %s", h.ctl.URL)
	}
	r := h.fails(exitError, "ssh-key", "list", "-o", "table")
	if !strings.Contains(r.err, "certificate") {
		t.Fatalf("without the CA: %v", r)
	}
	h.env["HEARTH_CA_FILE"] = caFile
	h.ok("ssh-key", "add", "--public-key", testKey)

	url, token := h.env["HEARTH_URL"], h.env["HEARTH_TOKEN"]
	h.env["HEARTH_URL"], h.env["HEARTH_CA_FILE"] = "", ""
	if r := h.startWith(token+"\n", "context", "create", "tls", "--url", url, "--ca-file", caFile).wait(t); r.code != 0 {
		t.Fatalf("context create --ca-file: %v", r)
	}
	h.env["HEARTH_TOKEN"] = ""
	var keys []client.SSHKey
	if h.json(&keys, "ssh-key", "list"); len(keys) != 1 {
		t.Fatalf("through the context: %+v", keys)
	}
	h.fails(exitUsage, "context", "create", "broken", "--url", url, "--ca-file", filepath.Join(t.TempDir(), "none.pem"))
}
