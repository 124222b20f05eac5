package pgstore

// DBReads is how many point reads went to the database so far.
func (s *Store) DBReads() int64 { return s.dbReads.Load() }

// DBLists is how many whole-prefix reads went to the database so far.
func (s *Store) DBLists() int64 { return s.dbLists.Load() }

// CacheSeq is the last commit the cache applied, and whether it is on.
func (s *Store) CacheSeq() (uint64, bool) {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	return s.cache.seq, s.cache.on
}

// DBSeq is the database's commit sequence now.
func (s *Store) DBSeq() uint64 {
	ctx, cancel := s.ctx()
	defer cancel()
	var seq int64
	if err := s.pool.QueryRow(ctx, "SELECT seq FROM hearth_lock WHERE id = 1").Scan(&seq); err != nil {
		panic(err)
	}
	return uint64(seq)
}

// HoldReader takes one of the read pool's connections until release.
func (s *Store) HoldReader() (release func()) {
	ctx, cancel := s.ctx()
	defer cancel()
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	return c.Release
}

// Conns is how many connections the read and writer pools hold open.
func (s *Store) Conns() (reads, writers int32) {
	return s.pool.Stat().TotalConns(), s.writers.Stat().TotalConns()
}

// WriterConns is the writer pool's size.
const WriterConns = writerConns
