package pgstore

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// The read cache. Every commit of every process takes the next number of
// the lock row's commit sequence and sends, in the same transaction, an
// invalidation naming that number and every key it wrote. A process that
// listens applies them in commit order (seq is the last it applied), so
// each record in its cache, known as of some commit at, is also the record
// as of seq: every later commit that wrote it has evicted it. A record read
// from the database as of commit at is kept if no commit after at that the
// cache applied wrote it (the cache remembers which keys recent commits
// wrote), or if at is ahead of the cache (then the commits in between will
// evict it if they wrote it); a reader that takes a record ahead of the
// cache reads nothing older afterwards. The cache is current exactly when
// seq is the database's sequence, which a process knows for certain only
// while it holds the writer lock (no one else can commit then): reads
// answer from it during a held section, and otherwise only where a
// moment's lag is allowed (Store.Lagging).

// invPrefix starts an invalidation's payload: "inv:<seq>:<part>\n" then
// the keys written, one per line, or "*" for every key. A commit writing
// more keys than one notification carries sends several parts; the last
// is marked "f" and advances seq.
//
// A small commit also carries what it wrote: after a key's line, a line
// of a tab and "=" then the value (a put), or a tab and "-" (a delete).
// Another replica then holds the record as of that commit instead of
// evicting it, and its next read of it (the node's long-poll it wakes,
// the node's report, the next capacity pick) costs no round trip. A line
// starting with a tab is no key (keys are printable ASCII), so a process
// that does not read values only evicts one key too many that it never
// cached.
const invPrefix = "inv:"

// Values are carried for commits of at most maxCarryKeys keys (a create
// or a report writes a handful; a sweep's chunk hundreds), each of at most
// maxCarryValue bytes, so a notification grows by a few KiB at most.
const (
	maxCarryKeys  = 32
	maxCarryValue = 2048
)

// carryLine is the line that carries a write of key: "=" and the value
// for a put, "-" for a delete, or "" when the value is not carried: too
// long, or not printable ASCII (a line break would end the line, and a
// database whose encoding is not UTF-8 may refuse other bytes in a
// notification's text and with it the commit).
func carryLine(val []byte, del bool) string {
	if del {
		return "-"
	}
	if len(val) > maxCarryValue {
		return ""
	}
	for _, b := range val {
		if b < ' ' || b > '~' {
			return ""
		}
	}
	return "=" + string(val)
}

// maxInvPayload keeps each payload under PostgreSQL's 8 000-byte limit.
const maxInvPayload = 7000

// maxCached bounds the cache; past it the cache starts over.
const maxCached = 1 << 17

// maxLists bounds the whole prefixes kept (lists); past it they start over.
const maxLists = 1 << 15

// maxWritten bounds the log of keys written by recent commits; past it the
// log starts over from the cache's commit, and reads from before that
// commit are no longer kept.
const maxWritten = 1 << 17

type cache struct {
	mu sync.Mutex
	// on is set while the listener is connected and seq is a baseline
	// read after its LISTEN took effect.
	on  bool
	seq uint64
	// held is the sequence at which this process holds the writer lock
	// and has not committed yet, or 0.
	held uint64
	// lseq is the last commit whose invalidation the listener delivered
	// whole: they come in commit order, so one not after it means the
	// sequence went back. seq may be ahead of it by this process's own
	// commits.
	lseq uint64
	recs map[string]cached
	// lists holds whole prefixes (ending in "/") read at once: every
	// record under each, in key order. A commit that writes any key under
	// a prefix evicts it.
	lists map[string]cachedList
	// written holds, for each key written by a commit after logFrom that
	// the cache applied (or is applying), the last such commit; wrotePfx
	// the same for every prefix of those keys that ends in "/".
	written  map[string]uint64
	wrotePfx map[string]uint64
	logFrom  uint64
	// advanced is closed (and replaced) whenever seq moves (catchUp).
	advanced chan struct{}
}

type cached struct {
	val   []byte
	found bool
	// at is the commit as of which the record was read or written: the
	// record is as of max(at, seq).
	at uint64
}

// cachedList is every record under a prefix as of commit at.
type cachedList struct {
	rows []row
	at   uint64
}

// answers reports whether a record (or list) as of commit at may answer a
// read: with min nil (strong) only if the cache is current (held == seq);
// else if it is as of min or later, and then min becomes at least at.
// With c.mu held.
func (c *cache) answers(at uint64, min *uint64) bool {
	if min == nil {
		return c.held != 0 && c.held == c.seq && at <= c.seq
	}
	if max(c.seq, at) < *min {
		return false
	}
	*min = max(*min, at)
	return true
}

// lookupList answers a whole prefix from the cache, as lookup a key.
func (c *cache) lookupList(prefix string, min *uint64) ([]row, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return nil, false
	}
	l, ok := c.lists[prefix]
	if !ok || !c.answers(l.at, min) {
		return nil, false
	}
	return l.rows, true
}

// fillList keeps every record under prefix (rows, in key order) read
// from the database as of commit at, under fill's rule.
func (c *cache) fillList(prefix string, rows []row, at uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fillListLocked(prefix, rows, at)
}

