// Package daemon is the node: it wires the concerns (state, API keys, the
// model runtime, the deployment API, the agents that enforce the desired
// state) into hearthd and runs them in order — built one after the other,
// run as one group, stopped phase by phase (lifecycle.go).
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
	"path/filepath"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/deployapi"
	"github.com/hearthd/hearth/internal/adminsock"
	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/internal/certreload"
	"github.com/hearthd/hearth/internal/connlimit"
	"github.com/hearthd/hearth/internal/sealbox"
	"github.com/hearthd/hearth/internal/statedir"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/ollama"
	"github.com/hearthd/hearth/llm/ollama/serve"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/systemd"
)

// Run serves until ctx ends, then drains and stops. Start-up order: state,
// API keys and the admin socket; the runtime (started and supervised if
// configured); the deployment API listener, which answers /healthz at once
// and 503 until the model is present and loaded; then ready. The model
// served is the runtime concern's (agent.Runtime): --model, or the one the
// control plane orders.
//
// cfg must have passed Config.Validate: configuration is checked once,
// where it is loaded (cmd/hearthd, before the logger it configures
// exists), as hearth-control does, and not again here.
func Run(ctx context.Context, cfg Config, version string, log *slog.Logger) error {
	return RunWith(ctx, cfg, version, log, systemd.SdNotifier{})
}

// RunWith is Run reporting to systemd through n: STATUS= lines as start-up
// proceeds, READY=1 once state is loaded, rules applied and the model warm,
// watchdog pings while the API answers, STOPPING=1 on shutdown.
func RunWith(ctx context.Context, cfg Config, version string, log *slog.Logger, n systemd.Notifier) error {
	return runNode(ctx, cfg, version, log, n, options{})
}

// options are the seams the package's tests use; the zero value is hearthd.
type options struct {
	// runtime replaces the Ollama backend.
	runtime func(Config, *slog.Logger) (modelRuntime, error)
	// extra adds components to the group; they get the built node.
	extra []func(*node) component
	// watchEvery is how often the runtime is checked for a lost model
	// (default 3 s).
	watchEvery time.Duration
	// restartRuntime replaces the supervisor's Restart: the runtime is
	// restarted when found wedged, as a supervised one is.
	restartRuntime func(ctx context.Context, reason string) error
}

// node is one hearthd: what start-up built, in start-up order, and the
// components that run it.
type node struct {
	cfg     Config
	version string
	log     *slog.Logger
	notify  systemd.Notifier
	opts    options

	st   *store.Store
	keys *apikeys.Keyring
	// seal is the node's sealing key (encrypted reasoning items); the
	// wipe replaces it.
	seal *sealbox.Box
	m    *metrics.Node
	rt   modelRuntime // the runtime of --model; ForModel gives the others
	// restartRuntime restarts a supervised runtime (--ollama-start) found
	// wedged; wedged carries why to recoverRuntime, which calls it.
	restartRuntime func(ctx context.Context, reason string) error
	wedged         chan string
	// restarts is the runtime's restarts as the node reports them; agent
	// is the node agent (nil without a control plane), told at once when
	// they change.
	restarts runtimeRestarts
	agent    *agent.Node
	api      *deployapi.API
	srv      *fasthttp.Server
	ln       net.Listener
	url      string // the deployment API's base URL, for the log
	enf      *agent.Enforcer

	// runtime converges the model served (models does the work); a
	// restarted runtime starts empty, so it is told when the model is lost.
	runtime       *agent.Runtime
	models        *modelServer
	modelTemplate string // --model-template's content

	group   group
	closers []func() // what start-up opened, closed once the group is done
}

// runNode builds the node, runs it until ctx ends, then stops every component
// and only then closes the key ring and the store.
func runNode(ctx context.Context, cfg Config, version string, log *slog.Logger, n systemd.Notifier, opts options) error {
	nd := &node{cfg: cfg, version: version, log: log, notify: n, opts: opts, group: group{log: log}}
	defer nd.close()
	if err := nd.setup(ctx); err != nil {
		return err
	}
	return nd.group.run(ctx)
}

