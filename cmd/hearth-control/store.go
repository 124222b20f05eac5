package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/pgstore"
)

// openStore opens the state the settings name: the PostgreSQL database of
// database_url, or else the embedded Pebble database in state_dir. A
// database that cannot be reached is an error, never a fall back to Pebble.
func openStore(ctx context.Context, cfg settings, logger *slog.Logger) (store.KV, error) {
	if cfg.DatabaseURL == "" {
		st, err := store.Open(filepath.Join(cfg.StateDir, "db"), store.Options{})
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	st, err := pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Options{Logger: logger, KeepOpen: true})
	if err != nil {
		return nil, fmt.Errorf("database_url: %w", err)
	}
	return st, nil
}
