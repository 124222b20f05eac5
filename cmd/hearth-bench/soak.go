package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hearthd/hearth/bench/soak"
)

// runSoak runs the soak and writes its report (Markdown on stdout, JSON
// beside it if asked); it fails when a target is missed.
func runSoak(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	hearthd := fs.String("hearthd", "", "hearthd binary (default: built from ./cmd/hearthd)")
	ollamaBin := fs.String("ollama", "", "ollama binary (default: as internal/ollamatest finds it)")
	duration := fs.Duration("duration", 10*time.Minute, "how long the load runs")
	warmup := fs.Duration("warmup", 30*time.Second, "the same load before the start sample, not counted")
	streams := fs.Int("streams", 16, "closed-loop streamed chats (32 tokens each) beside the other clients")
	out := fs.String("out", "", "file for the JSON report (default: none)")
	hearthdLog := fs.String("hearthd-log", "", "file for a copy of hearthd's and Ollama's output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	work, logw, cleanup, err := hearthdSetup(ctx, log, "hearth-soak-", hearthd, *hearthdLog)
	if err != nil {
		return err
	}
	defer cleanup()
	log.Info("soak", "duration", *duration, "streams", *streams)
	res, err := soak.RunSoak(ctx, soak.SoakOptions{HearthdBin: *hearthd, OllamaBin: *ollamaBin, WorkDir: work,
		Duration: *duration, Warmup: *warmup, Streams: *streams, Log: logw})
	if err != nil {
		return err
	}
	fmt.Print(res.Markdown())
	if *out != "" {
		data, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode report: %w", err)
		}
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	for _, t := range res.Met() {
		if !t.Met {
			return errors.New("soak: a target was missed (see the table)")
		}
	}
	return nil
}