// setup builds every part in start-up order and adds its components to the
// group; nothing runs before all of it succeeded.
func (nd *node) setup(ctx context.Context) error {
	nd.status("loading state")
	if err := nd.openState(); err != nil {
		return err
	}
	nd.m = metrics.NewNode(nd.version)
	if err := nd.openMetrics(); err != nil {
		return err
	}
	if err := nd.openRuntime(); err != nil {
		return err
	}
	if err := nd.openAPI(); err != nil {
		return err
	}
	if err := nd.openModels(); err != nil {
		return err
	}
	if nd.cfg.ControlURL != "" || nd.cfg.DesiredStateFile != "" {
		if err := nd.openEnforcement(ctx); err != nil {
			return err
		}
	}
	nd.group.add(component{name: "readiness", phase: phaseFront, run: nd.readiness})
	nd.group.add(component{name: "runtime watch", phase: phaseFront, run: nd.watchRuntime})
	for _, extra := range nd.opts.extra {
		nd.group.add(extra(nd))
	}
	return nil
}

// onClose registers f to run when the node is done, after the group.
func (nd *node) onClose(f func()) { nd.closers = append(nd.closers, f) }

func (nd *node) close() {
	for i := len(nd.closers) - 1; i >= 0; i-- {
		nd.closers[i]()
	}
}

func (nd *node) status(s string) {
	if err := nd.notify.Status(s); err != nil {
		nd.log.Debug("sd_notify", "err", err)
	}
}

// openState opens the store, the API key ring and the admin socket.
func (nd *node) openState() error {
	cfg, log := nd.cfg, nd.log
	if tightened, err := statedir.Ensure(cfg.StateDir); err != nil {
		return err
	} else if tightened {
		log.Warn("state dir was open to other users: tightened to 0700", "dir", cfg.StateDir)
	}
	st, err := store.Open(filepath.Join(cfg.StateDir, "db"), store.Options{})
	if err != nil {
		return err
	}
	nd.st = st
	nd.onClose(func() {
		if err := st.Close(); err != nil {
			log.Error("close state", "err", err)
		}
	})
	if nd.seal, err = sealbox.Load(st); err != nil {
		return err
	}
	keys, err := apikeys.Open(st, log)
	if err != nil {
		return fmt.Errorf("load API keys: %w", err)
	}
	nd.keys = keys
	nd.onClose(func() {
		if err := keys.Close(); err != nil {
			log.Error("flush API key usage", "err", err)
		}
	})
	nd.group.add(component{name: "API key usage", phase: phaseBack,
		run: func(ctx context.Context) error { return keys.Run(ctx, 10*time.Second) }})

	adminLn, err := adminsock.Listen(cfg.AdminSocketPath())
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	nd.onClose(func() { _ = adminLn.Close() })
	nd.group.add(component{name: "admin socket", phase: phaseBack,
		run: func(ctx context.Context) error { return apikeys.ServeAdmin(ctx, adminLn, keys, log) }})
	return nil
}

// openMetrics opens the private metrics listener, with the profiler.
func (nd *node) openMetrics() error {
	if nd.cfg.MetricsListen == "" {
		return nil
	}
	mln, err := net.Listen("tcp", nd.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("config metrics-listen: %w", err)
	}
	nd.onClose(func() { _ = mln.Close() })
	mux := metricsMux(nd.m)
	nd.group.add(component{name: "metrics listener", phase: phaseBack,
		run: func(ctx context.Context) error { return metrics.ServeMux(ctx, mln, mux, nd.log) }})
	nd.log.Info("metrics listening", "addr", mln.Addr().String())
	return nil
}

// modelRuntime is what the node needs of the runtime for one model: the
// API streams from it; the model server makes sure the model is there,
// loads it, and unloads the one it replaces.
type modelRuntime interface {
	llm.Runtime
	EnsureModel(ctx context.Context, src ollama.ModelSource) error
	Warm(ctx context.Context) (time.Duration, error)
	Unload(ctx context.Context) error
	// ForModel is the runtime of another model, on the same runtime.
	ForModel(model string) modelRuntime
}

