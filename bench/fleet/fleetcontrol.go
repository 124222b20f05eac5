package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/systemd"
)

// ErrBackendUnsupported means the control plane under test cannot run on the
// database the benchmark asked for.
var ErrBackendUnsupported = errors.New("not supported by this control plane yet")

// controlPackage is the control plane's main package.
const controlPackage = "github.com/hearthd/hearth/cmd/hearth-control"

// pprofEnv names the listen address of the pprof listener that a profiling
// build of hearth-control (BuildControl with pprof) serves.
const pprofEnv = "HEARTH_BENCH_PPROF_LISTEN"

// pprofOverlay is added to hearth-control's main package for a profiling
// build. hearth-control's metrics listener serves no /debug/pprof/, and the
// benchmark must not change the control plane it measures, so the file goes
// in through `go build -overlay` and the tree stays as it is.
const pprofOverlay = `package main

import (
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on http.DefaultServeMux
	"os"
)

func init() {
	addr := os.Getenv("` + pprofEnv + `")
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic("pprof listener: " + err.Error())
	}
	go func() { _ = http.Serve(ln, http.DefaultServeMux) }()
}
`

// BuildControl builds hearth-control from this tree into dir. With pprof
// the binary also serves net/http/pprof where $HEARTH_BENCH_PPROF_LISTEN
// says (through an overlay; see pprofOverlay).
func BuildControl(ctx context.Context, dir string, pprof bool) (string, error) {
	bin := filepath.Join(dir, "hearth-control")
	args := []string{"build", "-o", bin}
	if pprof {
		out, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.Dir}}", controlPackage).Output()
		if err != nil {
			return "", fmt.Errorf("locate %s: %w", controlPackage, err)
		}
		src := filepath.Join(dir, "bench_pprof.go")
		if err := os.WriteFile(src, []byte(pprofOverlay), 0o644); err != nil {
			return "", fmt.Errorf("write pprof overlay: %w", err)
		}
		overlay, err := json.Marshal(map[string]map[string]string{"Replace": {
			filepath.Join(strings.TrimSpace(string(out)), "zz_bench_pprof.go"): src}})
		if err != nil {
			return "", err
		}
		ov := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(ov, overlay, 0o644); err != nil {
			return "", fmt.Errorf("write overlay: %w", err)
		}
		args = append(args, "-overlay", ov)
	}
	out, err := exec.CommandContext(ctx, "go", append(args, controlPackage)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build hearth-control: %w: %s", err, out)
	}
	return bin, nil
}

// SupportsDatabaseURL reports whether bin's serve command takes
// --database-url (a control plane that can run on PostgreSQL).
func SupportsDatabaseURL(ctx context.Context, bin string) (bool, error) {
	// serve -h lists the flags and exits with status 2.
	out, _ := exec.CommandContext(ctx, bin, "serve", "-h").CombinedOutput()
	if !bytes.Contains(out, []byte("-listen")) {
		return false, fmt.Errorf("%s serve -h listed no flags: %s", bin, out)
	}
	return bytes.Contains(out, []byte("-database-url")), nil
}

// ControlOptions start a control plane for a fleet run.
type ControlOptions struct {
	Bin     string
	WorkDir string
	// DatabaseURL runs every replica on this PostgreSQL database; empty
	// means embedded Pebble (one replica).
	DatabaseURL string
	Replicas    int
	// Pprof gives every replica a pprof listener (Bin must be a profiling
	// build).
	Pprof bool
	// Extra arguments for `hearth-control serve`.
	Extra []string
	// Log receives the replicas' output; nil discards it.
	Log io.Writer
}

// ControlPlane is one or more running `hearth-control serve` processes
// sharing one state.
type ControlPlane struct {
	Replicas []*Replica
	bin      string
	config   string // an empty configuration file, so /etc/hearth does not apply
}

