package daemon

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/llm/ollama"
)

// modelServer is the node's agent.ModelServer: it makes a model present in
// the runtime, loads it and switches the deployment API to it. Only the
// runtime concern's loop calls Serve, one call at a time.
type modelServer struct {
	nd *node
	// served is the runtime of the model the API serves, once one is.
	served modelRuntime
	// first is closed when the first model is served: readiness waits
	// for it.
	first     chan struct{}
	firstOnce sync.Once
}

// Serve implements agent.ModelServer.
func (ms *modelServer) Serve(ctx context.Context, model string, progress func(agent.Progress)) error {
	nd := ms.nd
	if ms.served != nil && model == nd.api.Model() {
		// The runtime lost the model the API serves: load it again.
		nd.status("reloading model " + model)
		if err := ms.served.EnsureModel(ctx, ms.source(model, progress)); err != nil {
			return err
		}
		if err := ms.warm(ctx, ms.served, model); err != nil {
			return err
		}
		nd.api.SetWarm(true)
		nd.runtimeBack() // a restart, if one took it, is over
		nd.status("serving " + model)
		return nil
	}
	rt := nd.rt.ForModel(model)
	old := ms.served
	if old == nil {
		nd.status("loading model " + model)
	} else {
		nd.status("switching to model " + model)
	}
	// Present first (a pull may take long): the old model serves on.
	if err := rt.EnsureModel(ctx, ms.source(model, progress)); err != nil {
		return err
	}
	err := nd.api.Switch(ctx, model, rt, nd.cfg.ShutdownTimeout, func(ctx context.Context) error {
		return ms.warm(ctx, rt, model)
	})
	if err != nil {
		if old != nil {
			nd.status("serving " + nd.api.Model())
		}
		return err
	}
	ms.served = rt
	if old != nil {
		nd.status("serving " + model)
		// The previous model must not keep its memory.
		uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := old.Unload(uctx); err != nil {
			nd.log.Warn("unload the previous model", "err", err)
		}
		cancel()
	}
	ms.firstOnce.Do(func() { close(ms.first) })
	return nil
}

func (ms *modelServer) warm(ctx context.Context, rt modelRuntime, model string) error {
	took, err := rt.Warm(ctx)
	if err != nil {
		return err
	}
	ms.nd.m.SetModelLoadDuration(took)
	ms.nd.log.Info("model loaded", "model", model, "seconds", took.Seconds())
	return nil
}

// source says where model comes from when the runtime lacks it: the
// configured model is created from --model-gguf when set; any other is
// pulled by name, its progress reported.
func (ms *modelServer) source(model string, progress func(agent.Progress)) ollama.ModelSource {
	cfg := ms.nd.cfg
	src := ollama.ModelSource{Progress: func(status string, completed, total int64) {
		progress(agent.Progress{Status: status, Completed: completed, Total: total})
	}}
	if model == cfg.Model && cfg.ModelGGUF != "" {
		src.GGUFPath, src.Parameters, src.Template = cfg.ModelGGUF, cfg.ModelParams, ms.nd.modelTemplate
	}
	return src
}

// readModelTemplate reads --model-template once, at start-up.
func readModelTemplate(cfg Config) (string, error) {
	if cfg.ModelTemplate == "" {
		return "", nil
	}
	b, err := os.ReadFile(cfg.ModelTemplate)
	if err != nil {
		return "", fmt.Errorf("config model-template: %w", err)
	}
	return string(b), nil
}
