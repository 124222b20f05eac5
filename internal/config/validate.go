package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// Problems collects what a config struct's Validate finds, each problem
// naming its setting by flag, as "config max-concurrent: must be at least
// 1, got 0".
type Problems []error

// Add records a problem with the setting named by flag.
func (p *Problems) Add(flag, format string, args ...any) {
	*p = append(*p, fmt.Errorf("config %s: %s", flag, fmt.Sprintf(format, args...)))
}

// HostPort checks that addr is host:port, and reports whether it is.
func (p *Problems) HostPort(flag, addr string) bool {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		p.Add(flag, "%q is not host:port: %v", addr, err)
		return false
	}
	return true
}

// LogLevel checks a log level setting (see LogLevel).
func (p *Problems) LogLevel(flag, level string) {
	if _, err := LogLevel(level); err != nil {
		p.Add(flag, "%v", err)
	}
}

// Err joins the problems; nil when there are none.
func (p Problems) Err() error { return errors.Join(p...) }

// LogLevel parses a log_level setting: debug, info, warn or error, in any
// case. (slog.Level's own parser also takes offsets such as "info+2",
// which no operator means.)
func LogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
}

// LoopbackHost reports whether host only ever means this machine: a
// loopback address or "localhost". An empty host (every address) or any
// other name may reach the network. Both daemons serve plain HTTP only
// there, and a node sends its credential over plain HTTP only there.
func LoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
