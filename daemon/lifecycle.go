package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/oklog/run"
)

// phase orders the shutdown: the components of a phase are told to stop
// only once every component of the earlier phases has returned.
type phase int

const (
	// phaseFront is what faces clients: the deployment API (which drains
	// in-flight streams when told to stop) and the model's readiness.
	phaseFront phase = iota
	// phaseBack is what keeps serving while the API drains: the node agent,
	// key usage, the admin socket, metrics, the watchdog, certificates.
	phaseBack
	// phaseRuntime is the supervised model runtime: in-flight streams need
	// it until the very end.
	phaseRuntime
	numPhases
)

// component is one long-running part of the node.
type component struct {
	name  string
	phase phase
	// run works until ctx ends, then cleans up and returns.
	run func(ctx context.Context) error
	// critical components stop the node when they return on their own; the
	// node's Run returns their error. Any other component that returns
	// early is logged ("<name> stopped") and the node goes on without it,
	// as hearthd always has for, say, an enrollment the control plane
	// refused.
	critical bool
}

// group runs the node's components as one oklog/run group (as Prometheus
// runs its own): an actor per component plus one for ctx. The first actor
// to return stops the group; shutdown then goes phase by phase, and run
// returns only once every component has returned, so what the components
// share (the store, the key ring) can be closed after it.
type group struct {
	log   *slog.Logger
	comps []component
}

func (g *group) add(c component) { g.comps = append(g.comps, c) }

// run runs every component until ctx ends or a critical component returns,
// then stops them all. It returns nil when ctx ended, or the critical
// component's error.
func (g *group) run(ctx context.Context) error {
	var rg run.Group
	stop := make(chan struct{})
	var once sync.Once
	interrupt := func(error) { once.Do(func() { close(stop) }) }
	rg.Add(func() error {
		select {
		case <-ctx.Done():
		case <-stop:
		}
		return nil
	}, interrupt)

	var phases [numPhases]sync.WaitGroup
	for _, c := range g.comps {
		phases[c.phase].Add(1)
	}
	for _, c := range g.comps {
		rg.Add(func() error {
			defer phases[c.phase].Done()
			return g.execute(c, stop, phases[:c.phase])
		}, interrupt)
	}
	return rg.Run()
}

// execute runs one component as an actor: until it returns on its own or
// the group stops, and then, once the earlier phases are done, stops it.
func (g *group) execute(c component, stop <-chan struct{}, earlier []sync.WaitGroup) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.run(ctx) }()
	select {
	case err := <-done:
		if c.critical {
			if err == nil {
				err = fmt.Errorf("%s stopped", c.name)
			}
			return err
		}
		if err != nil {
			g.log.Error(c.name+" stopped", "err", err)
		}
		<-stop
		return nil
	case <-stop:
	}
	for i := range earlier {
		earlier[i].Wait()
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		g.log.Warn(c.name+" stopped with an error", "err", err)
	}
	return nil
}
