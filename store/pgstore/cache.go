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
// listens applies them in commit order, so its cache holds, for every key
// in it, the value as of the last commit it applied (seq): a record read
// from the database is kept only if the read saw that same commit. Such a
// cache is current exactly when seq is the database's sequence, which a
// process knows for certain only while it holds the writer lock (no one
// else can commit then): reads answer from it during a held section, and
// otherwise only where a moment's lag is allowed (Store.Lagging).

// invPrefix starts an invalidation's payload: "inv:<seq>:<part>\n" then
// the keys written, one per line, or "*" for every key. A commit writing
// more keys than one notification carries sends several parts; the last
// is marked "f" and advances seq.
const invPrefix = "inv:"

// maxInvPayload keeps each payload under PostgreSQL's 8 000-byte limit.
const maxInvPayload = 7000

// maxCached bounds the cache; past it the cache starts over.
const maxCached = 1 << 17

type cache struct {
	mu sync.Mutex
	// on is set while the listener is connected and seq is a baseline
	// read after its LISTEN took effect.
	on  bool
	seq uint64
	// held is the sequence at which this process holds the writer lock
	// and has not committed yet, or 0.
	held uint64
	recs map[string]cached
	// advanced is closed (and replaced) whenever seq moves (catchUp).
	advanced chan struct{}
}

type cached struct {
	val   []byte
	found bool
}

// lookup answers key from the cache when allowed: with min nil only if
// the cache is current (held == seq), else if it has applied min.
func (c *cache) lookup(key string, min *uint64) (cached, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return cached{}, false
	}
	if min == nil {
		if c.held == 0 || c.held != c.seq {
			return cached{}, false
		}
	} else if c.seq < *min {
		return cached{}, false
	}
	r, ok := c.recs[key]
	return r, ok
}

// fill keeps a record read from the database as of commit at, if that is
// the commit the cache is at.
func (c *cache) fill(key string, r cached, at uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on || at != c.seq {
		return
	}
	if c.recs == nil || len(c.recs) >= maxCached {
		c.recs = make(map[string]cached)
	}
	c.recs[key] = r
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

// committed applies this process's own commit at once, if the cache is at
// the commit before it, or already at it (the commit's invalidation can
// reach the listener before the committer reads its answer): the values
// it wrote (putK[i] → putV[i], delK gone) are the records as of seq, so
// they are kept rather than evicted, and reading back what was just
// written costs no round trip. Otherwise the invalidation catches the
// cache up later.
func (c *cache) committed(seq uint64, putK, putV, delK [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on || (seq != c.seq+1 && seq != c.seq) {
		return
	}
	if c.recs == nil || len(c.recs)+len(putK)+len(delK) > maxCached {
		c.recs = make(map[string]cached)
	}
	for i, k := range putK {
		c.recs[string(k)] = cached{val: putV[i], found: true}
	}
	for _, k := range delK {
		c.recs[string(k)] = cached{}
	}
	c.seq = seq
	c.moved()
}

func (c *cache) evict(keys []string, all bool) {
	if all {
		c.recs = nil
		return
	}
	for _, k := range keys {
		delete(c.recs, k)
	}
}

// start begins caching from the database's sequence base, read after the
// listener's LISTEN took effect; stop ends it when the listener is lost.
func (c *cache) start(base uint64) {
	c.mu.Lock()
	c.on, c.seq, c.recs = true, base, nil
	c.mu.Unlock()
}

func (c *cache) stop() {
	c.mu.Lock()
	c.on, c.recs = false, nil
	c.moved()
	c.mu.Unlock()
}

// apply handles an invalidation; ok is false for any other payload.
func (c *cache) apply(payload string) (ok bool) {
	seq, final, keys, all, ok := parseInv(payload)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq == 0 {
		c.recs = nil // malformed: no key can be trusted
		return true
	}
	switch {
	case !c.on || seq == c.seq:
		return true // applied already: this process's own commit
	case seq < c.seq:
		// The sequence went back: the database was restored from a
		// backup (or, just after start, a commit from before the
		// baseline). Nothing cached can be trusted.
		if final {
			c.recs, c.seq = nil, seq
			c.moved()
		}
		return true
	}
	if final && seq != c.seq+1 {
		all = true // a commit was missed
	}
	c.evict(keys, all)
	if final {
		c.seq = seq
		c.moved()
	}
	return true
}

// invParts builds the payload tails of a commit's invalidation (what
// follows "inv:<seq>"), in as many parts as its keys need. Keys that are
// not printable ASCII, which a notification could not carry, invalidate
// everything.
func invParts(keys []string) []string {
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
	for _, k := range keys {
		if b.Len() > 0 && b.Len()+1+len(k) > maxInvPayload {
			flush(false)
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
	}
	flush(true)
	return parts
}

func parseInv(p string) (seq uint64, final bool, keys []string, all bool, ok bool) {
	rest, ok := strings.CutPrefix(p, invPrefix)
	if !ok {
		return 0, false, nil, false, false
	}
	head, body, _ := strings.Cut(rest, "\n")
	num, tag, _ := strings.Cut(head, ":")
	seq, err := strconv.ParseUint(num, 10, 64)
	if err != nil || seq == 0 {
		return 0, false, nil, true, true // malformed (apply starts over)
	}
	final = tag == "f"
	if body == "*" {
		return seq, final, nil, true, true
	}
	if body != "" {
		keys = strings.Split(body, "\n")
	}
	return seq, final, keys, false, true
}
