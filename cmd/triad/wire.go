package main

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
)

// stack is everything a command that makes tool calls needs, opened from
// the config and closed in reverse.
type stack struct {
	store   *tmpfs.Store
	backend string // the sandbox's name, "" for none
	orch    *orchestrator.Orchestrator
	catalog *recipes.Catalog
	// runner runs recipes; nil when there is no sandbox.
	runner *runner.Runner
	closes []func()
}

func (s *stack) Close() {
	for i := len(s.closes) - 1; i >= 0; i-- {
		s.closes[i]()
	}
}

// orchMetrics is the orchestrator's view of the metrics, nil without.
func orchMetrics(c *config) orchestrator.Metrics {
	if c.metrics == nil {
		return nil
	}
	return c.metrics
}

// open makes the command's logger and opens its stack.
func open(ctx context.Context, c *config) (*stack, *slog.Logger, error) {
	log := newLogger(c)
	st, err := openStack(ctx, c, log)
	return st, log, err
}

// openStack opens the store, the sandbox, the search provider, the journal
// and the evaluator, and joins them in an orchestrator.
func openStack(ctx context.Context, c *config, log *slog.Logger) (*stack, error) {
	s := &stack{}
	store, closeStore, err := openStore(ctx, c, log)
	if err != nil {
		return nil, err
	}
	s.store = store
	s.closes = append(s.closes, closeStore)
	backend, err := openSandbox(ctx, c, log, os.Stderr)
	if err != nil {
		s.Close()
		return nil, err
	}
	var km *kernels.Manager
	if backend != nil {
		s.closes = append(s.closes, func() { backend.Close() })
		counted := backend
		if c.metrics != nil {
			counted = c.metrics.Backend(backend)
		}
		starts := c.Sandbox.startsFor(backend.Name())
		km = kernels.New(kernels.Config{Backend: counted, Store: store, Warm: c.Sandbox.Warm, Starts: starts, IdleTTL: c.Sandbox.IdleTTL,
			MeterEvery: c.Sandbox.UsageEvery, Limits: c.Sandbox.limits(), Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint, Logger: log})
		if c.metrics != nil {
			c.metrics.Kernels(backend.Name(), km.Live, km.Pooled)
		}
		s.closes = append(s.closes, func() { km.Close() })
		log.Info("sandbox ready", "backend", backend.Name(), "warm", c.Sandbox.Warm, "kernel_starts", starts)
		s.backend = backend.Name()
	}
	search, err := tavily.New(tavily.Config{APIKey: os.Getenv("TAVILY_API_KEY"), BaseURL: c.TavilyURL, Logger: log})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.closes = append(s.closes, func() { search.Close() })
	if !search.Configured() {
		log.Warn("browser.search is not configured: set TAVILY_API_KEY to enable it; every other tool works")
	}
	eval, closeEval, err := openEvaluator(ctx, c, store, log)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.closes = append(s.closes, closeEval)
	var em egress.Metrics
	if c.metrics != nil {
		em = c.metrics
	}
	choice, err := openTemplates(ctx, c, backend, em, log, os.Stderr)
	if err != nil {
		s.Close()
		return nil, err
	}
	lock, replica, closeLock, err := runLock(c, backend, log)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.closes = append(s.closes, closeLock)
	s.orch = orchestrator.New(orchestrator.Config{
		RunLock:   lock,
		Replica:   replica,
		Store:     store,
		Kernels:   km,
		Exec:      orchestrator.ExecConfig{DefaultTimeout: c.Sandbox.CellTimeout, MaxTimeout: c.Sandbox.MaxCellTimeout},
		Limits:    orchestrator.Limits{JSONBody: c.MaxJSONBytes, StreamBody: c.MaxStreamBytes},
		Logger:    log,
		Journal:   cel.New(store),
		Evaluator: eval,
		Search:    search,
		Replay:    c.ReplaySearches,
		Quotas: orchestrator.Quotas{Kernels: c.Quotas.Kernels, StoredBytes: c.Quotas.storedBytes, RunsPerHour: c.Quotas.RunsPerHour,
			Uploads: c.Quotas.Uploads},
		Metrics: orchMetrics(c),

		Templates:   choice.templates,
		Egress:      choice.proxy,
		EgressTrust: choice.trust,
		ImageDigest: choice.digest,
	})
	// The run index's last changes are written before the store closes.
	s.closes = append(s.closes, func() { s.orch.Close() })
	if s.catalog, err = catalog(c.Recipes); err != nil {
		s.Close()
		return nil, err
	}
	// Compiling python.wasm (on a cold cache) leaves ~100 MiB of garbage
	// that the runtime would hand back to the OS only slowly; hand it back
	// now, once, so a fresh server's footprint is its working set.
	debug.FreeOSMemory()
	if s.backend != "" {
		s.runner = runner.New(runner.Config{Orchestrator: s.orch, Catalog: s.catalog, Backend: s.backend, Logger: log})
		s.closes = append(s.closes, func() { s.runner.Close() })
		if c.metrics != nil {
			c.metrics.ActiveRuns(s.runner.Active)
		}
	}
	return s, nil
}
