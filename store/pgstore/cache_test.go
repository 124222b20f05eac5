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
	for _, p := range invParts([]string{"a"}, nil) {
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
	c.committed(12, [][]byte{[]byte("gone")}, [][]byte{[]byte("back")}, [][]byte{[]byte("a")}, nil) // this process's own commit
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
	c.committed(13, [][]byte{[]byte("first")}, [][]byte{[]byte("1")}, nil, nil)
	if r, ok := c.lookup("first", new(uint64)); !ok || string(r.val) != "1" || c.seq != 13 {
		t.Fatalf("own commit after its invalidation: %v %v (seq %d)", r, ok, c.seq)
	}
	c.committed(12, [][]byte{[]byte("first")}, [][]byte{[]byte("old")}, nil, nil)
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
	parts := invParts(keys, nil)
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
		seq, final, ks, _, all, ok := parseInv(payload)
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
		p := invParts([]string{"ok", bad}, nil)
		if len(p) != 1 || !strings.HasSuffix(p[0], "\n*") {
			t.Fatalf("key %q: parts %q, want one that evicts everything", bad, p)
		}
	}
	if p := invParts(nil, nil); len(p) != 1 || p[0] != ":f\n" {
		t.Fatalf("no keys: %q", p)
	}
	if _, _, ks, _, all, _ := parseInv(invPrefix + "3:f\n"); len(ks) != 0 || all {
		t.Fatalf("empty commit parsed as keys %q all %v", ks, all)
	}
}

// Reads and own commits that are not exactly as of the cache's commit are
// kept when the cache can prove them current: a read from before it that
// no later commit wrote, a read ahead of it (the commits in between evict
// it if they wrote it, and a reader that takes it reads nothing older
// afterwards), an own commit whose answer came after later commits.
func TestCacheKeepsProvenReads(t *testing.T) {
	var c cache
	c.start(10)
	c.apply(invPrefix + "11:f\nw")
	c.apply(invPrefix + "12:f\nx")
	c.fill("a", v("1"), 11) // 12 did not write a
	c.fill("w", v("1"), 10) // 11 wrote w
	c.fill("x", v("1"), 11) // 12 wrote x
	if r, ok := c.lookup("a", new(uint64)); !ok || string(r.val) != "1" {
		t.Fatal("a read no later commit wrote was not kept")
	}
	for _, k := range []string{"w", "x"} {
		if _, ok := c.lookup(k, new(uint64)); ok {
			t.Fatalf("kept %s, read before a commit that wrote it", k)
		}
	}
	c.fill("b", v("1"), 9) // before the log
	if _, ok := c.lookup("b", new(uint64)); ok {
		t.Fatal("kept a read from before what the log covers")
	}

	// Ahead of the cache: commits 13 and 14 are on their way.
	c.fill("y", v("14"), 14)
	c.fill("z", v("14"), 14)
	c.hold(12)
	if _, ok := c.lookup("y", nil); ok {
		t.Fatal("strong lookup answered a record ahead of the cache")
	}
	c.release()
	min := uint64(0)
	if r, ok := c.lookup("y", &min); !ok || string(r.val) != "14" || min != 14 {
		t.Fatalf("lagging lookup ahead: %v %v, min %d (want 14)", r, ok, min)
	}
	if _, ok := c.lookup("a", &min); ok {
		t.Fatal("a reader that read as of 14 was answered as of 12")
	}
	c.fill("y", v("12"), 12) // an older read must not replace it
	c.apply(invPrefix + "13:f\ny\nz")
	if r, ok := c.lookup("y", new(uint64)); !ok || string(r.val) != "14" {
		t.Fatal("a commit the record already has evicted it")
	}
	c.apply(invPrefix + "14:f\nz")
	c.apply(invPrefix + "15:f\nz")
	if _, ok := c.lookup("z", new(uint64)); ok {
		t.Fatal("a later commit's write did not evict a record read ahead")
	}

	// This process's commit 16, whose answer comes after 16 and 17 were
	// applied: what 17 wrote is not taken back.
	c.apply(invPrefix + "16:f\np\nq")
	c.apply(invPrefix + "17:f\nq")
	c.committed(16, [][]byte{[]byte("p"), []byte("q")}, [][]byte{[]byte("16"), []byte("16")}, nil, nil)
	if r, ok := c.lookup("p", new(uint64)); !ok || string(r.val) != "16" {
		t.Fatal("own commit answered late: its write was not kept")
	}
	if _, ok := c.lookup("q", new(uint64)); ok {
		t.Fatal("own commit answered late overwrote a later commit's write")
	}
	// Commit 19 answered while 18 is still on its way: kept ahead, and
	// its own invalidation does not evict it.
	c.committed(19, [][]byte{[]byte("r")}, [][]byte{[]byte("19")}, nil, nil)
	c.apply(invPrefix + "18:f\ns")
	c.apply(invPrefix + "19:f\nr")
	if r, ok := c.lookup("r", new(uint64)); !ok || string(r.val) != "19" || c.seq != 19 {
		t.Fatalf("own commit ahead of the cache: %v %v (seq %d)", r, ok, c.seq)
	}

	// A commit in parts: a key its first part evicted, read as of the
	// commit before it, is not kept while the rest is on its way.
	c.apply(invPrefix + "20:p0\nm")
	c.fill("m", v("19"), 19)
	c.apply(invPrefix + "20:f\nn")
	if _, ok := c.lookup("m", new(uint64)); ok {
		t.Fatal("kept a read from before a commit whose part wrote it")
	}

	// The log starts over when full: reads from before it are not kept.
	for i := range maxWritten + 1 {
		c.wrote(fmt.Sprintf("k%d", i), 21)
	}
	c.apply(invPrefix + "21:f\nlast")
	c.fill("u", v("20"), 20)
	if _, ok := c.lookup("u", new(uint64)); ok || len(c.written) != 0 {
		t.Fatal("kept a read from before the log started over")
	}
	c.fill("u", v("21"), 21)
	if _, ok := c.lookup("u", nil); ok {
		t.Fatal("strong lookup without the lock")
	}
	c.hold(21)
	if r, ok := c.lookup("u", nil); !ok || string(r.val) != "21" {
		t.Fatal("strong lookup at the lock's commit not answered")
	}
}

