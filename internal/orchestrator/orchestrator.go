// Package orchestrator is the one path every tool call takes, whatever surface it came from (HTTP, MCP, recipes, CLI).
//
// For each call it resolves the run, serializes the call behind the run's
// earlier calls (the journal's single-writer policy), calls the tool, records
// the metadata (path, size, sha256) of every file the call produced or
// changed, and hands the finished step to the run's Recorders (the journal,
// the evaluator, the trace), in that order. There is no second path: a
// surface that bypassed this package would leave calls out of the journal.
package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/kernels"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Tool names, as the spec spells them.
const (
	ToolExec   = "sandbox.exec"
	ToolSearch = "browser.search"
	ToolWrite  = "tmp.write"
	ToolRead   = "tmp.read"
	ToolList   = "tmp.list"
	ToolDelete = "tmp.delete"
)

// Step is one finished tool call, as the journal, evaluator and trace see it.
type Step struct {
	Run  runid.ID
	Tool string
	// Inputs are the call's salient parameters: never secrets, and code is
	// shortened to a hash by the tool before it lands here.
	Inputs map[string]any
	// Artifacts are the files the call created or changed, with the
	// metadata the store reports for them.
	Artifacts []tmpfs.File
	// Err is the call's failure, if it failed.
	Err     error
	Started time.Time
	Elapsed time.Duration
	// Detail carries tool-specific facts for the evaluator (stderr, exit
	// status, expected outputs); keys are documented by each tool.
	Detail map[string]any
}

// Recorder is told about every finished step, in step order per run. The
// journal, the evaluator and the trace are Recorders. A Recorder's error is
// logged and does not fail the call: the tool's effect already happened.
type Recorder interface {
	Record(ctx context.Context, s *Step) error
}

// Orchestrator runs tool calls.
type Orchestrator struct {
	store     *tmpfs.Store
	kernels   *kernels.Manager
	exec      ExecConfig
	limits    Limits
	log       *slog.Logger
	recorders []Recorder

	runs sync.Map // runid.ID -> *sync.Mutex
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
	return &Orchestrator{store: c.Store, kernels: c.Kernels, exec: c.Exec, limits: c.Limits, log: c.Logger}
}

// AddRecorder appends r to the recorders every step is handed to.
func (o *Orchestrator) AddRecorder(r Recorder) { o.recorders = append(o.recorders, r) }

// Store returns the file store.
func (o *Orchestrator) Store() *tmpfs.Store { return o.store }

// Limits returns the configured limits.
func (o *Orchestrator) Limits() Limits { return o.limits }

// call is the orchestration path. fn performs the tool call and fills in the
// step's artifacts and detail; call does everything around it.
func (o *Orchestrator) call(ctx context.Context, run runid.ID, tool string, inputs map[string]any, fn func(ctx context.Context, s *Step) error) error {
	unlock := o.lockRun(run)
	defer unlock()
	s := &Step{Run: run, Tool: tool, Inputs: inputs, Started: time.Now().UTC(), Detail: map[string]any{}}
	s.Err = fn(ctx, s)
	s.Elapsed = time.Since(s.Started)
	// The journal must be written even if the caller hung up mid-call.
	rctx := context.WithoutCancel(ctx)
	for _, r := range o.recorders {
		if err := r.Record(rctx, s); err != nil {
			o.log.ErrorContext(rctx, "record step", "run", run, "tool", tool, "err", err)
		}
	}
	return s.Err
}

func (o *Orchestrator) lockRun(run runid.ID) func() {
	m, _ := o.runs.LoadOrStore(run, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}
