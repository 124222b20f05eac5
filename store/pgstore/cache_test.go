package pgstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func v(s string) cached { return cached{val: []byte(s), found: true} }

// The cache answers only what it knows to be as of its commit: fills from
// another commit are dropped, invalidations evict in order, a missed
// commit or a malformed payload starts over, and strong reads need the
// lock held at the cache's commit.
func TestCacheRules(t *testing.T) {
	var c cache
	c.fill("a", v("1"), 0)
	if _, ok := c.lookup("a", new(uint64)); ok {
		t.Fatal("cache answers before the listener started it")
	}
	c.start(10)
	c.fill("a", v("1"), 9) // read before commit 10: not kept
	if _, ok := c.lookup("a", new(uint64)); ok {
		t.Fatal("kept a record read as of another commit")
	}
	c.fill("a", v("1"), 10)
	c.fill("gone", cached{}, 10)
	if r, ok := c.lookup("a", new(uint64)); !ok || string(r.val) != "1" {
		t.Fatalf("lagging lookup = %v %v", r, ok)
	}
	if r, ok := c.lookup("gone", new(uint64)); !ok || r.found {
		t.Fatalf("absent record not remembered: %v %v", r, ok)
	}
	if _, ok := c.lookup("a", nil); ok {
		t.Fatal("strong lookup answered without the lock held")
	}
	if c.catchUp(11, time.Millisecond) {
		t.Fatal("caught up with a commit never announced")
	}
	go c.apply(invPrefix + "11:f\na")
	if !c.catchUp(11, time.Minute) { // returns as soon as it is applied
		t.Fatal("did not catch up with an announced commit")
	}
	c.apply(invPrefix + "10:f\n") // back to before it, for what follows
	c.fill("a", v("1"), 10)
	c.fill("gone", cached{}, 10)
	c.hold(11) // another process committed 11; its invalidation is on the way
	if _, ok := c.lookup("a", nil); ok {
		t.Fatal("strong lookup answered while the cache is behind the lock")
	}
	min := uint64(11)
	if _, ok := c.lookup("a", &min); ok {
		t.Fatal("lagging lookup answered older than a read already made")
	}
	for _, p := range invParts([]string{"a"}) {
		if !c.apply(invPrefix + "11" + p) {
			t.Fatal("invalidation not recognised")
		}
	}
	if _, ok := c.lookup("a", nil); ok {
		t.Fatal("evicted record still answered")
	}
	if r, ok := c.lookup("gone", nil); !ok || r.found {
		t.Fatal("strong lookup at the lock's commit not answered")
	}
	c.committed(12, [][]byte{[]byte("gone")}, [][]byte{[]byte("back")}, [][]byte{[]byte("a")}) // this process's own commit
	if r, ok := c.lookup("gone", new(uint64)); !ok || !r.found || string(r.val) != "back" {
		t.Fatalf("own commit's write not kept: %v %v", r, ok)
	}
	if r, ok := c.lookup("a", new(uint64)); !ok || r.found {
		t.Fatalf("own commit's delete not kept: %v %v", r, ok)
	}
	if c.apply(invPrefix+"12:f\ngone") != true || c.seq != 12 {
		t.Fatalf("own commit's invalidation: seq %d", c.seq)
	}
	if r, ok := c.lookup("gone", new(uint64)); !ok || string(r.val) != "back" {
		t.Fatal("own commit's invalidation, arriving after, evicted its values")
	}
	// The invalidation of an own commit may arrive before the committer
	// has its answer: the values it wrote are still the records as of it.
	c.apply(invPrefix + "13:f\nfirst")
	c.committed(13, [][]byte{[]byte("first")}, [][]byte{[]byte("1")}, nil)
	if r, ok := c.lookup("first", new(uint64)); !ok || string(r.val) != "1" || c.seq != 13 {
		t.Fatalf("own commit after its invalidation: %v %v (seq %d)", r, ok, c.seq)
	}
	c.committed(12, [][]byte{[]byte("first")}, [][]byte{[]byte("old")}, nil)
	if r, _ := c.lookup("first", new(uint64)); string(r.val) != "1" {
		t.Fatal("a commit older than the cache overwrote a record")
	}
	c.apply(invPrefix + "14:f\nx")
	c.fill("b", v("2"), 14)
	c.apply(invPrefix + "16:f\nx") // 15 missed
	if _, ok := c.lookup("b", new(uint64)); ok || c.seq != 16 {
		t.Fatalf("a missed commit did not start over (seq %d)", c.seq)
	}
	c.fill("b", v("2"), 16)
	c.apply(invPrefix + "junk\nb")
	if _, ok := c.lookup("b", new(uint64)); ok {
		t.Fatal("a malformed invalidation did not start over")
	}
	c.fill("b", v("2"), 16)
	c.apply(invPrefix + "3:f\nother") // the database restored from a backup
	if _, ok := c.lookup("b", new(uint64)); ok || c.seq != 3 {
		t.Fatalf("a sequence gone back did not start over (seq %d)", c.seq)
	}
	if c.apply("wake/nd_1") {
		t.Fatal("another payload taken for an invalidation")
	}
	c.fill("b", v("2"), 3)
	c.stop()
	if _, ok := c.lookup("b", new(uint64)); ok {
		t.Fatal("cache answers after the listener stopped")
	}
}

// A commit of many keys is announced in parts under the payload limit;
// the parts evict as they come and only the final one advances the
// commit; keys a notification cannot carry evict everything.
func TestInvParts(t *testing.T) {
	var keys []string
	for i := range 2000 {
		keys = append(keys, fmt.Sprintf("ctl/node/nd_%020d", i))
	}
	parts := invParts(keys)
	if len(parts) < 5 {
		t.Fatalf("%d parts for %d keys", len(parts), len(keys))
	}
	var c cache
	c.start(1)
	for _, k := range keys {
		c.fill(k, v("x"), 1)
	}
	c.fill("other", v("y"), 1)
	var got []string
	for i, p := range parts {
		payload := invPrefix + "2" + p
		if len(payload) >= 8000 {
			t.Fatalf("part %d is %d bytes", i, len(payload))
		}
		seq, final, ks, all, ok := parseInv(payload)
		if !ok || all || seq != 2 || final != (i == len(parts)-1) {
			t.Fatalf("part %d parsed as seq %d final %v all %v ok %v", i, seq, final, all, ok)
		}
		got = append(got, ks...)
		c.apply(payload)
		if want := uint64(1); i < len(parts)-1 && c.seq != want {
			t.Fatalf("seq advanced to %d before the final part", c.seq)
		}
	}
	if !slices.Equal(got, keys) || c.seq != 2 {
		t.Fatalf("keys round trip: %d of %d, seq %d", len(got), len(keys), c.seq)
	}
	if len(c.recs) != 1 {
		t.Fatalf("%d records left, want only the unwritten one", len(c.recs))
	}
	for _, bad := range []string{"a\nb", "é", "*", "tab\t"} {
		p := invParts([]string{"ok", bad})
		if len(p) != 1 || !strings.HasSuffix(p[0], "\n*") {
			t.Fatalf("key %q: parts %q, want one that evicts everything", bad, p)
		}
	}
	if p := invParts(nil); len(p) != 1 || p[0] != ":f\n" {
		t.Fatalf("no keys: %q", p)
	}
	if _, _, ks, all, _ := parseInv(invPrefix + "3:f\n"); len(ks) != 0 || all {
		t.Fatalf("empty commit parsed as keys %q all %v", ks, all)
	}
}
