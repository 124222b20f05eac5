package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
)

// WaitOptions says how WaitServerRunning and WaitServerGone poll.
type WaitOptions struct {
	// Interval is the pause between polls (default 1 s).
	Interval time.Duration
	// Progress, if set, is called with the server after every poll.
	Progress func(Server)
}

func (o WaitOptions) interval() time.Duration {
	if o.Interval <= 0 {
		return time.Second
	}
	return o.Interval
}

// WaitServerRunning polls a server until it is running and returns it.
// It ends early with the last server seen and an error wrapping
// ErrServerFailed if the server turns failed, or ErrServerDeleting if it
// is being deleted; with an APIError if the API refuses (a server that is
// gone is a 404); and with the context's error when ctx ends. A server
// that is unreachable, provisioning or updating is waited for.
func (c *Client) WaitServerRunning(ctx context.Context, id string, o WaitOptions) (Server, error) {
	for {
		srv, err := c.GetServer(ctx, id)
		if err != nil {
			return srv, err
		}
		if o.Progress != nil {
			o.Progress(srv)
		}
		switch srv.Status {
		case StatusRunning:
			return srv, nil
		case StatusFailed:
			return srv, fmt.Errorf("server %s: %w: %s", srv.ID, ErrServerFailed, Diagnose(srv))
		case StatusDeleting:
			return srv, fmt.Errorf("server %s: %w", srv.ID, ErrServerDeleting)
		}
		if err := backoff.Sleep(ctx, o.interval()); err != nil {
			return srv, err
		}
	}
}

// WaitServerGone polls a deleted server until the API no longer knows it
// (its node reported the wipe, or the control plane's delete timeout
// passed). It ends with the context's error when ctx ends.
func (c *Client) WaitServerGone(ctx context.Context, id string, o WaitOptions) error {
	for {
		srv, err := c.GetServer(ctx, id)
		if IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if o.Progress != nil {
			o.Progress(srv)
		}
		if err := backoff.Sleep(ctx, o.interval()); err != nil {
			return err
		}
	}
}

// WaitActionOptions says how WaitAction polls.
type WaitActionOptions struct {
	// Interval is the pause between polls (default 1 s).
	Interval time.Duration
	// Progress, if set, is called with the action after every poll.
	Progress func(ServerAction)
}

// WaitAction polls an action until it is no longer running and returns it:
// with an error wrapping ErrActionFailed if it ended in error, with an
// APIError if the API refuses, and with the context's error when ctx ends.
func (c *Client) WaitAction(ctx context.Context, id string, o WaitActionOptions) (ServerAction, error) {
	every := WaitOptions{Interval: o.Interval}.interval()
	for {
		a, err := c.GetAction(ctx, id)
		if err != nil {
			return a, err
		}
		if o.Progress != nil {
			o.Progress(a)
		}
		switch a.Status {
		case ActionStatusSuccess:
			return a, nil
		case ActionStatusError:
			msg := ""
			if a.Error != nil {
				msg = a.Error.Code + ": " + a.Error.Message
			}
			return a, fmt.Errorf("action %s (%s): %w: %s", a.ID, a.Command, ErrActionFailed, msg)
		}
		if err := backoff.Sleep(ctx, every); err != nil {
			return a, err
		}
	}
}

// Diagnose says in a few words why a server is not (yet) running, from its
// enforcement: what is pending, what failed and why, and a model pull's
// progress. It is "" when the node reported everything applied.
func Diagnose(s Server) string {
	e := s.Enforcement
	if e.ReportedAt == nil {
		return "no report from the node yet"
	}
	var parts []string
	for _, c := range []struct {
		name string
		c    EnforcementConcern
	}{{"firewall", e.Firewall}, {"ssh keys", e.SSHKeys}, {"api keys", e.APIKeys}} {
		switch c.c.Status {
		case EnforcementFailed:
			parts = append(parts, c.name+" failed: "+deref(c.c.Error))
		case EnforcementPending:
			parts = append(parts, c.name+" pending")
		}
	}
	rt := e.Runtime
	switch {
	case rt.Status == EnforcementFailed:
		parts = append(parts, "runtime failed: "+deref(rt.Error))
	case rt.Progress != nil && rt.Progress.Total > 0:
		parts = append(parts, fmt.Sprintf("model %s %d%%", rt.Progress.Status, rt.Progress.Completed*100/rt.Progress.Total))
	case rt.Progress != nil:
		parts = append(parts, "model "+rt.Progress.Status)
	case rt.Status == EnforcementPending && !rt.Healthy:
		parts = append(parts, "runtime unhealthy")
	case rt.Status == EnforcementPending:
		parts = append(parts, "model pending")
	}
	return strings.Join(parts, ", ")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