// fillListLocked is fillList with c.mu held.
func (c *cache) fillListLocked(prefix string, rows []row, at uint64) {
	if !c.on || at < c.logFrom || c.wrotePfx[prefix] > at {
		return
	}
	if old, ok := c.lists[prefix]; ok && old.at > at {
		return
	}
	if c.lists == nil || len(c.lists) >= maxLists {
		c.lists = make(map[string]cachedList)
	}
	c.lists[prefix] = cachedList{rows: rows, at: at}
}

// evictLists drops the lists of every prefix of key that a commit seq
// changes and, if log, notes the prefixes in the log; with c.mu held.
func (c *cache) evictLists(key string, seq uint64, log bool) {
	for i := 0; i < len(key); i++ {
		if key[i] != '/' {
			continue
		}
		p := key[:i+1]
		if log {
			if c.wrotePfx == nil {
				c.wrotePfx = make(map[string]uint64)
			}
			c.wrotePfx[p] = seq
		}
		if l, ok := c.lists[p]; ok && l.at < seq {
			delete(c.lists, p)
		}
	}
}

// lookup answers key from the cache when allowed: with min nil only if
// the cache is current (held == seq); else if the record is as of min or
// later, and then min becomes at least the commit it is as of.
func (c *cache) lookup(key string, min *uint64) (cached, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return cached{}, false
	}
	r, ok := c.recs[key]
	if !ok || !c.answers(r.at, min) {
		return cached{}, false
	}
	return r, true
}

// fill keeps a record read from the database as of commit at, if it is
// still the record as of the cache's commit or at is ahead of the cache.
func (c *cache) fill(key string, r cached, at uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on || !c.unwritten(key, at) {
		return
	}
	if old, ok := c.recs[key]; ok && old.at > at {
		return // a newer read or write is kept already
	}
	if c.recs == nil || len(c.recs) >= maxCached {
		c.recs = make(map[string]cached)
	}
	r.at = at
	c.recs[key] = r
}

// unwritten reports whether the cache knows that no commit after at that
// it applied, or has begun to apply, wrote key: the log covers the commits
// after logFrom; with c.mu held.
func (c *cache) unwritten(key string, at uint64) bool {
	return at >= c.logFrom && c.written[key] <= at
}