// Own commits can be answered several ahead of the listener: their
// invalidations, arriving after, are not a sequence gone back, and the
// records stay.
func TestCacheOwnCommitsAheadOfListener(t *testing.T) {
	var c cache
	c.start(1)
	for seq := uint64(2); seq <= 4; seq++ {
		c.committed(seq, [][]byte{[]byte(fmt.Sprint("k", seq))}, [][]byte{[]byte("v")}, nil, nil)
	}
	c.fill("other", v("o"), 4)
	for seq := 2; seq <= 4; seq++ {
		c.apply(fmt.Sprintf("%s%d:f\nk%d", invPrefix, seq, seq))
	}
	c.apply(invPrefix + "5:f\nk2")
	if c.seq != 5 {
		t.Fatalf("seq %d, want 5", c.seq)
	}
	for _, k := range []string{"k3", "k4", "other"} {
		if _, ok := c.lookup(k, new(uint64)); !ok {
			t.Fatalf("%s lost: the own commits' invalidations started the cache over", k)
		}
	}
	if _, ok := c.lookup("k2", new(uint64)); ok {
		t.Fatal("k2, written by commit 5, still cached")
	}
	c.apply(invPrefix + "5:f\nk3") // the database restored to 5 and written again
	if _, ok := c.lookup("k4", new(uint64)); ok || c.seq != 5 {
		t.Fatal("a sequence gone back did not start over")
	}
}

