// Package orchestrator is the one path every tool call takes, whatever surface it came from (HTTP, MCP, E2B, the console, recipes, replays, the CLI).
//
// For each call it resolves the run once (its owner, the caller, the run's
// lock, the step's number, the caller's options) into one value that the
// tool takes, calls the tool, answers, and records what the call left
// under the run's lock: the metadata (path, size, sha256) of every file it
// produced or changed, the Step Block with the evaluator's verdict on its
// Evaluation line, the trace, the tenant's run index. There is no second
// path: a surface that bypassed this package would leave calls out of the
// journal.
//
// The rooms: the run table (run.go: what the process keeps of each run,
// one struct per run), package tenancy (owners, quotas, the run index,
// usage), package journal (recording and crash recovery), package kernels
// (the run's kernel), and the tools here, each a call's body.
package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/tmpfs"
)

// Orchestrator runs tool calls.
type Orchestrator struct {
	store   *tmpfs.Store
	kernels *kernels.Manager
	exec    ExecConfig
	limits  Limits
	log     *slog.Logger
	j       *journal.Journal // nil records nothing
	t       *tenancy.Tenancy
	search  browser.Provider
	replay  bool // every run's searches replay its records
	lock    RunLock
	runs    *table
	files   mirror
	setups  setups
	metrics hooks

	// recording counts the calls that answered and are being recorded;
	// commands, the background commands running. Close waits for both.
	recording sync.WaitGroup
	commands  sync.WaitGroup
	stopCmds  context.Context // cancelled by Close: running commands are killed
	stopAll   context.CancelFunc
	closeOnce sync.Once

	// regrade grades ungraded steps again in the background; nil
	// without a journal.
	regrade *regrader

	ownerLookups countingLookups
	// sb is the runs' sandboxes: templates, and the egress sessions of
	// runs whose kernels reach the network (egress.go).
	sb *sandboxes

	// deleteHooks are the surfaces' parts of deleting a run, and keep the
	// background retention and collection (delete.go); nil when off.
	deleteHooks []DeleteHook
	keep        *keeper
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

// Quotas bound what one tenant may use (see tenancy.Quotas).
type Quotas = tenancy.Quotas

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
	// Replica names this process (a pod's name) in the record of a call
	// in progress, so a call a crash interrupted says whose it was.
	Replica string
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

// New returns an Orchestrator. Close stops what it started.
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
	o := &Orchestrator{store: c.Store, kernels: c.Kernels, exec: c.Exec, limits: c.Limits, log: c.Logger, search: c.Search,
		replay: c.Replay, lock: c.RunLock, metrics: hooks{c.Metrics}}
	o.stopCmds, o.stopAll = context.WithCancel(context.Background())
	o.files = mirror{store: c.Store, kernels: c.Kernels, log: c.Logger}
	o.sb = &sandboxes{templates: c.Templates, proxy: c.Egress, trust: c.EgressTrust, imageDigest: c.ImageDigest,
		kernels: c.Kernels, store: c.Store, log: c.Logger}
	o.setups = setups{store: c.Store, kernels: c.Kernels, files: o.files, sb: o.sb}
	var tm tenancy.Metrics
	var jm journal.Metrics
	if c.Metrics != nil {
		tm, jm = c.Metrics, c.Metrics
	}
	o.t = tenancy.New(tenancy.Config{Store: c.Store, Quotas: c.Quotas, Logger: c.Logger, Metrics: tm})
	if c.Journal != nil {
		o.j = journal.New(journal.Config{Store: c.Store, CEL: c.Journal, Evaluator: c.Evaluator, Logger: c.Logger, Metrics: jm,
			Holder: c.Replica})
		o.regrade = newRegrader(o)
	}
	// A run idle in the table stays while its kernel is live (the
	// session knows the working directory) or its index entry is still
	// to be written (which reads the run's files); once evicted, what
	// other caches hold of it goes too.
	keep := func(id runid.ID) bool { return o.t.Pending(id) || o.kernels != nil && o.kernels.Peek(id) != nil }
	evicted := func(id runid.ID) {
		o.sb.drop(id)
		o.store.Forget(id)
		if o.j != nil {
			o.j.CEL().Forget(id)
		}
		if f, ok := o.lock.(interface{ Forget(runid.ID) }); ok {
			f.Forget(id)
		}
	}
	o.runs = newTable(c.RunIdle, keep, evicted)
	if o.kernels != nil {
		o.kernels.OnUsed(o.used)
	}
	return o
}

// Close reads the live kernels for their runs' accounting, closes the
// runs' egress sessions and waits for their serve loops, kills the background commands still running (their ends are
// recorded), waits for the calls being recorded, stops the run table's
// sweep and writes what calls left pending in the tenants' index; call
// it before closing the store. The orchestrator's calls still work after
// it, but nothing is swept or written in the background any more. Close
// is safe to call twice.
func (o *Orchestrator) Close() error {
	o.closeOnce.Do(func() {
		if o.kernels != nil {
			// What the live kernels used since their last reading, while
			// it can still be recorded (the kernels outlive this).
			o.kernels.MeterAll(context.Background())
		}
		o.keep.close()
		o.sb.close()
		o.stopAll()
		o.commands.Wait()
		o.regrade.close() // its steps stay ungraded, to be found again
		o.recording.Wait()
		o.runs.close()
	})
	return o.t.Close()
}

// Limits returns the configured limits.
func (o *Orchestrator) Limits() Limits { return o.limits }

// Caches counts what the process keeps in memory by run now.
func (o *Orchestrator) Caches() RunCaches {
	c := RunCaches{InUse: o.runs.len(), Store: o.store.Cached(), Other: o.t.Cached()}
	if o.j != nil {
		c.Journal = o.j.CEL().Cached()
	}
	if l, ok := o.lock.(interface{ Len() int }); ok {
		c.Other += l.Len()
	}
	return c
}
