// Package console is hearth's web console: server-rendered pages, served by
// hearth-control under /console/, through which a customer signs in with a
// project token and manages servers, SSH keys, firewall rules and the
// deployment's API keys, and chats with the model in a playground.
//
// The console acts only through the management API, with the user's token
// held server-side in the session (never in the browser), so the API's
// authorisation, project isolation, validation and rate limits apply to
// every action as they do to the CLI. The playground's browser calls the
// deployment API directly; that API must allow the console's origin.
package console

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Identity is a management API token's project and scope.
type Identity struct {
	Project     string
	ProjectName string
	ReadOnly    bool
}

// ErrInvalidToken is what Config.Identify returns for a token the API
// refuses.
var ErrInvalidToken = errors.New("invalid token")

// Config configures a Console.
type Config struct {
	// API is the management API's handler (/v1): the console's client
	// sends its requests through it in process, as any client's would
	// arrive, with the session's token.
	API http.Handler
	// Identify tells a token's project and scope, or ErrInvalidToken.
	Identify func(token string) (Identity, error)
	// IdleTimeout ends a session unused for this long (default 30
	// minutes); MaxAge ends any session this long after sign-in (default
	// 12 hours).
	IdleTimeout, MaxAge time.Duration
	// LinkTTL is how long a one-time sign-in link stays valid (default 10
	// minutes).
	LinkTTL time.Duration
	// MaxSessions bounds the sessions held at once (default 10 000); a
	// sign-in beyond it ends the oldest.
	MaxSessions int
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Console serves the web console.
type Console struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	sessions *sessions
	links    *links
}

// New builds a Console.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil || cfg.Identify == nil {
		return nil, errors.New("console: Config.API and Config.Identify are required")
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Minute
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 12 * time.Hour
	}
	if cfg.LinkTTL <= 0 {
		cfg.LinkTTL = 10 * time.Minute
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 10000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	return &Console{cfg: cfg, log: cfg.Logger, pages: pages,
		sessions: newSessions(cfg.IdleTimeout, cfg.MaxAge, cfg.MaxSessions, cfg.Now),
		links:    newLinks(cfg.LinkTTL, cfg.Now)}, nil
}

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("console: layout: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("console: %s: %w", n, err)
		}
		pages[n[len("templates/"):len(n)-len(".html")]] = t
	}
	return pages, nil
}
