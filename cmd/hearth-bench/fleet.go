package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/bench/fleet"
	"github.com/hearthd/hearth/systemd"
)

// parseVariants reads --backends: pebble, postgres (one replica) and
// postgres-N (N replicas on one database).
func parseVariants(s string) ([]fleet.FleetConfig, error) {
	var out []fleet.FleetConfig
	for _, v := range strings.Split(s, ",") {
		v = strings.TrimSpace(v)
		switch {
		case v == fleet.BackendPebble:
			out = append(out, fleet.FleetConfig{Backend: fleet.BackendPebble, Replicas: 1})
		case v == fleet.BackendPostgres:
			out = append(out, fleet.FleetConfig{Backend: fleet.BackendPostgres, Replicas: 1})
		case strings.HasPrefix(v, fleet.BackendPostgres+"-"):
			n, err := strconv.Atoi(strings.TrimPrefix(v, fleet.BackendPostgres+"-"))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--backends: %q: want postgres-N with N ≥ 1", v)
			}
			out = append(out, fleet.FleetConfig{Backend: fleet.BackendPostgres, Replicas: n})
		default:
			return nil, fmt.Errorf("--backends: unknown %q (pebble, postgres, postgres-N)", v)
		}
	}
	return out, nil
}

// fleetFlags are hearth-bench fleet's flags beside the FleetConfig ones.
type fleetFlags struct {
	out, profile, controlLog string
	variants                 []fleet.FleetConfig
}

func parseFleetFlags(args []string) (fleet.FleetConfig, fleetFlags, error) {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	var c fleet.FleetConfig
	var f fleetFlags
	backends := fs.String("backends", "pebble,postgres,postgres-2", "control plane variants: pebble, postgres (one replica), postgres-N (N replicas on one database)")
	fs.StringVar(&c.ControlBin, "control", "", "hearth-control binary (default: built from ./cmd/hearth-control)")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL superuser URL for the postgres variants; each run makes a fresh database on it (default: a private server, internal/pgtest)")
	fs.IntVar(&c.Nodes, "nodes", 10000, "simulated nodes (fewer if the open-file limit cannot hold them; the report says)")
	fs.IntVar(&c.Clients, "clients", 32, "concurrent management API clients")
	fs.IntVar(&c.EnrollConcurrency, "enroll-concurrency", 256, "enrolments in flight during the burst")
	fs.DurationVar(&c.CreateDuration, "create", 15*time.Second, "create phase (ends early after --max-creates servers)")
	fs.IntVar(&c.MaxCreates, "max-creates", 0, "servers the create phase makes at most (default: half the nodes)")
	fs.DurationVar(&c.ChurnDuration, "churn", 20*time.Second, "churn phase: creates, rule changes and deletes (1:2:1)")
	fs.DurationVar(&c.IdleDuration, "idle", 60*time.Second, "idle phase: the fleet connected, no API traffic (one report refresh, so every node posts once)")
	fs.DurationVar(&c.ReportDuration, "report-burst", 5*time.Second, "report burst phase")
	fs.IntVar(&c.ReportConcurrency, "report-concurrency", 64, "nodes reporting at once in the report burst")
	fs.DurationVar(&c.ReportInterval, "report-interval", 10*time.Second, "each node's periodic report of a changed state (the agent's default)")
	fs.DurationVar(&c.ReportRefresh, "report-refresh", 60*time.Second, "each node's periodic report of an unchanged state (the agent's default)")
	fs.DurationVar(&c.PollWait, "poll-wait", 30*time.Second, "each node's long-poll wait (the agent's default)")
	fs.DurationVar(&c.UsageDuration, "usage", 60*time.Second, "each usage phase: every node's key in use, reported with counters only, with minute buckets, with a bucket every report (0 skips them)")
	fs.IntVar(&c.QueryKeys, "query-keys", 1000, "API keys of the project whose usage is read back")
	fs.IntVar(&c.QueryDays, "query-days", 30, "days of usage that project is given, read back by day")
	scale := fs.Float64("scale", 1, "multiply the phase durations")
	fs.StringVar(&f.out, "out", "bench/results", "directory for the JSON and Markdown results")
	fs.StringVar(&f.profile, "profile", "", "directory for the control plane's CPU profiles per phase, heap and goroutines (builds hearth-control with a pprof listener)")
	fs.StringVar(&f.controlLog, "control-log", "", "file for the control plane's output (default: discarded)")
	fs.StringVar(&c.LatencyDir, "latency-log", "", "directory for each load phase's requests as CSV (operation, when answered, latency), to place the tail in time")
	controlArgs := fs.String("control-args", "", "extra space-separated `hearth-control serve` arguments")
	if err := fs.Parse(args); err != nil {
		return c, f, err
	}
	var err error
	if f.variants, err = parseVariants(*backends); err != nil {
		return c, f, err
	}
	for _, d := range []*time.Duration{&c.CreateDuration, &c.ChurnDuration, &c.IdleDuration, &c.ReportDuration, &c.UsageDuration} {
		*d = time.Duration(float64(*d) * *scale)
	}
	c.ControlArgs = strings.Fields(*controlArgs)
	c.ProfileDir = f.profile
	return c, f, nil
}

