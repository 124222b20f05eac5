// Package daemon is the node: it wires the concerns (runtime, API keys,
// state) into hearthd, serves the fasthttp deployment API and runs the
// start-up and shutdown order.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/runtime"
	"github.com/hearthd/hearth/runtime/ollama"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/systemd"
)

// Run serves until ctx ends, then drains and stops. Start-up order: state,
// API keys and the admin socket; the runtime (started and supervised if
// configured); the deployment API listener, which answers /healthz at once
// and 503 until the model is present and loaded; then ready.
func Run(ctx context.Context, cfg Config, version string, log *slog.Logger) error {
	return RunWith(ctx, cfg, version, log, systemd.SdNotifier{})
}

// RunWith is Run reporting to systemd through n: STATUS= lines as start-up
// proceeds, READY=1 once state is loaded, rules applied and the model warm,
// watchdog pings while the API answers, STOPPING=1 on shutdown.
func RunWith(ctx context.Context, cfg Config, version string, log *slog.Logger, n systemd.Notifier) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	status := func(s string) {
		if err := n.Status(s); err != nil {
			log.Debug("sd_notify", "err", err)
		}
	}
	status("loading state")
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	st, err := store.Open(filepath.Join(cfg.StateDir, "db"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()

	keys, err := apikeys.Open(st, log)
	if err != nil {
		return fmt.Errorf("load API keys: %w", err)
	}
	defer keys.Close()
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	go func() { _ = keys.Run(bg, 10*time.Second) }()

	adminLn, err := apikeys.ListenAdmin(cfg.AdminSocketPath())
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	go func() {
		if err := apikeys.ServeAdmin(bg, adminLn, keys, log); err != nil {
			log.Error("admin socket stopped", "err", err)
		}
	}()

	m := metrics.NewNode(version)
	if cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("config metrics-listen: %w", err)
		}
		go func() {
			if err := metrics.ServeMux(bg, mln, metricsMux(m), log); err != nil {
				log.Error("metrics listener stopped", "err", err)
			}
		}()
		log.Info("metrics listening", "addr", mln.Addr().String())
	}

	// rewarm asks for the model to be loaded again: a restarted runtime
	// starts empty, and /readyz stays false until the model is back.
	rewarm := make(chan struct{}, 1)
	if cfg.OllamaStart {
		sup, err := supervisor(cfg, log)
		if err != nil {
			return err
		}
		sup.OnExit = func(err error) {
			m.RuntimeRestarted()
			log.Warn("model runtime exited; restarting", "err", err)
			select {
			case rewarm <- struct{}{}:
			default:
			}
		}
		supDone := make(chan struct{})
		go func() { defer close(supDone); _ = sup.Run(bg) }()
		// The runtime stops last, after the API has drained.
		defer func() { stopBG(); <-supDone }()
	}

	rt, err := ollama.New(ollama.Config{
		BaseURL:          cfg.OllamaURL,
		Model:            cfg.Model,
		FirstByteTimeout: cfg.RuntimeTimeout,
		MaxConns:         cfg.MaxConcurrent + cfg.MaxQueue,
		Logger:           log,
	})
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}

	api := NewAPI(APIConfig{
		Model:             cfg.Model,
		Version:           version,
		MaxConcurrent:     cfg.MaxConcurrent,
		MaxQueue:          cfg.MaxQueue,
		MaxBodyBytes:      cfg.MaxBodyBytes,
		WriteStallTimeout: cfg.WriteStallTimeout,
	}, rt, keys, m, log)
	defer api.Close()
	m.RegisterRuntimeUp(func() bool {
		rctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		return api.healthy(rctx) == nil
	})

	var certs *CertReloader
	if cfg.TLSCert != "" {
		// Loaded before listening, so a bad certificate fails the start.
		if certs, err = NewCertReloader(cfg.TLSCert, cfg.TLSKey, log); err != nil {
			return fmt.Errorf("config tls-cert: %w", err)
		}
		go certs.Run(bg, 0)
	}
	// A listener passed by systemd (hearthd.socket) when there is one.
	socks, err := systemd.PassedSockets()
	if err != nil {
		return fmt.Errorf("socket activation: %w", err)
	}
	ln, activated, err := socks.Listen("api", cfg.Listen)
	socks.Close()
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	ln = newRetryListener(ln, log)
	checkFileLimit(cfg, log)
	probeAddr := systemd.LoopbackAddr(ln.Addr())
	scheme := "http"
	if certs != nil {
		ln, scheme = tls.NewListener(ln, certs.TLSConfig()), "https"
	}
	srv := api.Server(cfg.ReadTimeout, cfg.IdleTimeout)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("deployment API listening", "addr", ln.Addr().String(), "model", cfg.Model, "socket_activated", activated)
	go func() {
		if err := systemd.Watchdog(bg, n, systemd.HTTPProbe(scheme+"://"+probeAddr+"/healthz"), log); err != nil {
			log.Error("watchdog stopped", "err", err)
		}
	}()

	// Host enforcement: from the control plane, or a local file (standalone).
	var enforced func() bool
	if cfg.ControlURL != "" || cfg.DesiredStateFile != "" {
		fw, runFW, sshKeys, err := enforcers(ctx, cfg, log)
		if err != nil {
			return err
		}
		registerEnforcementMetrics(m, fw, sshKeys)
		go func() {
			if err := runFW(bg); err != nil {
				log.Error("firewall drift repair stopped", "err", err)
			}
		}()
		var run func(context.Context) error
		if cfg.ControlURL != "" {
			agent := nodeAgent(cfg, fw, sshKeys, api.healthy, log)
			m.RegisterControlSync(agent.LastSync)
			run, enforced = agent.Run, func() bool { return agentEnforced(agent) }
		} else {
			sa := NewStandaloneAgent(cfg.DesiredStateFile, fw, sshKeys, log)
			run, enforced = sa.Run, func() bool {
				st := sa.Status()
				return st.SHA256 != "" && st.FirewallError == "" && st.SSHKeysError == ""
			}
		}
		enfDone := make(chan struct{})
		go func() {
			defer close(enfDone)
			if err := run(bg); err != nil {
				log.Error("enforcement stopped", "err", err)
			}
		}()
		defer func() { stopBG(); <-enfDone }()
	}

	status("loading model " + cfg.Model)
	warmErr := make(chan error, 1)
	go func() { warmErr <- warmUp(ctx, rt, cfg, m, log) }()

	go watchRuntime(bg, rt, rewarm)
	warmCh := warmErr
	ready := false
	for {
		select {
		case err := <-warmCh:
			warmCh = nil
			if err != nil {
				log.Error("model did not load", "err", err)
				continue
			}
			if ready {
				status("serving " + cfg.Model)
				log.Info("model loaded again", "model", cfg.Model)
				continue
			}
			ready = true
			api.SetWarm(true)
			if enforced != nil {
				status("applying firewall rules and SSH keys")
				waitEnforced(ctx, enforced, 30*time.Second, log)
			}
			if err := n.Ready(); err != nil {
				log.Warn("sd_notify READY", "err", err)
			}
			status("serving " + cfg.Model)
			log.Info("ready", "model", cfg.Model, "url", scheme+"://"+ln.Addr().String()+apiPrefix)
			continue
		case <-rewarm:
			if warmCh == nil && ready {
				status("reloading model " + cfg.Model)
				ch := make(chan error, 1)
				go func() { ch <- warmUp(ctx, rt, cfg, m, log) }()
				warmCh = ch
			}
			continue
		case err := <-serveErr:
			return fmt.Errorf("deployment API stopped: %w", err)
		case <-ctx.Done():
		}
		break
	}

	_ = n.Stopping()
	status("draining in-flight requests")
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout)
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	shutdownDone := make(chan error, 1)
	go func() {
		sctx, c := context.WithTimeout(context.Background(), cfg.ShutdownTimeout+5*time.Second)
		defer c()
		shutdownDone <- srv.ShutdownWithContext(sctx)
	}()
	if err := api.Drain(drainCtx); err != nil {
		log.Warn("drain timed out: ended remaining generations", "err", err)
	}
	if err := <-shutdownDone; err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("listener shutdown", "err", err)
	}
	return nil
}

