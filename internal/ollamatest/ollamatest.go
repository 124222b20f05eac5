// Package ollamatest runs a real `ollama serve` with the tiny test model for
// integration tests. The Ollama binary is required, never optional: without
// it the test fails and says how to get it (`make ollama`).
//
// A test that wants its own server calls Start. A package whose tests share
// one server (the common case: starting Ollama and creating the model takes a
// second) keeps a Shared in a package-level variable of its test files and
// closes it from TestMain:
//
//	var ollama ollamatest.Shared // one server for this test binary
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		ollama.Close()
//		os.Exit(code)
//	}
//
//	func TestChat(t *testing.T) {
//		inst := ollama.Get(t)
//		...
//	}
//
// That variable is the only package-level state involved, and it belongs to
// the test binary, which is exactly the lifetime of the server. As a backstop
// the server gets SIGTERM if the test binary dies without cleaning up.
//
// Before a test gets a shared instance, it is asked for one token. One that
// does not answer (a test before left it stuck) is restarted, its stacks
// logged, so that it costs one check rather than every later test's time;
// one that cannot be brought back fails that test and every later one at
// once.
//
// # Versions
//
// hearth supports a range of Ollama versions, so the integration tests run
// once per version of the test matrix: `make test` lists them in
// $HEARTH_OLLAMA_BINS (VERSION=PATH pairs from `scripts/ensure-ollama.sh
// --all`); without it the matrix is the one binary FindBinary finds. A test
// sharing one server per version runs its body once per version:
//
//	func TestChat(t *testing.T) {
//		ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
//			... // a subtest named by the version, e.g. TestChat/0.17.4
//		})
//	}
//
// A test that starts its own runtime (a private Instance via StartVersion,
// or hearthd with --ollama-bin v.Bin) uses ForEachVersion. Every instance
// checks that its /api/version answers the version it was listed as, so a
// matrix entry cannot silently test another build. Get and Start use the
// default binary (FindBinary: $HEARTH_OLLAMA_BIN, the current version under
// `make test`).
package ollamatest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// ModelName is the name the tiny model is created under.
const ModelName = "hearth-tiny"

// Instance is a running `ollama serve` with the tiny model created.
type Instance struct {
	URL       string // base URL, e.g. http://127.0.0.1:40123
	Addr      string // host:port it listens on
	Model     string // ModelName
	GGUFPath  string // the tiny model file the model was created from
	ModelsDir string // its private OLLAMA_MODELS
	Bin       string // the ollama binary
	Version   string // what its /api/version answers, e.g. "0.17.4"

	dir  string // private temp dir holding everything above
	cmd  *exec.Cmd
	logs *proctest.LogBuffer
	done <-chan struct{} // closed when the process has exited

	stacks string // what the last restart's SIGQUIT printed

	closeOnce sync.Once
}

// FindBinary returns the ollama binary: $HEARTH_OLLAMA_BIN, then ollama on
// PATH, then $(go env GOPATH)/bin/ollama.
func FindBinary() (string, error) {
	if p := os.Getenv("HEARTH_OLLAMA_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("HEARTH_OLLAMA_BIN: %w", err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("ollama"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	if gopath != "" {
		p := filepath.Join(strings.Split(gopath, string(os.PathListSeparator))[0], "bin", "ollama")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("ollama binary not found (looked at $HEARTH_OLLAMA_BIN, PATH and $(go env GOPATH)/bin): run `make ollama`")
}

// Start starts a private Ollama (the default binary) with the tiny model and
// stops it when the test ends. It fails the test if anything goes wrong.
func Start(t testing.TB) *Instance {
	t.Helper()
	testutil.Integration(t, "Ollama")
	bin, err := FindBinary()
	if err != nil {
		t.Fatalf("ollamatest: %v", err)
	}
	return StartVersion(t, Version{Bin: bin})
}

// StartVersion is Start for the Ollama v; it fails the test unless the
// server answers version v.Name (when set).
func StartVersion(t testing.TB, v Version) *Instance {
	t.Helper()
	testutil.Integration(t, "Ollama")
	inst, err := start(v)
	if err != nil {
		t.Fatalf("ollamatest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ollama serve output (tail):\n%s", inst.LogTail(16<<10))
		}
		inst.Close()
	})
	return inst
}

// Shared lazily starts one Instance per Ollama binary for a whole test
// binary; see the package documentation. The zero value is ready to use.
type Shared struct {
	mu     sync.Mutex
	insts  map[string]*sharedInstance // by binary
	closed bool
}

type sharedInstance struct {
	once sync.Once
	inst *Instance
	err  error

	mu     sync.Mutex
	broken error // why it could not be brought back; later tests fail at once
}

// Get returns the shared instance of the default binary (FindBinary),
// starting it on first use. It fails t if the instance could not start or
// has died since.
func (s *Shared) Get(t testing.TB) *Instance {
	t.Helper()
	testutil.Integration(t, "Ollama")
	bin, err := FindBinary()
	if err != nil {
		t.Fatalf("ollamatest: %v", err)
	}
	return s.GetVersion(t, Version{Bin: bin})
}

