package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/pgstore"
)

var pg pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

func open(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestKV: the key/value surface behaves as Pebble's: bytewise order, scans
// by prefix forward and reverse from a start, across page boundaries,
// empty values, batches that commit together, and migrations that run
// again harmlessly.
func TestKV(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	st := open(t, url)
	_ = open(t, url) // a second Open finds the schema current

	var got string
	if err := st.Get("a", &got); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get missing = %v, want ErrNotFound", err)
	}
	b := st.NewBatch()
	var want []string
	for i := range 600 { // more than two pages
		k := fmt.Sprintf("p/%04d", i)
		want = append(want, k)
		if err := b.Put(k, k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"p", "o/x", "q/x", "p\xff", "p/\xff"} {
		if err := b.PutRaw(k, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := st.Get("p/0007", &got); err != nil || got != "p/0007" {
		t.Fatalf("Get = %q, %v", got, err)
	}
	if ok, err := st.Has("p"); !ok || err != nil {
		t.Fatalf("Has(empty value) = %v, %v", ok, err)
	}
	scan := func(prefix, start string, reverse bool, limit int) []string {
		var keys []string
		err := st.Scan(prefix, start, reverse, func(k string, _ []byte) (bool, error) {
			keys = append(keys, k)
			return limit == 0 || len(keys) < limit, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	all := append(slices.Clone(want), "p/\xff")
	if k := scan("p/", "", false, 0); !slices.Equal(k, all) {
		t.Fatalf("forward scan: %d keys, first %q last %q", len(k), k[0], k[len(k)-1])
	}
	rev := slices.Clone(all)
	slices.Reverse(rev)
	if k := scan("p/", "", true, 0); !slices.Equal(k, rev) {
		t.Fatalf("reverse scan: %d keys", len(k))
	}
	if k := scan("p/", "p/0300", false, 2); !slices.Equal(k, []string{"p/0300", "p/0301"}) {
		t.Fatalf("forward from start: %q", k)
	}
	if k := scan("p/", "p/0300", true, 2); !slices.Equal(k, []string{"p/0299", "p/0298"}) {
		t.Fatalf("reverse before start: %q", k)
	}
	if k := scan("p\xff", "", false, 0); !slices.Equal(k, []string{"p\xff"}) {
		t.Fatalf("scan of a prefix ending in 0xff: %q", k)
	}

	// A batch is all or nothing: a later write of the same key wins, a
	// discarded batch leaves nothing.
	b = st.NewBatch()
	_ = b.Put("z", 1)
	b.Delete("z")
	_ = b.Put("y", 2)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := st.Has("z"); ok {
		t.Fatal("delete after put in one batch: key still there")
	}
	b = st.NewBatch()
	_ = b.Put("x", 1)
	b.Discard()
	if ok, _ := st.Has("x"); ok {
		t.Fatal("discarded batch was applied")
	}
	if err := b.Commit(); err == nil {
		t.Fatal("a used batch committed again")
	}
	if err := st.Delete("y"); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("never"); err != nil {
		t.Fatalf("delete of a missing key: %v", err)
	}
}

// TestWriterLockIsExclusive: while one store (a replica) holds the writer
// lock, another's commit waits, and it lands after the holder's; the
// holder's first batch commits in the lock's own transaction.
func TestWriterLockIsExclusive(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)

	w, unlock, err := a.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- b.Put("k", "from b") }()
	select {
	case err := <-committed:
		t.Fatalf("b committed while a held the lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := w.Put("k", "from a"); err != nil {
		t.Fatal(err)
	}
	// a's write is committed (visible) before unlock; b still waits for
	// the section to end... or, with the lock's transaction committed by
	// that write, takes the lock now. Either way b's write lands last.
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	unlock()
	var v string
	if err := a.Get("k", &v); err != nil || v != "from b" {
		t.Fatalf("k = %q, %v; want b's later write", v, err)
	}

	// Many writers over two stores, each incrementing a counter under the
	// lock: no increment is lost. Each process serialises its own
	// sections, as the control plane does with its mutex.
	if err := a.Put("n", 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mus [2]sync.Mutex
	for i := range 40 {
		st, mu := []*pgstore.Store{a, b}[i%2], &mus[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			w, unlock, err := st.Lock(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			defer unlock()
			var n int
			if err := w.Get("n", &n); err != nil {
				t.Error(err)
				return
			}
			if err := w.Put("n", n+1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var n int
	if err := b.Get("n", &n); err != nil || n != 40 {
		t.Fatalf("counter = %d, %v; want 40", n, err)
	}
}

// TestNotify: a notification reaches every listener when its batch
// commits, and never for a discarded batch.
func TestNotify(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Listen(ctx, func(p string) { got <- p })
	}()
	defer func() { cancel(); <-done }()

	// The listener connects asynchronously: send until one arrives.
	deadline := time.After(30 * time.Second)
	for ready := false; !ready; {
		bt := a.NewBatch()
		bt.(store.Notifier).Notify("hello")
		if err := bt.Commit(); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-got:
			ready = p == "hello"
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no notification in 30s")
		}
	}
	for len(got) > 0 {
		<-got
	}
	bt := a.NewBatch()
	bt.(store.Notifier).Notify("discarded")
	bt.Discard()
	bt = a.NewBatch()
	_ = bt.Put("k", 1)
	bt.(store.Notifier).Notify("committed")
	if err := bt.Commit(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case p := <-got:
			if p == "hello" || p == "" {
				// A later one of the loop's, still on its way when the
				// first arrived, or the listener's (re)connect.
				continue
			}
			if p != "committed" {
				t.Fatalf("first notification %q, want committed (the discarded one must not arrive)", p)
			}
			return
		case <-time.After(30 * time.Second):
			t.Fatal("committed notification not delivered")
		}
	}
}

// TestDatabaseDown: with the database gone, Open and every operation fail
// promptly with ErrUnavailable (nothing hangs); once it is back the same
// Store works again, and a listener reconnects and says so with "".
func TestDatabaseDown(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewDatabase(t)
	st := open(t, url)
	if err := st.Put("k", 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = st.Listen(ctx, func(p string) { events <- p })
	}()
	defer func() { cancel(); <-done }()

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var v int
	for name, err := range map[string]error{
		"get": st.Get("k", &v), "put": st.Put("k", 2), "scan": st.Scan("", "", false, func(string, []byte) (bool, error) { return true, nil }),
	} {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with the database down: %v, want ErrUnavailable", name, err)
		}
	}
	if _, _, err := st.Lock(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("lock with the database down: %v, want ErrUnavailable", err)
	}
	if _, err := pgstore.Open(context.Background(), url, pgstore.Options{OpTimeout: 2 * time.Second}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("open with the database down: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("failing took %v: the calls must not hang", d)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := st.Put("k", 3); err != nil {
		t.Fatalf("put after the database is back: %v", err)
	}
	if err := st.Get("k", &v); err != nil || v != 3 {
		t.Fatalf("get after the database is back = %d, %v", v, err)
	}
	select {
	case p := <-events:
		if p != "" {
			t.Fatalf("listener event %q, want the reconnect signal \"\"", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("listener did not report its reconnect")
	}
}

// TestBadURL: a malformed URL is an error that does not echo the password.
func TestBadURL(t *testing.T) {
	_, err := pgstore.Open(context.Background(), "postgres://u:s3cret@[::1/db", pgstore.Options{})
	if err == nil {
		t.Fatal("bad URL accepted")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error shows the password: %q", err)
	}
}

// A batch's last write of a key wins, whatever mix of puts and deletes
// came before it, as in Pebble's batches; GetMany reads many keys at once
// and skips the missing.
func TestBatchLastWriteWinsAndGetMany(t *testing.T) {
	st := open(t, pg.Get(t).NewDatabase(t))
	if err := st.Put("gone", "old"); err != nil {
		t.Fatal(err)
	}
	if err := st.Put("back", "old"); err != nil {
		t.Fatal(err)
	}
	b := st.NewBatch()
	for _, step := range []func() error{
		func() error { return b.Put("twice", "first") },
		func() error { return b.Put("twice", "second") },
		func() error { return b.Put("gone", "new") },
		func() error { b.Delete("gone"); return nil },
		func() error { b.Delete("back"); return nil },
		func() error { return b.Put("back", "again") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	err := store.GetMany(st, []string{"twice", "gone", "back", "never"}, func(k string, v []byte) error {
		got[k] = string(v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"twice": `"second"`, "back": `"again"`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("GetMany = %v, want %v", got, want)
	}
}

// Records read with the lock come back through the view until its batch
// commits; afterwards the view reads the database again.
func TestLockReads(t *testing.T) {
	st := open(t, pg.Get(t).NewDatabase(t))
	if err := st.Put("rev", 7); err != nil {
		t.Fatal(err)
	}
	w, unlock, err := st.Lock(context.Background(), "rev", "none")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	var rev int
	if err := w.Get("rev", &rev); err != nil || rev != 7 {
		t.Fatalf("rev = %d, %v; want 7", rev, err)
	}
	if err := w.Get("none", &rev); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing key read with the lock: %v, want ErrNotFound", err)
	}
	if err := w.Put("rev", 8); err != nil {
		t.Fatal(err)
	}
	if err := w.Get("rev", &rev); err != nil || rev != 8 {
		t.Fatalf("after the commit rev = %d, %v; want 8", rev, err)
	}
	if err := st.Get("rev", &rev); err != nil || rev != 8 {
		t.Fatalf("the store reads rev = %d, %v; want 8", rev, err)
	}
}

// listen runs st's listener until the test ends and waits until its cache
// is on.
func listen(t *testing.T, st *pgstore.Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = st.Listen(ctx, func(string) {})
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the cache to start", func() bool { _, on := st.CacheSeq(); return on })
}

// waitFor polls cond until it holds; the deadline only guards against a
// hang, nothing is measured by it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestCacheAcrossStores: two processes' stores on one database. What one
// commits (here 2 000 keys, announced in several notifications) is never
// read stale by the other: reads under the writer lock answer from the
// cache only once it has applied every commit, and then without a round
// trip; lagging reads answer from it as soon as a record was read once.
func TestCacheAcrossStores(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)
	listen(t, a)
	listen(t, b)
	const n = 2000
	write := func(st *pgstore.Store, val string) {
		t.Helper()
		bt := st.NewBatch()
		for i := range n {
			if err := bt.Put(fmt.Sprintf("k/%04d", i), val); err != nil {
				t.Fatal(err)
			}
		}
		if err := bt.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp := func() {
		t.Helper()
		seq := a.DBSeq()
		for _, st := range []*pgstore.Store{a, b} {
			waitFor(t, "the caches to apply every commit", func() bool { s, _ := st.CacheSeq(); return s >= seq })
		}
	}
	readAll := func(kv store.KV, want string) int64 {
		t.Helper()
		before := b.DBReads()
		for i := range n {
			var got string
			if err := kv.Get(fmt.Sprintf("k/%04d", i), &got); err != nil || got != want {
				t.Fatalf("k/%04d = %q, %v; want %q", i, got, err, want)
			}
		}
		if ok, err := kv.Has("k/none"); ok || err != nil {
			t.Fatalf("Has(missing) = %v, %v", ok, err)
		}
		return b.DBReads() - before
	}

	write(a, "v1")
	caughtUp()
	lag := b.Lagging()
	if r := readAll(lag, "v1"); r != n+1 {
		t.Fatalf("first lagging pass: %d database reads, want %d", r, n+1)
	}
	if r := readAll(lag, "v1"); r != 0 {
		t.Fatalf("second lagging pass: %d database reads, want 0 (cached)", r)
	}

	write(a, "v2")
	caughtUp()
	var got string
	if err := a.Lagging().Get("k/0001", &got); err != nil || got != "v2" { // cached in a
		t.Fatalf("a reads %q, %v", got, err)
	}
	w, unlock, err := b.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock) // a failure below must not leave the lock held
	readAll(w, "v2")  // a stale v1 here is a missed invalidation
	if r := readAll(w, "v2"); r != 0 {
		t.Fatalf("under the lock: %d database reads, want 0", r)
	}
	if err := w.Put("k/0001", "mine"); err != nil { // commits in the section
		t.Fatal(err)
	}
	unlock()
	reads := b.DBReads()
	if err := b.Lagging().Get("k/0001", &got); err != nil || got != "mine" {
		t.Fatalf("own write read back as %q, %v", got, err)
	}
	if r := b.DBReads() - reads; r != 0 {
		t.Fatalf("reading back its own write cost %d database reads, want 0 (kept at commit)", r)
	}
	caughtUp()
	if err := a.Lagging().Get("k/0001", &got); err != nil || got != "mine" {
		t.Fatalf("other store reads %q, %v; want mine", got, err)
	}
}

// TestCarriedWritesAcrossStores: what a small commit of one process wrote
// reaches the other's cache with the invalidation, so the other reads it
// without a round trip (under the lock too); values a notification cannot
// hold, and every write of a large commit, are only evicted, and nothing
// is ever read stale.
func TestCarriedWritesAcrossStores(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)
	listen(t, a)
	listen(t, b)
	caughtUp := func() {
		t.Helper()
		seq := a.DBSeq()
		waitFor(t, "b's cache to apply every commit", func() bool { s, _ := b.CacheSeq(); return s >= seq })
	}
	long := strings.Repeat("x", 3000)
	commit := func(f func(bt store.Batch)) {
		t.Helper()
		bt := a.NewBatch()
		f(bt)
		if err := bt.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	commit(func(bt store.Batch) { _ = bt.Put("c/gone", "soon") })
	caughtUp()
	commit(func(bt store.Batch) {
		_ = bt.Put("c/small", "v1")
		_ = bt.Put("c/long", long)
		_ = bt.PutRaw("c/raw", []byte("line\nbreak"))
		_ = bt.PutRaw("c/empty", nil)
		bt.Delete("c/gone")
	})
	caughtUp()
	get := func(kv store.KV, key string) (string, bool, int64) {
		t.Helper()
		before := b.DBReads()
		raw, err := kv.(store.RawGetter).GetRaw(key)
		if errors.Is(err, store.ErrNotFound) {
			return "", false, b.DBReads() - before
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(raw), true, b.DBReads() - before
	}
	lag := b.Lagging()
	for _, c := range []struct {
		key, want string
		found     bool
		reads     int64
	}{
		{"c/small", `"v1"`, true, 0},
		{"c/empty", "", true, 0},
		{"c/gone", "", false, 0},
		{"c/long", `"` + long + `"`, true, 1}, // over the size carried
		{"c/raw", "line\nbreak", true, 1},     // a newline a payload line cannot hold
	} {
		got, found, reads := get(lag, c.key)
		if got != c.want || found != c.found || reads != c.reads {
			t.Errorf("%s = %.20q (found %v) in %d database reads; want %.20q (found %v) in %d",
				c.key, got, found, reads, c.want, c.found, c.reads)
		}
	}
	w, unlock, err := b.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	if got, _, reads := get(w, "c/small"); got != `"v1"` || reads != 0 {
		t.Fatalf("under the lock: c/small = %q in %d database reads, want \"v1\" in 0", got, reads)
	}
	unlock()

	// A commit too large to carry its values evicts the carried record.
	commit(func(bt store.Batch) {
		for i := range 40 {
			_ = bt.Put(fmt.Sprintf("c/many/%02d", i), i)
		}
		_ = bt.Put("c/small", "v2")
	})
	caughtUp()
	if got, _, reads := get(lag, "c/small"); got != `"v2"` || reads != 1 {
		t.Fatalf("after a large commit: c/small = %q in %d database reads, want \"v2\" in 1", got, reads)
	}
}

// TestListCacheAcrossStores: a whole small prefix read once is answered
// from the cache (either order) until a commit of any process writes
// under it; then it is read again and never stale. A long prefix is paged
// through the database as before.
func TestListCacheAcrossStores(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)
	listen(t, a)
	listen(t, b)
	put := func(st *pgstore.Store, keys ...string) {
		t.Helper()
		bt := st.NewBatch()
		for _, k := range keys {
			if err := bt.Put(k, k); err != nil {
				t.Fatal(err)
			}
		}
		if err := bt.Commit(); err != nil {
			t.Fatal(err)
		}
		seq := a.DBSeq()
		for _, st := range []*pgstore.Store{a, b} {
			waitFor(t, "the caches to apply every commit", func() bool { s, _ := st.CacheSeq(); return s >= seq })
		}
	}
	scan := func(kv store.KV, reverse bool) []string {
		t.Helper()
		var got []string
		if err := kv.Scan("l/", "", reverse, func(k string, _ []byte) (bool, error) {
			got = append(got, k)
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	check := func(kv store.KV, want []string, lists int64) {
		t.Helper()
		before := b.DBLists()
		if got := scan(kv, false); !slices.Equal(got, want) {
			t.Fatalf("scan = %q, want %q", got, want)
		}
		rev := slices.Clone(want)
		slices.Reverse(rev)
		if got := scan(kv, true); !slices.Equal(got, rev) {
			t.Fatalf("reverse scan = %q, want %q", got, rev)
		}
		if n := b.DBLists() - before; n != lists {
			t.Fatalf("%d whole-prefix reads from the database, want %d", n, lists)
		}
	}
	put(a, "l/1", "l/2", "m/1")
	check(b.Lagging(), []string{"l/1", "l/2"}, 1) // read once, then cached
	check(b.Lagging(), []string{"l/1", "l/2"}, 0)
	put(a, "m/2") // elsewhere
	check(b.Lagging(), []string{"l/1", "l/2"}, 0)
	put(a, "l/0")
	check(b.Lagging(), []string{"l/0", "l/1", "l/2"}, 1)
	if err := b.Delete("l/1"); err != nil { // own commit
		t.Fatal(err)
	}
	check(b.Lagging(), []string{"l/0", "l/2"}, 1)
	w, unlock, err := b.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	check(w, []string{"l/0", "l/2"}, 0) // current under the lock
	unlock()

	var long []string
	for i := range 40 {
		long = append(long, fmt.Sprintf("l/x%02d", i))
	}
	put(a, long...)
	want := append([]string{"l/0", "l/2"}, long...)
	check(b.Lagging(), want, 2) // not kept: too long for one page
}

// A prefix a batch notes empty (store.EmptyNoter) is answered empty from
// the committing process's cache, without a read; one the batch writes
// under is not taken for empty, and a later commit under the prefix,
// from any process, is seen.
func TestNotedEmptyPrefix(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	a, b := open(t, url), open(t, url)
	listen(t, a)
	listen(t, b)
	scan := func(st *pgstore.Store, prefix string) (keys []string, lists int64) {
		t.Helper()
		before := st.DBLists()
		if err := st.Lagging().Scan(prefix, "", false, func(k string, _ []byte) (bool, error) {
			keys = append(keys, k)
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
		return keys, st.DBLists() - before
	}
	bt := a.NewBatch()
	if err := bt.Put("srv/s1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := bt.Put("dk/s1/1", "written in the batch"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"fw/s1/", "dk/s1/"} {
		bt.(store.EmptyNoter).NoteEmpty(p)
	}
	if err := bt.Commit(); err != nil {
		t.Fatal(err)
	}
	if keys, lists := scan(a, "fw/s1/"); len(keys) != 0 || lists != 0 {
		t.Fatalf("noted-empty prefix: %q with %d reads, want none with none", keys, lists)
	}
	if keys, _ := scan(a, "dk/s1/"); !slices.Equal(keys, []string{"dk/s1/1"}) {
		t.Fatalf("prefix written in the batch: %q", keys)
	}
	if keys, lists := scan(b, "fw/s1/"); len(keys) != 0 || lists != 1 {
		t.Fatalf("another process: %q with %d reads, want none with one", keys, lists)
	}
	if err := b.Put("fw/s1/1", "rule"); err != nil {
		t.Fatal(err)
	}
	seq := b.DBSeq()
	waitFor(t, "the cache to apply the commit", func() bool { s, _ := a.CacheSeq(); return s >= seq })
	if keys, _ := scan(a, "fw/s1/"); !slices.Equal(keys, []string{"fw/s1/1"}) {
		t.Fatalf("after another process wrote under it: %q", keys)
	}
}

// TestWriterLockTakesNoReadConnection: with every read connection in use
// (reads in flight), a change still takes the writer lock and commits, and
// so does a batch of its own: the writers have connections of their own.
func TestWriterLockTakesNoReadConnection(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{OpTimeout: 5 * time.Second, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	release := st.HoldReader()
	w, unlock, err := st.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := w.Get("k", &v); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read with the lock: %v, want ErrNotFound", err)
	}
	if err := w.Put("k", "locked"); err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := st.Put("own", "batch"); err != nil {
		t.Fatal(err)
	}
	release()
	for k, want := range map[string]string{"k": "locked", "own": "batch"} {
		if err := st.Get(k, &v); err != nil || v != want {
			t.Fatalf("Get %s = %q, %v; want %q", k, v, err, want)
		}
	}
}

// TestWriterLockAfterRestart: the writer connections left idle through a
// database restart (the database closed them) cost the first change after
// it nothing: the lock is taken on a live connection at once.
func TestWriterLockAfterRestart(t *testing.T) {
	srv := pgtest.Start(t)
	st := open(t, srv.NewDatabase(t))
	// Every writer connection in use at once, so the pool keeps several.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := st.Put(fmt.Sprintf("k%d", i), i); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	w, unlock, err := st.Lock(context.Background(), "k0")
	if err != nil {
		t.Fatalf("first lock after a restart: %v", err)
	}
	var v int
	err = w.Get("k0", &v)
	unlock()
	if err != nil || v != 0 {
		t.Fatalf("read with the lock after a restart: %d, %v", v, err)
	}
}

// TestGetRawSharesCachedBytes: a lagging reader hands out the cache's own
// bytes while a record is unchanged (callers keep what they decoded from
// them), and other bytes once a commit changed it.
func TestGetRawSharesCachedBytes(t *testing.T) {
	st := open(t, pg.Get(t).NewDatabase(t))
	listen(t, st)
	put := func(v string) {
		t.Helper()
		if err := st.Put("k", v); err != nil {
			t.Fatal(err)
		}
		seq := st.DBSeq()
		waitFor(t, "the cache to apply the commit", func() bool { s, _ := st.CacheSeq(); return s >= seq })
	}
	put("one")
	rd := st.Lagging().(store.RawGetter)
	get := func() []byte {
		t.Helper()
		raw, err := rd.GetRaw("k")
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	a, b := get(), get()
	if string(a) != `"one"` || &a[0] != &b[0] {
		t.Fatalf("unchanged record: %q then %q, shared %v", a, b, &a[0] == &b[0])
	}
	put("two")
	if c := get(); string(c) != `"two"` || &c[0] == &a[0] {
		t.Fatalf("after a commit: %q", c)
	}
	if _, err := rd.GetRaw("missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
}

// TestKeepOpen: with KeepOpen both pools open every connection at start,
// without a request asking for them; without it they grow on demand.
func TestKeepOpen(t *testing.T) {
	url := pg.Get(t).NewDatabase(t)
	lazy := open(t, url)
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{OpTimeout: 5 * time.Second, MaxConns: 6, KeepOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	waitFor(t, "every connection open", func() bool { r, w := st.Conns(); return r == 6 && w == pgstore.WriterConns })
	if r, w := lazy.Conns(); r > 2 || w > 0 {
		t.Errorf("without KeepOpen: %d read and %d writer connections open after start, want them made on demand", r, w)
	}
}
