package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/keyedmutex"
	"github.com/triadhq/triad/internal/runid"
)

// RunLock keeps a run's single writer: one call at a time per run, so that
// its steps are numbered 1..n with no gaps and CEL.md is appended in
// order. The default (InProcess) serializes calls within this process,
// which is all a lone Triad needs; replicas sharing a store and a cluster
// use one lock across all of them (orchestrator/kubelease, a Lease per
// run). See docs/DECISIONS.md, "Several replicas".
type RunLock interface {
	// Lock waits until this process holds run. A lock shared by several
	// processes bounds the wait and fails with a fault of kind conflict
	// that says who holds the run.
	Lock(ctx context.Context, run runid.ID) (Held, error)
	// Changed reports whether another process may have written run since
	// this one last held it, so that a read outside a call (the journal,
	// the run's status) must not be served from what this process
	// caches. It does not wait.
	Changed(ctx context.Context, run runid.ID) bool
}

// Held is a run held by this process.
type Held interface {
	// Stale reports that another process held the run since this one
	// last did: whatever this process caches about the run (the
	// journal's step count, the file index, the kernel session's view of
	// its working directory) must be read again.
	Stale() bool
	// Orphan returns the call that a previous holder began (Begin) and
	// never finished: it died mid-call.
	Orphan() (Pending, bool)
	// Begin records the call about to run, so that if this process dies
	// before Unlock the next holder can record it as interrupted.
	Begin(ctx context.Context, p Pending) error
	// Unlock releases the run.
	Unlock()
}

// Pending describes a call in progress, as its holder recorded it.
type Pending struct {
	// Step is the number its Step Block was going to have.
	Step    int            `json:"step"`
	Tool    string         `json:"tool"`
	Inputs  []PendingInput `json:"inputs,omitempty"`
	Started time.Time      `json:"started"`
	// Holder names the process that began it (set by the lock).
	Holder string `json:"holder,omitempty"`
}

// PendingInput is one of a pending call's salient inputs (Input), its
// value as JSON.
type PendingInput struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// InProcess is the default RunLock: a mutex per run. Nothing else writes
// the run, so nothing is ever stale or orphaned.
type InProcess struct {
	runs keyedmutex.Map[runid.ID] // only the runs held or awaited
}

// Lock implements RunLock. Like the mutex it is, it waits as long as it
// takes.
func (l *InProcess) Lock(_ context.Context, run runid.ID) (Held, error) {
	return heldMutex{l.runs.Lock(run)}, nil
}

// Changed implements RunLock: never.
func (l *InProcess) Changed(context.Context, runid.ID) bool { return false }

// Len is the number of runs held or awaited now.
func (l *InProcess) Len() int { return l.runs.Len() }

type heldMutex struct{ unlock func() }

// usedHeld is a run held for a call: the run is in use (not idle, for the
// sweep) until Unlock.
type usedHeld struct {
	Held
	done func()
}

func (h usedHeld) Unlock() {
	h.Held.Unlock()
	h.done()
}

func (h heldMutex) Stale() bool                          { return false }
func (h heldMutex) Orphan() (Pending, bool)              { return Pending{}, false }
func (h heldMutex) Begin(context.Context, Pending) error { return nil }
func (h heldMutex) Unlock()                              { h.unlock() }

// lockRun takes the run for a call or a journal operation. When another
// process held it since this one did, what this process caches about the
// run is dropped first; when the last holder died mid-call, that call's
// Step Block is appended, marked interrupted, before anything else. The
// dead holder's call is known two ways, and recorded once: from the lock
// (a shared lock's Begin) and from the step-started marker (recoverRun,
// see pending.go). Each records step n only while the journal's next
// step is n, so whichever comes second finds it recorded.
func (o *Orchestrator) lockRun(ctx context.Context, run runid.ID) (Held, error) {
	done := o.use(run)
	h, err := o.lock.Lock(ctx, run)
	if err != nil {
		done()
		return nil, err
	}
	h = usedHeld{h, done}
	if h.Stale() {
		o.forget(run, true)
	}
	wctx := context.WithoutCancel(ctx)
	if p, ok := h.Orphan(); ok {
		o.recordOrphan(wctx, run, p)
	}
	if o.j != nil {
		o.recoverRun(wctx, run)
	}
	return h, nil
}

