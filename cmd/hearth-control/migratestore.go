package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/pgstore"
)

// migrateStore copies the embedded Pebble state into an empty PostgreSQL
// database: the way from a single control plane to replicas. The control
// plane must be stopped (Pebble's lock refuses a second process anyway).
// The copy is one transaction, so an interrupted run leaves the database
// empty and can simply be run again; afterwards every record is compared.
func migrateStore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := defaults()
	ld := loader(&cfg)
	fs := flag.NewFlagSet("migrate-store", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ld.AddFlags(fs, "state-dir", "database-url")
	if _, err := ld.Load(fs, args, os.Environ()); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("migrate-store: unexpected argument %q", fs.Arg(0))
	}
	if cfg.DatabaseURL == "" {
		return errors.New("migrate-store needs --database-url (the empty PostgreSQL database to copy into)")
	}
	src, err := store.Open(filepath.Join(cfg.StateDir, "db"), store.Options{})
	if err != nil {
		return fmt.Errorf("open the Pebble state (is the control plane still running?): %w", err)
	}
	defer src.Close()
	// The copy is of the current layout, whatever version wrote the state.
	if err := control.Migrate(src, time.Now()); err != nil {
		return err
	}
	dst, err := pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Options{})
	if err != nil {
		return fmt.Errorf("database_url: %w", err)
	}
	defer dst.Close()
	empty := true
	if err := dst.Scan("", "", false, func(string, []byte) (bool, error) { empty = false; return false, nil }); err != nil {
		return err
	}
	if !empty {
		return errors.New("the database already holds control-plane records; migrate-store copies only into an empty one")
	}
	b := dst.NewBatch()
	n := 0
	err = src.Scan("", "", false, func(k string, v []byte) (bool, error) {
		n++
		return true, b.PutRaw(k, v)
	})
	if err != nil {
		b.Discard()
		return fmt.Errorf("read the Pebble state: %w", err)
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("write the database: %w", err)
	}
	if err := compareStores(src, dst); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "copied %d records from %s into the database; start hearth-control serve with database_url set\n", n, cfg.StateDir)
	return nil
}

// compareStores checks that b holds exactly a's records.
func compareStores(a, b store.KV) error {
	type rec struct{ k, v []byte }
	var left []rec
	if err := a.Scan("", "", false, func(k string, v []byte) (bool, error) {
		left = append(left, rec{[]byte(k), bytes.Clone(v)})
		return true, nil
	}); err != nil {
		return err
	}
	i := 0
	err := b.Scan("", "", false, func(k string, v []byte) (bool, error) {
		if i >= len(left) || string(left[i].k) != k || !bytes.Equal(left[i].v, v) {
			return false, fmt.Errorf("verify: the database differs from the Pebble state at record %d (%q)", i, k)
		}
		i++
		return true, nil
	})
	if err != nil {
		return err
	}
	if i != len(left) {
		return fmt.Errorf("verify: the database holds %d records, the Pebble state %d", i, len(left))
	}
	return nil
}
