package orchestrator

import (
	"context"

	"github.com/triadhq/triad/internal/keyedmutex"
	"github.com/triadhq/triad/internal/runid"
)

// RunLock keeps a run's single writer: one call at a time per run, so that
// its steps are numbered 1..n with no gaps and CEL.md is appended in
// order. The default (InProcess) serializes calls within this process,
// which is all a lone Triad needs; replicas sharing a store and a cluster
// use one lock across all of them (orchestrator/kubelease, a Lease per
// run). A holder that dies mid-call needs nothing of the lock: its call's
// call-in-progress record is in the store every replica shares, and the
// next holder records it as interrupted (package journal). See
// docs/DECISIONS.md, "Several replicas" and "One recovery".
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
	// Unlock releases the run.
	Unlock()
}

// InProcess is the default RunLock: a mutex per run. Nothing else writes
// the run, so nothing is ever stale.
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

func (h heldMutex) Stale() bool { return false }
func (h heldMutex) Unlock()     { h.unlock() }