// refresh drops what this process caches about run's records when another
// process may have written them, before a read outside a call.
func (o *Orchestrator) refresh(ctx context.Context, run runid.ID) {
	if o.lock.Changed(ctx, run) {
		o.forget(run, false)
	}
}

// forget drops this process's caches of run: the store's index, the
// journal's step count and notes, the citations, and (with kernel) the
// kernel session, whose view of the working directory is stale; its
// kernel is let go of, not stopped, and is adopted again by the next call.
func (o *Orchestrator) forget(run runid.ID, kernel bool) {
	o.store.Forget(run)
	if o.j != nil {
		o.j.cel.Forget(run)
		o.j.mu.Lock()
		delete(o.j.cites, run)
		// Another process may have left a step-started marker since, and
		// recorded steps the evaluator's view of the run does not have.
		delete(o.j.recovered, run)
		delete(o.j.views, run)
		o.j.mu.Unlock()
	}
	if kernel && o.kernels != nil {
		o.kernels.Forget(run)
	}
	o.dropEgress(run)
}

// begin tells the lock which call is about to run, for a successor should
// this process die before the call is recorded.
func (o *Orchestrator) begin(ctx context.Context, h Held, s *Step) {
	if o.j == nil {
		return
	}
	n, _, err := o.j.cel.Next(ctx, s.Run)
	if err != nil {
		return // record will fail the same way, and say so
	}
	p := Pending{Step: n, Tool: s.Outcome.Tool(), Started: s.Started}
	for _, in := range s.Outcome.Inputs() {
		v, err := json.Marshal(in.Value)
		if err == nil {
			p.Inputs = append(p.Inputs, PendingInput{Key: in.Key, Value: v})
		}
	}
	if err := h.Begin(ctx, p); err != nil {
		o.log.WarnContext(ctx, "record the call in progress on the run lock", "run", s.Run, "err", err)
	}
}

// recordOrphan appends the Step Block of a call whose process died before
// recording it, marked interrupted, unless that block was written after
// all (the process died between recording and unlocking).
func (o *Orchestrator) recordOrphan(ctx context.Context, run runid.ID, p Pending) {
	if o.j == nil {
		return
	}
	n, _, err := o.j.cel.Next(ctx, run)
	if err != nil {
		o.log.ErrorContext(ctx, "read the journal to record an interrupted call", "run", run, "err", err)
		return
	}
	if p.Step < n {
		return // recorded before its process died
	}
	o.log.WarnContext(ctx, "recording a call whose replica died mid-call as interrupted", "run", run, "step", n, "tool", p.Tool, "holder", p.Holder)
	s := &Step{
		Run:     run,
		Outcome: &interruptedOutcome{p: p},
		Started: p.Started,
		Err: fault.New(fault.Unavailable,
			fmt.Sprintf("the call was interrupted: the Triad replica serving it (%s) stopped before it finished", p.Holder),
			"repeat the call if it is still needed; files the call changed before the interruption are recorded by the next sandbox.exec"),
	}
	o.record(ctx, s)
}

// interruptedOutcome is the part of an interrupted call's Step that
// survived: its tool and inputs.
type interruptedOutcome struct{ p Pending }

// Tool implements Outcome.
func (i *interruptedOutcome) Tool() string { return i.p.Tool }

// Inputs implements Outcome.
func (i *interruptedOutcome) Inputs() []Input {
	out := make([]Input, 0, len(i.p.Inputs))
	for _, in := range i.p.Inputs {
		var v any
		if json.Unmarshal(in.Value, &v) == nil {
			out = append(out, Input{Key: in.Key, Value: v})
		}
	}
	return out
}

func (i *interruptedOutcome) grade(req *evaluator.Request) { req.OK = false }

func (i *interruptedOutcome) describe(*Step) (did, next []string, failed bool) {
	return []string{"Interrupted: the call started but was never finished; its outcome is unknown"}, nil, true
}