// Replica is one `hearth-control serve` process.
type Replica struct {
	*bench.Process
	StateDir    string
	AdminSocket string
	PprofURL    string // "" unless started with Pprof
}

// StartControlPlane starts o.Replicas control plane processes and waits
// until each serves its API. Their open-file limit is this process's.
func StartControlPlane(ctx context.Context, o ControlOptions) (*ControlPlane, error) {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.DatabaseURL == "" && o.Replicas > 1 {
		return nil, errors.New("embedded Pebble allows one control plane process; replicas need --database-url")
	}
	cp := &ControlPlane{bin: o.Bin, config: filepath.Join(o.WorkDir, "control.toml")}
	if err := os.WriteFile(cp.config, nil, 0o644); err != nil {
		return nil, fmt.Errorf("control plane config: %w", err)
	}
	for i := range o.Replicas {
		r, err := cp.startReplica(ctx, o, i)
		if err != nil {
			cp.Stop()
			return nil, err
		}
		cp.Replicas = append(cp.Replicas, r)
	}
	return cp, nil
}

func (cp *ControlPlane) startReplica(ctx context.Context, o ControlOptions, i int) (*Replica, error) {
	r := &Replica{StateDir: filepath.Join(o.WorkDir, fmt.Sprintf("control-%d", i))}
	r.AdminSocket = filepath.Join(r.StateDir, "admin.sock")
	if err := bench.EnsureDir(r.StateDir); err != nil {
		return nil, err
	}
	addr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	maddr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	// The benchmark's clients must never meet the per-token rate limit.
	args := []string{"serve", "--config", cp.config, "--listen", addr, "--metrics-listen", maddr,
		"--state-dir", r.StateDir, "--admin-socket", r.AdminSocket, "--rate-limit", "1000000", "--rate-burst", "1000000",
		// The whole simulated fleet comes from loopback, one source.
		"--max-conns-per-source", "0", "--max-conns", "0", "--node-rate-limit", "1000000", "--node-rate-burst", "1000000"}
	if o.DatabaseURL != "" {
		args = append(args, "--database-url", o.DatabaseURL)
	}
	args = append(args, o.Extra...)
	// The replica runs with the environment its unit gives it.
	env := systemd.ControlEnvironment()
	if o.Pprof {
		paddr, err := testutil.FreeAddr()
		if err != nil {
			return nil, err
		}
		env = append(env, pprofEnv+"="+paddr)
		r.PprofURL = "http://" + paddr
	}
	out := &proctest.LogBuffer{Max: 64 << 10}
	var w io.Writer = out
	if o.Log != nil {
		w = io.MultiWriter(o.Log, out)
	}
	p, err := bench.StartProcess(ctx, o.Bin, args, env, w, "http://"+addr, "/v1/openapi.json", 2*time.Minute, nil)
	if err != nil {
		tail := out.Tail(2 << 10)
		if o.DatabaseURL != "" && strings.Contains(tail, "flag provided but not defined: -database-url") {
			return nil, fmt.Errorf("PostgreSQL: %w (hearth-control serve refused --database-url)", ErrBackendUnsupported)
		}
		return nil, fmt.Errorf("control plane replica %d: %w; its output:\n%s", i, err, tail)
	}
	p.MetricsURL = "http://" + maddr
	r.Process = p
	return r, nil
}

// URLs returns the replicas' base URLs.
func (cp *ControlPlane) URLs() []string {
	var urls []string
	for _, r := range cp.Replicas {
		urls = append(urls, r.URL)
	}
	return urls
}

// PIDs returns the replicas' process IDs.
func (cp *ControlPlane) PIDs() []int {
	var pids []int
	for _, r := range cp.Replicas {
		pids = append(pids, r.PID)
	}
	return pids
}