// GetVersion is Get for the Ollama v. Before returning the instance it
// makes sure it still generates, and restarts it if it does not (see
// ensureAnswers): the test gets a working instance, or fails at once.
func (s *Shared) GetVersion(t testing.TB, v Version) *Instance {
	t.Helper()
	testutil.Integration(t, "Ollama")
	inst, stuck, err := s.get(v, checkWithin)
	if err != nil {
		t.Fatalf("ollamatest: %v", err)
	}
	if stuck != nil {
		t.Logf("ollamatest: shared Ollama %s at %s had stopped answering (%v) after the tests before this one, and was restarted. Its stacks:\n%s",
			inst.Version, inst.URL, stuck, inst.stacks)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ollama serve output (tail):\n%s", inst.LogTail(16<<10))
		}
	})
	return inst
}

// get is GetVersion without the test: the instance, why it had to be
// restarted (stuck), or why there is none for v. within is the time its
// check gives it to answer before it is restarted.
func (s *Shared) get(v Version, within time.Duration) (inst *Instance, stuck, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errors.New("shared instances already closed")
	}
	if s.insts == nil {
		s.insts = make(map[string]*sharedInstance)
	}
	si := s.insts[v.Bin]
	if si == nil {
		si = &sharedInstance{}
		s.insts[v.Bin] = si
	}
	s.mu.Unlock()

	si.once.Do(func() { si.inst, si.err = start(v) })
	if si.err != nil {
		return nil, nil, si.err
	}
	inst = si.inst
	if v.Name != "" && inst.Version != v.Name {
		return nil, nil, fmt.Errorf("%s answers version %s, want %s", v.Bin, inst.Version, v.Name)
	}
	si.mu.Lock()
	defer si.mu.Unlock()
	if si.broken != nil {
		return nil, nil, fmt.Errorf("%w (found by an earlier test; not tried again)", si.broken)
	}
	select {
	case <-inst.done:
		return nil, nil, fmt.Errorf("shared ollama serve has exited; output:\n%s", inst.LogTail(16<<10))
	default:
	}
	stuck, err = inst.ensureAnswers(within)
	if err != nil {
		si.broken = err
		return nil, stuck, fmt.Errorf("%w; log tail:\n%s", err, inst.LogTail(32<<10))
	}
	return inst, stuck, nil
}

// ForEach runs f as a subtest of t per version (see ForEachVersion) with
// that version's shared instance.
func (s *Shared) ForEach(t *testing.T, f func(t *testing.T, inst *Instance)) {
	t.Helper()
	testutil.Integration(t, "Ollama")
	ForEachVersion(t, func(t *testing.T, v Version) { f(t, s.GetVersion(t, v)) })
}

// Close stops the shared instances that were started.
func (s *Shared) Close() {
	s.mu.Lock()
	s.closed = true
	insts := s.insts
	s.mu.Unlock()
	for _, si := range insts {
		si.once.Do(func() { si.err = errors.New("shared instance closed") })
		if si.inst != nil {
			si.inst.Close()
		}
	}
}

// PID returns the process id of `ollama serve`.
func (i *Instance) PID() int { return i.cmd.Process.Pid }

// Logs returns everything ollama serve printed so far (bounded).
func (i *Instance) Logs() string { return i.logs.String() }

// LogTail returns the last n bytes of the output.
func (i *Instance) LogTail(n int) string { return i.logs.Tail(n) }

// Client returns an Ollama API client for the instance.
func (i *Instance) Client() *api.Client {
	u, _ := url.Parse(i.URL)
	return api.NewClient(u, http.DefaultClient)
}

// Exited is closed once the ollama serve process has exited.
func (i *Instance) Exited() <-chan struct{} { return i.done }

// Close stops the server and its runners (the whole process group) and
// removes its files. It is safe to call more than once.
func (i *Instance) Close() {
	i.closeOnce.Do(func() {
		i.stop()
		_ = os.RemoveAll(i.dir)
	})
}

// Restart stops the server (SIGTERM to its group) and starts a new one on
// the same address and models directory, as an operator's restart of
// Ollama would: clients' connections to the old one are closed.
func (i *Instance) Restart() error {
	i.stop()
	i.cmd = nil
	if err := i.launch(i.Addr); err != nil {
		i.stop()
		i.cmd = nil
		return fmt.Errorf("ollamatest: restart on %s: %w", i.Addr, err)
	}
	return nil
}