// Whole prefixes are kept as lists under the rules of single records: a
// commit writing any key under the prefix evicts it, one writing
// elsewhere does not, and a list read before a commit that wrote under it
// is not kept.
func TestCacheLists(t *testing.T) {
	var c cache
	c.start(1)
	rows := []row{{k: []byte("ctl/fw/s1/1/a"), v: []byte("1")}}
	c.fillList("ctl/fw/s1/", rows, 1)
	c.fillList("ctl/dk/s1/", nil, 1)
	if got, ok := c.lookupList("ctl/fw/s1/", new(uint64)); !ok || len(got) != 1 {
		t.Fatalf("list not kept: %v %v", got, ok)
	}
	if _, ok := c.lookupList("ctl/fw/s1/", nil); ok {
		t.Fatal("strong list lookup without the lock")
	}
	c.hold(1)
	if got, ok := c.lookupList("ctl/dk/s1/", nil); !ok || len(got) != 0 {
		t.Fatal("empty list not answered under the lock")
	}
	c.release()
	c.apply(invPrefix + "2:f\nctl/fw/s2/1/b\nctl/node/n1")
	if _, ok := c.lookupList("ctl/fw/s1/", new(uint64)); !ok {
		t.Fatal("a write under another prefix evicted the list")
	}
	c.apply(invPrefix + "3:f\nctl/fw/s1/2/c")
	if _, ok := c.lookupList("ctl/fw/s1/", new(uint64)); ok {
		t.Fatal("a write under the prefix did not evict the list")
	}
	c.fillList("ctl/fw/s1/", rows, 2) // read before commit 3, which wrote under it
	if _, ok := c.lookupList("ctl/fw/s1/", new(uint64)); ok {
		t.Fatal("kept a list read before a commit that wrote under it")
	}
	c.fillList("ctl/fw/s2/", nil, 5) // ahead of the cache
	min := uint64(0)
	if _, ok := c.lookupList("ctl/fw/s2/", &min); !ok || min != 5 {
		t.Fatalf("list ahead of the cache: min %d", min)
	}
	c.committed(4, [][]byte{[]byte("ctl/dk/s1/4/d")}, [][]byte{[]byte("x")}, nil, nil)
	if _, ok := c.lookupList("ctl/dk/s1/", new(uint64)); ok {
		t.Fatal("an own commit under the prefix did not evict the list")
	}
	c.apply(invPrefix + "5:f\nctl/fw/s2/5/e") // the commit the list ahead was read at
	if _, ok := c.lookupList("ctl/fw/s2/", new(uint64)); !ok {
		t.Fatal("a list as of a commit was evicted by that commit")
	}
	c.apply(invPrefix + "6:f\n*")
	if _, ok := c.lookupList("ctl/fw/s2/", new(uint64)); ok {
		t.Fatal("an invalidation of everything kept a list")
	}
}

// A carried value goes with its key into the same part, comes back as
// written, and is held as the record as of its commit; a process that
// reads only keys (splitting the body on newlines) still finds every key
// written; a value line without its key starts over.
func TestInvCarry(t *testing.T) {
	keys := []string{"ctl/a", "ctl/b", "ctl/c", "ctl/d", "ctl/e"}
	carry := []string{carryLine([]byte(`{"x":"y z"}`), false), carryLine(nil, true),
		carryLine([]byte("a\tb"), false), carryLine([]byte(strings.Repeat("y", maxCarryValue+1)), false),
		carryLine([]byte(`"é"`), false)}
	if carry[2] != "" || carry[3] != "" || carry[4] != "" {
		t.Fatalf("carried a value with a tab, over the size or not ASCII: %q", carry[2:])
	}
	parts := invParts(keys, carry)
	if len(parts) != 1 {
		t.Fatalf("%d parts", len(parts))
	}
	payload := invPrefix + "2" + parts[0]
	_, _, ks, vals, all, ok := parseInv(payload)
	if !ok || all || !slices.Equal(ks, keys) || !slices.Equal(vals, carry) {
		t.Fatalf("parsed keys %q values %q", ks, vals)
	}
	_, body, _ := strings.Cut(payload, "\n")
	for _, k := range keys {
		if !slices.Contains(strings.Split(body, "\n"), k) {
			t.Fatalf("key %s not on a line of its own", k)
		}
	}

	var c cache
	c.start(1)
	for _, k := range keys {
		c.fill(k, v("old"), 1)
	}
	c.apply(payload)
	want := map[string]string{"ctl/a": `{"x":"y z"}`}
	for _, k := range keys {
		r, ok := c.lookup(k, new(uint64))
		switch k {
		case "ctl/a":
			if !ok || !r.found || string(r.val) != want[k] || r.at != 2 {
				t.Fatalf("%s = %+v %v", k, r, ok)
			}
		case "ctl/b":
			if !ok || r.found {
				t.Fatalf("deleted %s = %+v %v", k, r, ok)
			}
		default:
			if ok {
				t.Fatalf("%s not evicted: %+v", k, r)
			}
		}
	}

	// This process's own commit 4, kept before the listener brings commit
	// 3: commit 3's carried value is older and does not replace it.
	c.committed(4, [][]byte{[]byte("ctl/a")}, [][]byte{[]byte("own")}, nil, nil)
	c.apply(invPrefix + "3:f\nctl/a\n\t=stale")
	if r, _ := c.lookup("ctl/a", new(uint64)); string(r.val) != "own" {
		t.Fatalf("an older carried value replaced a newer record: %q", r.val)
	}

	for _, bad := range []string{"\n\t=v", "\nk\n\t=v\n\t=w", "\nk\n\t?v", "\nk\n\t"} {
		var c cache
		c.start(1)
		c.fill("z", v("1"), 1)
		c.apply(invPrefix + "2:f" + bad)
		if _, ok := c.lookup("z", new(uint64)); ok {
			t.Fatalf("malformed %q did not start over", bad)
		}
	}
}
