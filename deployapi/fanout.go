package deployapi

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/hearthd/hearth/llm"
)

// choiceStream is the generations of one request (its n choices, or its
// prompts) as one sequence of events, each tagged with the index of the
// generation it belongs to. Each generation's last event has Done set;
// after every generation's, Recv returns io.EOF. Any other error ends the
// whole sequence.
type choiceStream interface {
	Recv() (choice int, ev llm.Event, err error)
	// Buffered reports whether the next Recv returns at once, so the relay
	// can batch ready events into one write.
	Buffered() bool
	Close() error
}

// single is a choiceStream over one generation, choice 0: the common case
// costs no goroutine and no channel.
type single struct {
	s   llm.Stream
	buf llm.Buffered // s's, or nil
}

func newSingle(s llm.Stream) *single {
	b, _ := s.(llm.Buffered)
	return &single{s: s, buf: b}
}

func (s *single) Recv() (int, llm.Event, error) {
	ev, err := recvSafe(s.s)
	return 0, ev, err
}

func (s *single) Buffered() bool { return s.buf != nil && s.buf.Buffered() }
func (s *single) Close() error   { return s.s.Close() }

// fanout merges k generations into one choiceStream: a goroutine per
// generation reads its events and hands them, tagged, to the one reader.
// Each goroutine owns its generation (Recv and Close never race); Close
// stops them all through their context.
type fanout struct {
	events chan tagged
	stop   chan struct{}
	cancel context.CancelFunc // of the generations' context
	live   int                // generations whose last event the reader has not had yet
	wg     sync.WaitGroup
	once   sync.Once
}

type tagged struct {
	i   int
	ev  llm.Event
	err error
}

// newFanout starts relaying gens, generation i as choice i; cancel ends
// their context.
func newFanout(gens []llm.Stream, cancel context.CancelFunc) *fanout {
	f := &fanout{events: make(chan tagged, 16*len(gens)), stop: make(chan struct{}), cancel: cancel, live: len(gens)}
	f.wg.Add(len(gens))
	for i, g := range gens {
		go f.pump(i, g)
	}
	return f
}

func (f *fanout) pump(i int, g llm.Stream) {
	defer f.wg.Done()
	defer g.Close()
	for {
		ev, err := recvSafe(g)
		if errors.Is(err, io.EOF) {
			ev, err = llm.Event{Done: true}, nil // ended without a final event
		}
		select {
		case f.events <- tagged{i, ev, err}:
		case <-f.stop:
			return
		}
		if err != nil || ev.Done {
			return
		}
	}
}

func (f *fanout) Recv() (int, llm.Event, error) {
	if f.live == 0 {
		return 0, llm.Event{}, io.EOF
	}
	t := <-f.events
	if t.err != nil {
		f.live = 0
		return t.i, t.ev, t.err
	}
	if t.ev.Done {
		f.live--
	}
	return t.i, t.ev, nil
}

func (f *fanout) Buffered() bool { return len(f.events) > 0 }

// Close stops the generations still running and waits for their
// goroutines.
func (f *fanout) Close() error {
	f.once.Do(func() {
		close(f.stop)
		f.cancel()
		f.wg.Wait()
	})
	return nil
}

// startChoices starts n generations with start, at once (each may wait on
// the runtime reading the prompt), generation i as choice i. If any fails,
// the others are closed and the first failure (by index) is returned: the
// caller answers it before its response starts. Then ended(i, err) has
// been called for every generation, with the error of those that failed
// to start and nil for those closed, so the caller can settle each one's
// slot.
func startChoices(ctx context.Context, n int, start func(ctx context.Context, i int) (llm.Stream, error),
	ended func(i int, err error)) (choiceStream, error) {
	if n == 1 {
		s, err := startSafe(func() (llm.Stream, error) { return start(ctx, 0) })
		if err != nil {
			ended(0, err)
			return nil, err
		}
		return newSingle(s), nil
	}
	ctx, cancel := context.WithCancel(ctx)
	gens := make([]llm.Stream, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		go func() {
			defer wg.Done()
			gens[i], errs[i] = startSafe(func() (llm.Stream, error) { return start(ctx, i) })
		}()
	}
	wg.Wait()
	var first error
	for i, err := range errs {
		if err != nil {
			ended(i, err)
			if first == nil {
				first = err
			}
		}
	}
	if first == nil {
		return newFanout(gens, cancel), nil
	}
	defer cancel()
	for i, g := range gens {
		if g != nil {
			_ = g.Close()
			ended(i, nil)
		}
	}
	return nil, first
}