// restart replaces a server that stopped answering with a new one on the
// same address and models directory (on another address if that one is
// taken meanwhile). The server and its runners get SIGQUIT first, on which
// the Go runtime prints every goroutine's stack into the log: where a
// stuck server waits.
func (i *Instance) restart() error {
	const mark = "\n--- ollamatest: ollama serve stopped answering: SIGQUIT, then a restart ---\n"
	fmt.Fprint(i.logs, mark)
	if i.cmd != nil {
		for _, pid := range proctest.Children(i.PID()) {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			_ = syscall.Kill(pid, syscall.SIGCONT) // in case it was stopped
		}
		_ = syscall.Kill(i.PID(), syscall.SIGQUIT)
		select {
		case <-i.done: // its stacks written
		case <-time.After(10 * time.Second):
		}
	}
	// cmd is cleared once its group is stopped, so that the group is not
	// signalled again (its ids may have been reused by then).
	i.stop()
	i.cmd = nil
	i.stacks = i.logs.String()
	if k := strings.LastIndex(i.stacks, mark); k >= 0 {
		i.stacks = i.stacks[k+len(mark):]
	}
	err := i.launch(i.Addr)
	if err != nil {
		i.stop()
		i.cmd = nil
		if err = i.launch(""); err != nil {
			i.stop()
			i.cmd = nil
		}
	}
	return err
}

// stop ends the process group: SIGTERM, then SIGKILL after a grace period.
func (i *Instance) stop() {
	if i.cmd == nil {
		return
	}
	// The group: runners may outlive a server that was told to stop.
	proctest.StopGroup(i.cmd.Process.Pid, i.done, 5*time.Second)
}

// start starts v.Bin and checks it answers version v.Name, if set.
func start(v Version) (*Instance, error) {
	dir, err := os.MkdirTemp("", "ollamatest-")
	if err != nil {
		return nil, err
	}
	inst := &Instance{
		Model:     ModelName,
		GGUFPath:  filepath.Join(dir, "tiny.gguf"),
		ModelsDir: filepath.Join(dir, "models"),
		Bin:       v.Bin,
		dir:       dir,
	}
	fail := func(err error) (*Instance, error) {
		if inst.cmd != nil {
			inst.Close()
			err = fmt.Errorf("%w\nollama serve output (tail):\n%s", err, inst.LogTail(16<<10))
		} else {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	if err := os.MkdirAll(inst.ModelsDir, 0o700); err != nil {
		return fail(err)
	}
	if err := tinymodel.WriteFile(inst.GGUFPath, tinymodel.Options{}); err != nil {
		return fail(err)
	}

	// A free port can be taken between probing and binding; try a few.
	for attempt := 0; ; attempt++ {
		err := inst.launch("")
		if err == nil {
			break
		}
		if attempt == 2 {
			return fail(err)
		}
		inst.stop()
		inst.cmd = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if inst.Version, err = inst.Client().Version(ctx); err != nil {
		return fail(fmt.Errorf("ask its version: %w", err))
	}
	if v.Name != "" && inst.Version != v.Name {
		return fail(fmt.Errorf("%s answers version %q, want %s: rebuild it with scripts/ensure-ollama.sh %s", v.Bin, inst.Version, v.Name, v.Name))
	}
	if err := CreateModel(ctx, inst.Client(), inst.Model, inst.GGUFPath); err != nil {
		return fail(err)
	}
	return inst, nil
}

// launch starts ollama serve on addr (a free loopback port if empty) and
// waits until it answers. Its output goes on in the instance's log.
func (i *Instance) launch(addr string) error {
	if addr == "" {
		var err error
		if addr, err = testutil.FreeAddr(); err != nil {
			return err
		}
	}
	i.Addr = addr
	i.URL = "http://" + i.Addr
	if i.logs == nil {
		i.logs = &proctest.LogBuffer{}
	}

	cmd := exec.Command(i.Bin, "serve")
	cmd.Dir = i.dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + i.dir, // its key pair goes here, not in the real home
		"OLLAMA_HOST=" + i.Addr,
		"OLLAMA_MODELS=" + i.ModelsDir,
		"OLLAMA_NOPRUNE=1",
	}
	cmd.Stdout = i.logs
	cmd.Stderr = i.logs
	// Runners inherit the output; do not let them hold up Wait when the
	// server itself has exited.
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	done, err := proctest.Start(cmd)
	if err != nil {
		return err
	}
	i.cmd, i.done = cmd, done

	hc := &http.Client{Timeout: time.Second}
	return proctest.WaitReady("ollama serve on "+i.Addr, i.done, 30*time.Second, func() error {
		resp, err := hc.Get(i.URL + "/api/version")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/api/version: %s", resp.Status)
		}
		return nil
	})
}

// CreateModel uploads the GGUF file at path as a blob and creates model name
// from it with the tiny model's chat template and parameters.
func CreateModel(ctx context.Context, c *api.Client, name, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read model: %w", err)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := c.CreateBlob(ctx, digest, bytes.NewReader(data)); err != nil {
		return fmt.Errorf("upload model blob: %w", err)
	}
	stream := false
	err = c.Create(ctx, &api.CreateRequest{
		Model:      name,
		Stream:     &stream,
		Files:      map[string]string{filepath.Base(path): digest},
		Template:   tinymodel.Template,
		Parameters: tinymodel.Parameters(),
	}, func(api.ProgressResponse) error { return nil })
	if err != nil {
		return fmt.Errorf("create model %s: %w", name, err)
	}
	return nil
}
