package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

// waitFlags are --wait and its companions on create, update and delete.
type waitFlags struct {
	wait     bool
	timeout  time.Duration
	interval time.Duration
}

func (w *waitFlags) add(cmd *cobra.Command, until string) {
	cmd.Flags().BoolVar(&w.wait, "wait", false, "wait until the server is "+until+", showing progress on stderr")
	cmd.Flags().DurationVar(&w.timeout, "wait-timeout", 0, "with --wait: give up after this long (exit code 8); 0 waits as long as it takes")
	cmd.Flags().DurationVar(&w.interval, "poll-interval", time.Second, "with --wait: time between checks")
	must(cmd.Flags().MarkHidden("poll-interval"))
}

// context returns the context a wait runs in: ended by --wait-timeout,
// with errWaitTimeout as its cause.
func (w waitFlags) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if w.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, w.timeout, errWaitTimeout)
}

// waitErr turns the end of a wait's context into the error that says why.
func waitErr(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errWaitTimeout) {
		return fmt.Errorf("%w: the server is still changing; `hearth server get` shows how far it got", errWaitTimeout)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopped waiting (the server keeps changing): %w", err)
	}
	return err
}

// waitRunning waits for a server to run, with a progress line on stderr
// that shows the action the change started (act, if any) too.
func (a *app) waitRunning(ctx context.Context, c *client.Client, w waitFlags, id string, act *client.ServerAction) (client.Server, error) {
	ctx, cancel := w.context(ctx)
	defer cancel()
	p := a.progress()
	if act != nil {
		p.action = func() string {
			cur, err := c.GetAction(ctx, act.ID)
			if err != nil {
				return ""
			}
			return fmt.Sprintf("%s %s %s %d%%", cur.Command, cur.ID, cur.Status, cur.Progress)
		}
	}
	srv, err := c.WaitServerRunning(ctx, id, client.WaitOptions{Interval: w.interval, Progress: p.update})
	p.done()
	return srv, waitErr(ctx, err)
}

// waitGone waits for a deleted server to be gone.
func (a *app) waitGone(ctx context.Context, c *client.Client, w waitFlags, id string) error {
	ctx, cancel := w.context(ctx)
	defer cancel()
	p := a.progress()
	err := c.WaitServerGone(ctx, id, client.WaitOptions{Interval: w.interval, Progress: p.update})
	p.done()
	return waitErr(ctx, err)
}

// progress shows a wait's progress on stderr: on a terminal one line
// redrawn in place with the time waited; otherwise a line whenever the
// status or what the server waits for changes.
type progress struct {
	w     io.Writer
	tty   bool
	now   func() time.Time
	start time.Time
	last  string
	// action, if set, says where the change's action is.
	action func() string
}

func (a *app) progress() *progress {
	return &progress{w: a.err, tty: a.errTTY, now: a.now, start: a.now()}
}

func (p *progress) update(s client.Server) {
	line := fmt.Sprintf("%s (%s): %s", s.ID, s.Name, s.Status)
	switch s.Status {
	case client.StatusRunning:
	case client.StatusDeleting:
		line += ", waiting for the node to wipe it"
	default:
		if d := client.Diagnose(s); d != "" {
			line += ", " + d
		}
	}
	if p.action != nil {
		if act := p.action(); act != "" {
			line += " [" + act + "]"
		}
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s [%s]", line, p.now().Sub(p.start).Round(time.Second))
		p.last = line
		return
	}
	if line != p.last {
		fmt.Fprintln(p.w, line)
		p.last = line
	}
}

// done ends the redrawn line.
func (p *progress) done() {
	if p.tty && p.last != "" {
		fmt.Fprintln(p.w)
	}
}