// Stop stops every replica and reports the first failure.
func (cp *ControlPlane) Stop() error {
	var first error
	for _, r := range cp.Replicas {
		if err := r.Stop(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Exited reports whether a replica has ended.
func (cp *ControlPlane) Exited() bool {
	for _, r := range cp.Replicas {
		if r.Exited() {
			return true
		}
	}
	return false
}

// admin runs an operator command (tokens, enrollment-tokens) through the
// first replica's admin socket and returns what it printed on stdout.
func (cp *ControlPlane) admin(ctx context.Context, args ...string) (string, error) {
	r := cp.Replicas[0]
	args = append(args, "--config", cp.config, "--state-dir", r.StateDir, "--admin-socket", r.AdminSocket)
	cmd := exec.CommandContext(ctx, cp.bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hearth-control %s: %w: %s", strings.Join(args[:2], " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(string(out)), nil
}

// APIToken issues a management API token of the default project.
func (cp *ControlPlane) APIToken(ctx context.Context, name string) (string, error) {
	return cp.admin(ctx, "tokens", "create", "--project", "default", "--name", name)
}

// EnrollmentToken issues an enrollment token for uses nodes.
func (cp *ControlPlane) EnrollmentToken(ctx context.Context, uses int) (string, error) {
	return cp.admin(ctx, "enrollment-tokens", "create", "--uses", strconv.Itoa(uses), "--ttl", "24h")
}

// createDatabase makes an empty database on the PostgreSQL server that
// serverURL (a superuser's URL) points at and returns its URL.
func createDatabase(ctx context.Context, serverURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", fmt.Errorf("parse PostgreSQL URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// procSampler samples the CPU of the control plane's processes (and of
// PostgreSQL's, when the benchmark runs it) and the replicas' memory.
type procSampler struct {
	pids  []int
	pgPID int // the postmaster; 0 when PostgreSQL is not ours to measure

	mu        sync.Mutex
	peak      int64 // highest sum of the replicas' RSS seen
	phasePeak int64 // the same since takePhasePeak
	stop      chan struct{}
	done      chan struct{}
}

func newProcSampler(pids []int, pgPID int) *procSampler {
	s := &procSampler{pids: pids, pgPID: pgPID, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run(100 * time.Millisecond)
	return s
}

func (s *procSampler) run(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// sample reads the replicas' RSS now and keeps the peaks.
func (s *procSampler) sample() {
	rss, _ := s.memory()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peak = max(s.peak, rss)
	s.phasePeak = max(s.phasePeak, rss)
}

// Close stops sampling.
func (s *procSampler) Close() {
	close(s.stop)
	<-s.done
}

// memory returns the replicas' summed RSS and peak RSS (VmHWM).
func (s *procSampler) memory() (rss, hwm int64) {
	for _, pid := range s.pids {
		if p, err := bench.ReadProc(pid); err == nil {
			rss += p.RSS
			hwm += p.HWM
		}
	}
	return rss, hwm
}

// peakRSS is the highest summed RSS sampled so far.
func (s *procSampler) peakRSS() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// takePhasePeak returns the highest RSS since its last call and starts
// over.
func (s *procSampler) takePhasePeak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.phasePeak
	s.phasePeak = 0
	return p
}

// cpu returns the CPU time the replicas and PostgreSQL (the postmaster and
// its backends) have used so far.
func (s *procSampler) cpu() (control, pg time.Duration) {
	for _, pid := range s.pids {
		if p, err := bench.ReadProc(pid); err == nil {
			control += p.CPU
		}
	}
	if s.pgPID != 0 {
		var ticks int64
		for _, pid := range append([]int{s.pgPID}, proctest.Children(s.pgPID)...) {
			if t, err := proctest.CPUTicks(pid); err == nil {
				ticks += t
			}
		}
		// Backends that ended (a pool recycles its connections) count on
		// in the postmaster's reaped children, or the sum would drop.
		if t, err := proctest.ReapedCPUTicks(s.pgPID); err == nil {
			ticks += t
		}
		pg = time.Duration(ticks) * time.Second / bench.UserHZ
	}
	return control, pg
}