// catchUp waits at most max for the cache to apply the commits up to seq
// (another process's last commit, whose invalidation is on its way while
// this one takes the lock), so that the lock holder's reads can answer
// from it; it reports whether it did.
func (c *cache) catchUp(seq uint64, max time.Duration) bool {
	var timer *time.Timer
	for {
		c.mu.Lock()
		if !c.on || c.seq >= seq {
			ok := c.on && c.seq == seq
			c.mu.Unlock()
			return ok
		}
		if c.advanced == nil {
			c.advanced = make(chan struct{})
		}
		ch := c.advanced
		c.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(max)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// moved wakes catchUp; with c.mu held.
func (c *cache) moved() {
	if c.advanced != nil {
		close(c.advanced)
		c.advanced = nil
	}
}

func (c *cache) hold(seq uint64) {
	c.mu.Lock()
	c.held = seq
	c.mu.Unlock()
}

func (c *cache) release() { c.hold(0) }

// committed applies this process's own commit: the values it wrote
// (putK[i] → putV[i], delK gone) are the records as of seq, so they are
// kept rather than evicted — unless a later commit the cache applied
// wrote them too — and reading back what was just written costs no round
// trip. If the cache is at the commit before, it moves to seq at once (its
// invalidation, arriving later, is then skipped); the invalidation can
// also arrive first, or the cache be further behind, when its own
// invalidation and those before it catch it up. empties are prefixes with
// no record as of seq (store.EmptyNoter), kept as empty lists.
func (c *cache) committed(seq uint64, putK, putV, delK [][]byte, empties []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return
	}
	if c.recs == nil || len(c.recs)+len(putK)+len(delK) > maxCached {
		c.recs = make(map[string]cached)
	}
	advance := seq == c.seq+1
	keep := func(k []byte, r cached) {
		key := string(k)
		c.evictLists(key, seq, advance)
		if advance {
			c.wrote(key, seq)
		} else if !c.unwritten(key, seq) {
			return
		}
		if old, ok := c.recs[key]; ok && old.at > seq {
			return
		}
		c.recs[key] = r
	}
	for i, k := range putK {
		keep(k, cached{val: putV[i], found: true, at: seq})
	}
	for _, k := range delK {
		keep(k, cached{at: seq})
	}
	for _, p := range empties {
		c.fillListLocked(p, nil, seq)
	}
	if advance {
		c.advance(seq)
	}
}

// wrote notes in the log that commit seq wrote key; with c.mu held.
func (c *cache) wrote(key string, seq uint64) {
	if c.written == nil {
		c.written = make(map[string]uint64)
	}
	c.written[key] = seq
}

// advance moves the cache to commit seq, all of whose invalidation is
// applied; with c.mu held.
func (c *cache) advance(seq uint64) {
	c.seq = seq
	if len(c.written)+len(c.wrotePfx) > maxWritten {
		c.written, c.wrotePfx, c.logFrom = nil, nil, seq
	}
	c.moved()
}

// reset forgets every record and the log: only reads as of from or later
// can be kept; with c.mu held.
func (c *cache) reset(from uint64) {
	c.recs, c.lists, c.written, c.wrotePfx, c.logFrom = nil, nil, nil, nil, from
}

// start begins caching from the database's sequence base, read after the
// listener's LISTEN took effect; stop ends it when the listener is lost.
func (c *cache) start(base uint64) {
	c.mu.Lock()
	c.on, c.seq, c.lseq = true, base, base
	c.reset(base)
	c.mu.Unlock()
}

func (c *cache) stop() {
	c.mu.Lock()
	c.on = false
	c.reset(0)
	c.moved()
	c.mu.Unlock()
}

// apply handles an invalidation; ok is false for any other payload.
func (c *cache) apply(payload string) (ok bool) {
	seq, final, keys, vals, all, ok := parseInv(payload)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq == 0 {
		// Malformed: no key can be trusted, nor a read from before the
		// next commit (which this payload may belong to).
		c.reset(c.seq + 1)
		return true
	}
	switch {
	case !c.on:
		return true
	case seq <= c.lseq:
		// The sequence went back: the database was restored from a
		// backup (or, just after start, a commit from before the
		// baseline). Nothing cached can be trusted.
		if final {
			c.reset(seq)
			c.seq, c.lseq = seq, seq
			c.moved()
		}
		return true
	case seq <= c.seq:
		// Applied already: this process's own commit (committed), or one
		// before it. Own commits can run ahead of the listener by
		// several.
		if final {
			c.lseq = seq
		}
		return true
	}
	if final && seq != c.seq+1 {
		all = true // a commit was missed
	}
	if all {
		c.reset(seq)
	} else {
		for i, k := range keys {
			c.wrote(k, seq)
			c.evictLists(k, seq, true)
			r, ok := c.recs[k]
			switch v := vals[i]; {
			case ok && r.at >= seq:
				// A record as of this commit or later has its write.
			case v != "":
				// The record as of this commit, as it wrote it.
				if c.recs == nil || len(c.recs) >= maxCached {
					c.recs = make(map[string]cached)
				}
				if v[0] == '=' {
					c.recs[k] = cached{val: []byte(v[1:]), found: true, at: seq}
				} else {
					c.recs[k] = cached{at: seq}
				}
			case ok:
				delete(c.recs, k)
			}
		}
	}
	if final {
		c.lseq = seq
		c.advance(seq)
	}
	return true
}

// invParts builds the payload tails of a commit's invalidation (what
// follows "inv:<seq>"), in as many parts as its keys need. Keys that are
// not printable ASCII, which a notification could not carry, invalidate
// everything. carry, if not nil, holds each key's carryLine; a key and its
// value line go in the same part.
func invParts(keys []string, carry []string) []string {
	all := false
	for _, k := range keys {
		if strings.ContainsFunc(k, func(r rune) bool { return r < ' ' || r > '~' }) || k == "*" {
			all = true
			break
		}
	}
	if all {
		return []string{":f\n*"}
	}
	var parts []string
	var b strings.Builder
	flush := func(final bool) {
		tag := "p" + strconv.Itoa(len(parts))
		if final {
			tag = "f"
		}
		parts = append(parts, ":"+tag+"\n"+b.String())
		b.Reset()
	}
	for i, k := range keys {
		line := ""
		if carry != nil && carry[i] != "" {
			line = "\n\t" + carry[i]
		}
		if b.Len() > 0 && b.Len()+1+len(k)+len(line) > maxInvPayload {
			flush(false)
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteString(line)
	}
	flush(true)
	return parts
}

// parseInv reads an invalidation: its commit, whether it is the commit's
// final part, the keys written and, for each, its carried value line (""
// for none).
func parseInv(p string) (seq uint64, final bool, keys, vals []string, all bool, ok bool) {
	rest, ok := strings.CutPrefix(p, invPrefix)
	if !ok {
		return 0, false, nil, nil, false, false
	}
	head, body, _ := strings.Cut(rest, "\n")
	num, tag, _ := strings.Cut(head, ":")
	seq, err := strconv.ParseUint(num, 10, 64)
	if err != nil || seq == 0 {
		return 0, false, nil, nil, true, true // malformed (apply starts over)
	}
	final = tag == "f"
	if body == "*" {
		return seq, final, nil, nil, true, true
	}
	if body == "" {
		return seq, final, nil, nil, false, true
	}
	for _, line := range strings.Split(body, "\n") {
		if v, isVal := strings.CutPrefix(line, "\t"); isVal {
			if len(keys) == 0 || vals[len(vals)-1] != "" || v == "" || (v[0] != '=' && v != "-") {
				return 0, false, nil, nil, true, true // malformed
			}
			vals[len(vals)-1] = v
			continue
		}
		keys, vals = append(keys, line), append(vals, "")
	}
	return seq, final, keys, vals, false, true
}