// openModels builds the runtime concern: it serves --model until a desired
// state orders another.
func (nd *node) openModels() error {
	tmpl, err := readModelTemplate(nd.cfg)
	if err != nil {
		return err
	}
	nd.modelTemplate = tmpl
	nd.models = &modelServer{nd: nd, first: make(chan struct{})}
	nd.runtime = agent.NewRuntime(nd.models, agent.RuntimeConfig{Default: nd.cfg.Model,
		Backoff: backoff.Backoff{Min: 250 * time.Millisecond, Max: 10 * time.Second}}, nd.log)
	nd.group.add(component{name: "model", phase: phaseFront, run: nd.runtime.Run})
	return nil
}

// openRuntime builds the runtime client and, if configured, the supervisor
// of `ollama serve`, which stops last.
func (nd *node) openRuntime() error {
	cfg := nd.cfg
	if cfg.OllamaStart {
		sup, err := supervisor(cfg, nd.log)
		if err != nil {
			return err
		}
		sup.OnExit = func(err error) {
			nd.m.RuntimeRestarted(metrics.RestartExited)
			nd.log.Warn("model runtime exited; restarting", "err", err)
			nd.restarting("exited: " + err.Error())
			if nd.runtime != nil {
				nd.runtime.Lost()
			}
		}
		// Critical: the supervisor returns only when ollama cannot be run
		// at all (its port taken by another program, the binary gone), and
		// a node without its runtime would stay up never ready and serve
		// nothing. Stopped, hearthd exits with the reason and systemd
		// restarts it.
		nd.group.add(component{name: "model runtime", phase: phaseRuntime, run: sup.Run, critical: true})
		nd.restartRuntime = sup.Restart
	}
	if nd.opts.restartRuntime != nil {
		nd.restartRuntime = nd.opts.restartRuntime
	}
	if nd.restartRuntime != nil {
		nd.wedged = make(chan string, 1)
		nd.group.add(component{name: "runtime recovery", phase: phaseFront, run: nd.recoverRuntime})
	}
	newRuntime := nd.opts.runtime
	if newRuntime == nil {
		newRuntime = nd.ollamaRuntime
	}
	rt, err := newRuntime(cfg, nd.log)
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	nd.rt = rt
	if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
		nd.onClose(c.CloseIdleConnections)
	}
	return nil
}

func (nd *node) ollamaRuntime(cfg Config, log *slog.Logger) (modelRuntime, error) {
	b, err := ollama.New(ollama.Config{
		BaseURL:          cfg.OllamaURL,
		Model:            cfg.Model,
		FirstByteTimeout: cfg.RuntimeTimeout,
		WedgeTimeout:     cfg.WedgeTimeout,
		MaxConns:         cfg.MaxConcurrent + cfg.MaxQueue,
		Logger:           log,
		OnWedged:         nd.runtimeWedged,
	})
	if err != nil {
		return nil, err
	}
	return backend{b}, nil
}

// backend is the Ollama backend as a modelRuntime.
type backend struct{ *ollama.Backend }

func (b backend) ForModel(model string) modelRuntime { return backend{b.WithModel(model)} }

func supervisor(cfg Config, log *slog.Logger) (*serve.Supervisor, error) {
	addr, err := hostPort(cfg.OllamaURL)
	if err != nil {
		return nil, err
	}
	dir := cfg.OllamaModelsDir
	if dir == "" {
		dir = filepath.Join(cfg.StateDir, "models")
	}
	// One slot more than hearthd sends generations to: the wedge probe's
	// (ollama.watch), so that a runtime busy on every slot still answers it.
	return &serve.Supervisor{Bin: cfg.OllamaBin, Addr: addr, ModelsDir: dir, NumParallel: cfg.MaxConcurrent + 1, Logger: log}, nil
}

