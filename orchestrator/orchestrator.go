// Package orchestrator is the one path every tool call takes, whatever surface it came from (HTTP, MCP, recipes, CLI).
//
// For each call it resolves the run, serializes the call behind the run's
// earlier calls (the journal's single-writer policy), calls the tool, records
// the metadata (path, size, sha256) of every file the call produced or
// changed, appends the Step Block to CEL.md with the evaluator's verdict on
// its Evaluation line, and records the trace, in that order. There is no second path: a
// surface that bypassed this package would leave calls out of the journal.
package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Orchestrator runs tool calls.
type Orchestrator struct {
	store   *tmpfs.Store
	kernels *kernels.Manager
	exec    ExecConfig
	limits  Limits
	log     *slog.Logger
	j       *journal
	search0 browser.Provider
	t       *tenancy
	metrics hooks
	feed    feed

	rmu         sync.Mutex
	replayAll   bool
	replayRuns  map[runid.ID]bool
	replayCount map[runid.ID]map[string]int // replayed calls per request key
	replaySrc   map[runid.ID]runid.ID       // runs whose searches replay another run's records

	smu    sync.Mutex
	setups map[runid.ID]wire.RunSetup // seed and as_of per run, set or loaded
	fresh  map[runid.ID]bool          // runs whose kernel restarted since their last cell

	cmds sync.Map // runid.ID -> *cmdCounter
	lock RunLock
}

// Limits bound what a single call may move.
type Limits struct {
	// JSONBody caps JSON request bodies and inline file contents (tmp.write
	// text/bytes_b64, tmp.read answers).
	JSONBody int64
	// StreamBody caps a streamed upload.
	StreamBody int64
}

// DefaultLimits are the limits when none are configured.
var DefaultLimits = Limits{JSONBody: 32 << 20, StreamBody: 5 << 30}

// Config configures an Orchestrator.
type Config struct {
	Store *tmpfs.Store
	// Kernels runs sandbox.exec; nil leaves the sandbox off.
	Kernels *kernels.Manager
	Exec    ExecConfig
	Limits  Limits
	Logger  *slog.Logger
	// Journal keeps CEL.md, trace.jsonl and the rest; nil records nothing
	// (only for tests of the tools themselves).
	Journal *cel.Journal
	// Evaluator grades every step; nil writes a FAIL line that says so.
	Evaluator *evaluator.Evaluator
	// Search answers browser.search; nil answers not_configured.
	Search browser.Provider
	// Replay answers every run's searches from its recorded citations.
	Replay bool
	// Quotas bound each tenant; the zero value is unlimited.
	Quotas Quotas
	// Metrics receives the path's events; nil records none.
	Metrics Metrics
	// RunLock keeps each run's single writer; nil means InProcess. Give a
	// lock shared by every replica when several serve one store.
	RunLock RunLock
}

// New returns an Orchestrator.
func New(c Config) *Orchestrator {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Limits.JSONBody == 0 {
		c.Limits.JSONBody = DefaultLimits.JSONBody
	}
	if c.Limits.StreamBody == 0 {
		c.Limits.StreamBody = DefaultLimits.StreamBody
	}
	c.Exec.defaults()
	if c.RunLock == nil {
		c.RunLock = &InProcess{}
	}
	o := &Orchestrator{store: c.Store, kernels: c.Kernels, exec: c.Exec, limits: c.Limits, log: c.Logger,
		search0: c.Search, replayAll: c.Replay, replayRuns: map[runid.ID]bool{}, replayCount: map[runid.ID]map[string]int{},
		replaySrc: map[runid.ID]runid.ID{}, setups: map[runid.ID]wire.RunSetup{}, fresh: map[runid.ID]bool{},
		t: newTenancy(c.Quotas), metrics: hooks{c.Metrics}, lock: c.RunLock}
	if c.Journal != nil {
		o.j = &journal{cel: c.Journal, eval: c.Evaluator, cites: map[runid.ID]map[string]bool{}, meta: map[runid.ID]cel.Header{}}
	}
	return o
}

// Store returns the file store.
func (o *Orchestrator) Store() *tmpfs.Store { return o.store }

// Limits returns the configured limits.
func (o *Orchestrator) Limits() Limits { return o.limits }

// call is the orchestration path. fn performs the tool call, filling in
// the step's artifacts and its outcome's facts; call does everything
// around it: the caller's right to the run (its scope, its tenant, the
// tenant's stored-bytes quota), the run lock (and, under a shared lock,
// the call in progress recorded on it), timing, and recording (Step
// Block with the evaluator's verdict, trace, evaluations, artifact index,
// the tenant's run index). A call refused before it starts (another
// tenant's run, a scope or quota) is not recorded: it never touched the
// run.
func (o *Orchestrator) call(ctx context.Context, run runid.ID, out Outcome, fn func(ctx context.Context, s *Step) error) error {
	start := time.Now()
	ow, err := o.access(ctx, run, scopeOf(out.Tool()), true)
	if err == nil && scopeOf(out.Tool()) == auth.Runs && out.Tool() != ToolDelete {
		var add int64
		if t, ok := out.(*TmpOutcome); ok {
			add = int64(t.Bytes)
		}
		err = o.checkBytes(ctx, ow, add)
	}
	if err != nil {
		o.metrics.toolCall(out.Tool(), outcome(err), time.Since(start))
		return err
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		o.metrics.toolCall(out.Tool(), outcome(err), time.Since(start))
		return err
	}
	defer held.Unlock()
	s := &Step{Run: run, Outcome: out, Started: time.Now().UTC()}
	o.begin(ctx, held, s)
	s.Err = fn(ctx, s)
	s.Elapsed = time.Since(s.Started)
	// The journal must be written even if the caller hung up mid-call.
	wctx := context.WithoutCancel(ctx)
	o.record(wctx, s)
	objective := o.objective(run)
	o.noteRun(wctx, run, func(sum *summary) {
		sum.Steps++
		if sum.Objective == "" {
			sum.Objective = objective
		}
		if s.verdict != nil {
			sum.LastVerdict = "FAIL"
			sum.Failed++
			if s.verdict.Pass {
				sum.LastVerdict = "PASS"
				sum.Passed++
				sum.Failed--
			}
		}
	})
	o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
	return s.Err
}

// scopeOf is the scope a tool needs: reading a run's files needs read,
// everything else runs.
func scopeOf(tool string) auth.Scope {
	if tool == ToolRead || tool == ToolList {
		return auth.Read
	}
	return auth.Runs
}

// outcome labels a call's result for metrics: "ok" or its error's kind.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return string(fault.From(err).Kind)
}
