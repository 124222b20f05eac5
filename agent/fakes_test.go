package agent_test

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/nodeapi"
)

// fakeModels is a ModelServer over an imaginary runtime: the models in
// present are there, any other is "pulled" (with progress) unless it is
// in missing; fail makes Serve of a model fail, hold makes Serve wait.
type fakeModels struct {
	mu      sync.Mutex
	present map[string]bool
	missing map[string]bool
	fail    map[string]error
	hold    chan struct{} // non-nil: Serve waits for it to close (or ctx)
	served  string
	serves  []string // every Serve, in order
	pulling chan string
}

func newFakeModels(present ...string) *fakeModels {
	f := &fakeModels{present: map[string]bool{}, missing: map[string]bool{}, fail: map[string]error{},
		pulling: make(chan string, 100)}
	for _, m := range present {
		f.present[m] = true
	}
	return f
}

func (f *fakeModels) Serve(ctx context.Context, model string, progress func(agent.Progress)) error {
	f.mu.Lock()
	f.serves = append(f.serves, model)
	err, hold := f.fail[model], f.hold
	present, missing := f.present[model], f.missing[model]
	f.mu.Unlock()
	if !present {
		progress(agent.Progress{Status: "pulling manifest"})
		if missing {
			return errors.New("pull model " + model + ": file does not exist")
		}
		progress(agent.Progress{Status: "pulling 6a0746a1ec1a", Completed: 50, Total: 100})
		f.pulling <- model
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.present[model] = true
	f.served = model
	return nil
}

func (f *fakeModels) set(apply func(f *fakeModels)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	apply(f)
}

func (f *fakeModels) Serves() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.serves)
}

func (f *fakeModels) Served() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.served
}

// fakeAPIKeys records the managed sets and wipes it is given, and counts
// usage for the managed keys it holds.
type fakeAPIKeys struct {
	mu     sync.Mutex
	keys   []nodeapi.APIKey
	wipes  int
	usage  map[string]uint64 // requests per key
	failed error
}

func newFakeAPIKeys() *fakeAPIKeys { return &fakeAPIKeys{usage: map[string]uint64{}} }

func (k *fakeAPIKeys) SetManaged(_ context.Context, keys []nodeapi.APIKey) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failed != nil {
		return k.failed
	}
	k.keys = slices.Clone(keys)
	for id := range k.usage {
		if !slices.ContainsFunc(keys, func(a nodeapi.APIKey) bool { return a.ID == id }) {
			delete(k.usage, id)
		}
	}
	return nil
}

func (k *fakeAPIKeys) Wipe(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys, k.usage = nil, map[string]uint64{}
	k.wipes++
	return nil
}

// use counts a request with key id.
func (k *fakeAPIKeys) use(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.usage[id]++
}

func (k *fakeAPIKeys) Usage() []nodeapi.KeyUsage {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []nodeapi.KeyUsage
	for _, key := range k.keys {
		out = append(out, nodeapi.KeyUsage{ID: key.ID, Requests: k.usage[key.ID]})
	}
	return out
}

func (k *fakeAPIKeys) IDs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []string
	for _, key := range k.keys {
		ids = append(ids, key.ID)
	}
	return ids
}

func (k *fakeAPIKeys) Wipes() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.wipes
}
