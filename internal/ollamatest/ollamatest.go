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
package ollamatest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/runtime/tinymodel"
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

	dir  string // private temp dir holding everything above
	cmd  *exec.Cmd
	logs *logBuffer
	done chan struct{} // closed when the process has exited

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

// Start starts a private Ollama with the tiny model and stops it when the
// test ends. It fails the test if anything goes wrong.
func Start(t testing.TB) *Instance {
	t.Helper()
	inst, err := start()
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

// Shared lazily starts one Instance for a whole test binary; see the package
// documentation. The zero value is ready to use.
type Shared struct {
	once sync.Once
	inst *Instance
	err  error
}

// Get returns the shared instance, starting it on first use. It fails t if
// the instance could not start or has died since.
func (s *Shared) Get(t testing.TB) *Instance {
	t.Helper()
	s.once.Do(func() { s.inst, s.err = start() })
	if s.err != nil {
		t.Fatalf("ollamatest: %v", s.err)
	}
	select {
	case <-s.inst.done:
		t.Fatalf("ollamatest: shared ollama serve has exited; output:\n%s", s.inst.LogTail(16<<10))
	default:
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ollama serve output (tail):\n%s", s.inst.LogTail(16<<10))
		}
	})
	return s.inst
}

// Close stops the shared instance if it was started.
func (s *Shared) Close() {
	s.once.Do(func() { s.err = errors.New("shared instance closed") })
	if s.inst != nil {
		s.inst.Close()
	}
}

// PID returns the process id of `ollama serve`.
func (i *Instance) PID() int { return i.cmd.Process.Pid }

// Logs returns everything ollama serve printed so far (bounded).
func (i *Instance) Logs() string { return i.logs.String() }

// LogTail returns the last n bytes of the output.
func (i *Instance) LogTail(n int) string {
	s := i.logs.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

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

// stop ends the process group: SIGTERM, then SIGKILL after a grace period.
func (i *Instance) stop() {
	if i.cmd == nil {
		return
	}
	pgid := i.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-i.done:
	case <-time.After(5 * time.Second):
	}
	// Runners may outlive a server that was told to stop.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-i.done
}

func start() (*Instance, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ollamatest-")
	if err != nil {
		return nil, err
	}
	inst := &Instance{
		Model:     ModelName,
		GGUFPath:  filepath.Join(dir, "tiny.gguf"),
		ModelsDir: filepath.Join(dir, "models"),
		Bin:       bin,
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
		err := inst.launch()
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
	if err := CreateModel(ctx, inst.Client(), inst.Model, inst.GGUFPath); err != nil {
		return fail(err)
	}
	return inst, nil
}

// launch starts ollama serve on a free loopback port and waits until it
// answers.
func (i *Instance) launch() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	i.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	i.URL = "http://" + i.Addr
	i.logs = &logBuffer{max: 1 << 20}
	i.done = make(chan struct{})

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
	// Pdeathsig fires when the thread that started the child exits, so
	// start it from a goroutine pinned to its thread for the child's life
	// (the caller's thread may be locked by a test and end with it).
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(i.done)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(i.done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start %s serve: %w", i.Bin, err)
	}
	i.cmd = cmd

	deadline := time.Now().Add(30 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(i.URL + "/api/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-i.done:
			return fmt.Errorf("ollama serve on %s exited during start-up", i.Addr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ollama serve on %s not reachable after 30s: %v", i.Addr, err)
		}
	}
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logBuffer keeps the last max bytes written to it.
type logBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

var _ io.Writer = (*logBuffer)(nil)