func runFleet(ctx context.Context, log *slog.Logger, args []string) error {
	c, f, err := parseFleetFlags(args)
	if err != nil {
		return err
	}
	c.Log = log
	// Every long-polling node holds a descriptor here and one in the
	// control plane, which inherits this limit.
	if c.NoFile, err = bench.RaiseNoFile(1 << 20); err != nil {
		log.Warn("open-file limit", "limit", c.NoFile, "err", err)
	}
	work, err := os.MkdirTemp("", "hearth-fleet-")
	if err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	defer os.RemoveAll(work)
	c.WorkDir = work
	for _, dir := range []string{f.profile, c.LatencyDir} {
		if dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("output dir: %w", err)
			}
		}
	}
	if c.ControlBin == "" || f.profile != "" {
		if c.ControlBin != "" {
			log.Warn("--profile builds hearth-control from the tree; --control is ignored")
		}
		log.Info("building hearth-control", "pprof", f.profile != "")
		if c.ControlBin, err = fleet.BuildControl(ctx, work, f.profile != ""); err != nil {
			return err
		}
	}
	if f.controlLog != "" {
		lf, err := os.Create(f.controlLog)
		if err != nil {
			return fmt.Errorf("control plane log: %w", err)
		}
		defer lf.Close()
		c.ControlLog = lf
	}
	rep := &fleet.FleetReport{Started: time.Now(), Machine: bench.ThisMachine(), Command: "hearth-bench fleet " + strings.Join(args, " ")}
	// The simulated fleet's own CPU competes with what it measures, and
	// this setting changes it by ~30 % (make bench-fleet sets it).
	rep.Notes = append(rep.Notes, fmt.Sprintf("the simulated fleet ran with GODEBUG=%q; the control plane with its unit's %q",
		os.Getenv("GODEBUG"), systemd.ControlEnvironment()))
	ran := 0
	for _, v := range f.variants {
		cfg := c
		cfg.Backend, cfg.Replicas = v.Backend, v.Replicas
		log.Info("fleet variant", "variant", cfg.Variant(), "nodes", cfg.Nodes)
		res, err := fleet.RunFleet(ctx, cfg)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			res.Error = err.Error()
			if errors.Is(err, fleet.ErrBackendUnsupported) {
				res.Error = fleet.ErrBackendUnsupported.Error()
			}
			log.Error("fleet variant failed", "variant", cfg.Variant(), "err", err)
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %v", cfg.Variant(), err))
		} else {
			ran++
		}
		rep.Results = append(rep.Results, res)
		if _, err := rep.Write(f.out); err != nil {
			return err
		}
	}
	path, err := rep.Write(f.out)
	if err != nil {
		return err
	}
	fmt.Print(rep.Markdown())
	log.Info("wrote results", "path", path)
	if ran == 0 {
		return errors.New("no fleet variant ran")
	}
	return nil
}
