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
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/crashpoint"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox/template"
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

	pend pending  // runs whose last call answered and is being recorded
	cmds sync.Map // runid.ID -> *cmdCounter
	lock RunLock

	runs runs // which runs are in use; idle ones are dropped (idle.go)

	templates   *template.Set
	egress      *egress.Proxy
	egressTrust []byte
	imageDigest func(ctx context.Context, ref string) (string, error)
	eg          egressRuns // runs whose sandboxes reach the network (egress.go)
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
	// RunIdle is how long a run with no call in flight and no live kernel
	// keeps what this process caches of it in memory; zero means
	// DefaultRunIdle. Its next use reads it back from the store.
	RunIdle time.Duration
	// Templates are the sandbox templates runs choose from; nil offers
	// only the default (the backend's image, its limits, no egress).
	Templates *template.Set
	// Egress is the proxy through which the kernels of runs with an
	// egress policy reach the network; nil means no run may have one.
	Egress *egress.Proxy
	// EgressTrust holds extra CA certificates (PEM) that the kernels of
	// runs with egress trust beyond their image's (an internal mirror's).
	EgressTrust []byte
	// ImageDigest returns the engine's id of an image, recorded per run;
	// nil records none.
	ImageDigest func(ctx context.Context, ref string) (string, error)
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
	if c.RunIdle <= 0 {
		c.RunIdle = DefaultRunIdle
	}
	o := &Orchestrator{store: c.Store, kernels: c.Kernels, exec: c.Exec, limits: c.Limits, log: c.Logger,
		search0: c.Search, replayAll: c.Replay, replayRuns: map[runid.ID]bool{}, replayCount: map[runid.ID]map[string]int{},
		replaySrc: map[runid.ID]runid.ID{}, setups: map[runid.ID]wire.RunSetup{}, fresh: map[runid.ID]bool{},
		t: newTenancy(c.Quotas), metrics: hooks{c.Metrics}, lock: c.RunLock,
		runs:      runs{idle: c.RunIdle, use: map[runid.ID]*runUse{}},
		templates: c.Templates, egress: c.Egress, egressTrust: c.EgressTrust, imageDigest: c.ImageDigest}
	if c.Journal != nil {
		o.j = &journal{cel: c.Journal, eval: c.Evaluator, cites: map[runid.ID]map[string]bool{}, meta: map[runid.ID]cel.Header{},
			views: map[runid.ID]*view{}, recovered: map[runid.ID]bool{}}
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
// the call in progress recorded on it), timing, a step-started marker,
// and recording (Step Block with the evaluator's verdict, trace,
// evaluations, artifact index, the tenant's run index). Recording runs
// after call returns, under the run's lock, so the run's next call waits
// for it, on this replica or another (see pending.go). A call refused
// before it starts (another
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
	s := &Step{Run: run, Outcome: out, Started: time.Now().UTC()}
	// The journal must be written even if the caller hung up mid-call.
	wctx := context.WithoutCancel(ctx)
	if o.j == nil {
		s.Err = fn(ctx, s)
		s.Elapsed = time.Since(s.Started)
		o.finish(wctx, s)
		held.Unlock()
		o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
		return s.Err
	}
	o.begin(wctx, held, s)
	marked := o.markStep(wctx, s)
	s.Err = fn(ctx, s)
	s.Elapsed = time.Since(s.Started)
	marked()
	if stepInfo(ctx).Receipt != nil {
		// The caller (the recipe runner) reads the verdict from the
		// receipt as soon as the call returns: record first.
		o.finish(wctx, s)
		held.Unlock()
		o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
		return s.Err
	}
	// Answer now; record before the run's lock is released, so the run's
	// next call starts after the verdict is written, and readers settle
	// on it (see pending.go). The bytes the call stored count against
	// the tenant's quota at once, before any other call is admitted.
	o.noteRun(wctx, run, nil, func(*summary) {})
	ch := o.pend.begin(run)
	hold := crashpoint.Hold()
	go func() {
		defer o.pend.end(run, ch)
		defer held.Unlock()
		if hold {
			select {} // the process is about to die: see internal/crashpoint
		}
		o.finish(wctx, s)
	}()
	o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
	return s.Err
}

// finish records a step that ran: its Step Block with the evaluator's
// verdict, its trace and evaluation lines (record), then the run's
// summary. Whatever publishes a finished step goes after record, which
// sets its verdict.
func (o *Orchestrator) finish(ctx context.Context, s *Step) {
	o.record(ctx, s)
	objective := o.objective(s.Run)
	o.noteRun(ctx, s.Run, s.touched(), func(sum *summary) {
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