// openAPI builds the deployment API and its listener (passed by systemd
// when socket-activated), with TLS if configured, and the watchdog that
// probes it.
func (nd *node) openAPI() error {
	cfg := nd.cfg
	cors, err := cfg.corsPolicy() // checked by Validate
	if err != nil {
		return err
	}
	nd.api = deployapi.NewAPI(deployapi.APIConfig{
		Model:               cfg.Model,
		Version:             nd.version,
		MaxConcurrent:       cfg.MaxConcurrent,
		MaxConcurrentPerKey: cfg.MaxConcurrentPerKey,
		MaxQueue:            cfg.MaxQueue,
		MaxBodyBytes:        cfg.MaxBodyBytes,
		MaxOutputTokens:     cfg.MaxOutputTokens,
		NoReasoning:         !cfg.Reasoning,
		WriteStallTimeout:   cfg.WriteStallTimeout,
		Sealer:              nd.seal,
		CORS:                cors,
	}, nd.rt, nd.keys, nd.m, nd.log)
	nd.onClose(nd.api.Close)
	nd.m.RegisterRuntimeUp(func() bool {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return nd.api.Healthy(rctx) == nil
	})
	nd.m.RegisterRuntimeHealth(nd.runtimeHealth)

	var certs *certreload.Reloader
	if cfg.TLSCert != "" {
		// Loaded before listening, so a bad certificate fails the start.
		var err error
		if certs, err = certreload.New(cfg.TLSCert, cfg.TLSKey, nd.log); err != nil {
			return fmt.Errorf("config tls-cert: %w", err)
		}
		nd.group.add(component{name: "certificate reload", phase: phaseBack,
			run: func(ctx context.Context) error { certs.Run(ctx, 0); return nil }})
	}
	socks, err := systemd.PassedSockets()
	if err != nil {
		return fmt.Errorf("socket activation: %w", err)
	}
	ln, activated, err := socks.Listen("api", cfg.Listen)
	socks.Close()
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	nd.onClose(func() { _ = ln.Close() })
	ln = deployapi.NewRetryListener(ln, nd.log)
	// No one address may take every descriptor with idle connections.
	ln = connlimit.New(ln, 0, cfg.MaxConnsPerSource)
	deployapi.CheckFileLimit(cfg.MaxConcurrent, cfg.MaxQueue, nd.log)
	probeAddr := systemd.LoopbackAddr(ln.Addr())
	scheme := "http"
	if certs != nil {
		ln, scheme = tls.NewListener(ln, deployapi.TLSConfig(certs)), "https"
	}
	nd.ln, nd.srv = deployapi.Listener(ln), nd.api.Server(cfg.ReadTimeout, cfg.IdleTimeout)
	nd.url = scheme + "://" + ln.Addr().String() + deployapi.APIPrefix
	nd.group.add(component{name: "deployment API", phase: phaseFront, critical: true, run: func(ctx context.Context) error {
		nd.log.Info("deployment API listening", "addr", ln.Addr().String(), "model", nd.api.Model(), "socket_activated", activated)
		return nd.serveAPI(ctx)
	}})

	probe := systemd.HTTPProbe(scheme + "://" + probeAddr + "/healthz")
	nd.group.add(component{name: "watchdog", phase: phaseBack,
		run: func(ctx context.Context) error { return systemd.Watchdog(ctx, nd.notify, probe, nd.log) }})
	return nil
}

// serveAPI serves the deployment API until ctx ends, then drains it: new
// requests get 503 and in-flight streams have the shutdown timeout to end.
func (nd *node) serveAPI(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- nd.srv.Serve(nd.ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("deployment API stopped: %w", err)
	case <-ctx.Done():
	}
	_ = nd.notify.Stopping()
	nd.status("draining in-flight requests")
	nd.log.Info("shutting down: draining in-flight requests", "timeout", nd.cfg.ShutdownTimeout)
	nd.api.Shutdown(nd.srv, nd.cfg.ShutdownTimeout)
	// fasthttp's Shutdown closes the listeners Serve has taken so far: a
	// stop that came before Serve took this one (a node stopping as it
	// starts) left Serve accepting for ever.
	_ = nd.ln.Close()
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		nd.log.Warn("deployment API listener", "err", err)
	}
	return nil
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