// warmUp makes sure the model exists and is loaded, retrying with backoff
// while the runtime is unreachable (it may still be starting).
func warmUp(ctx context.Context, rt *ollama.Backend, cfg Config, m *metrics.Node, log *slog.Logger) error {
	src := ollama.ModelSource{GGUFPath: cfg.ModelGGUF, Parameters: cfg.ModelParams}
	if cfg.ModelTemplate != "" {
		b, err := os.ReadFile(cfg.ModelTemplate)
		if err != nil {
			return fmt.Errorf("config model-template: %w", err)
		}
		src.Template = string(b)
	}
	backoff := 250 * time.Millisecond
	for {
		err := rt.EnsureModel(ctx, src)
		if err == nil {
			var took time.Duration
			took, err = rt.Warm(ctx)
			if err == nil {
				m.SetModelLoadDuration(took)
				log.Info("model loaded", "model", cfg.Model, "seconds", took.Seconds())
				return nil
			}
		}
		log.Warn("model not ready yet; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func supervisor(cfg Config, log *slog.Logger) (*ollama.Supervisor, error) {
	addr, err := hostPort(cfg.OllamaURL)
	if err != nil {
		return nil, err
	}
	dir := cfg.OllamaModelsDir
	if dir == "" {
		dir = filepath.Join(cfg.StateDir, "models")
	}
	return &ollama.Supervisor{Bin: cfg.OllamaBin, Addr: addr, ModelsDir: dir, Logger: log}, nil
}

// metricsMux serves /metrics and, on the same private listener, the Go
// profiler: the listener is loopback by default and never the public port.
func metricsMux(m *metrics.Node) *http.ServeMux {
	mux := metrics.Mux(m.Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// watchRuntime asks for a re-warm whenever the runtime stops reporting the
// model loaded (restarted outside hearthd, or the model evicted), checking
// every few seconds.
func watchRuntime(ctx context.Context, rt runtime.Runtime, rewarm chan<- struct{}) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := rt.Ready(rctx)
		cancel()
		if err != nil {
			select {
			case rewarm <- struct{}{}:
			default:
			}
		}
	}
}

// waitEnforced holds READY=1 until the desired state has been applied once,
// or until timeout: a control plane that is away at first boot must not keep
// the deployment down.
func waitEnforced(ctx context.Context, enforced func() bool, timeout time.Duration, log *slog.Logger) {
	deadline := time.Now().Add(timeout)
	for !enforced() {
		if time.Now().After(deadline) {
			log.Warn("desired state not applied yet; reporting ready anyway", "waited", timeout)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// agentEnforced reports whether the node agent has applied its desired
// state (firewall and keys) at least once.
func agentEnforced(a *NodeAgent) bool {
	d, ok := a.Desired()
	if !ok {
		return false
	}
	o := a.Observed()
	return o.FirewallRevision >= d.Revision && o.SSHKeysRevision >= d.Revision && o.FirewallError == "" && o.SSHKeysError == ""
}
