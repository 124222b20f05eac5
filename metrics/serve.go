package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Serve listens on addr and serves h (normally Node.Handler or
// Control.Handler) until ctx is cancelled, then shuts the server down
// gracefully. It returns nil after a clean shutdown.
func Serve(ctx context.Context, addr string, h http.Handler, logger *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return ServeListener(ctx, ln, h, logger)
}

// ServeListener is Serve on a listener the caller opened (for socket
// activation or a test's free port). It closes ln.
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger) error {
	return ServeMux(ctx, ln, Mux(h), logger)
}

// Mux routes GET /metrics to h and serves a small index page at /. Callers
// may add private routes (hearthd adds /debug/pprof/) before ServeMux.
func Mux(h http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<html><head><title>hearth metrics</title></head><body><a href="/metrics">Metrics</a></body></html>`)
	})
	return mux
}

// ServeMux serves mux on ln until ctx is cancelled, then shuts down
// gracefully. It closes ln.
func ServeMux(ctx context.Context, ln net.Listener, mux *http.ServeMux, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// A scrape gathers in well under a second; the bound only stops a
		// stuck client from holding a connection forever.
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:  func(net.Listener) context.Context { return ctx },
	}
	logger.Info("serving metrics", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("metrics: shut down %s: %w", ln.Addr(), err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	}
	return nil
}
