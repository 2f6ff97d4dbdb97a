package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/tmpfs"
)

// Deleting a run is one path, whoever asks (DELETE /runs/{id}, the
// retention, a deletion a crash interrupted): deleteRun. It takes the
// run's lock, writes the tombstone (tenancy.MarkDeleted: from then on the
// run is not found on every surface, and its id is never a run again),
// stops its kernel and egress session, runs the surfaces' hooks (share
// links, an E2B sandbox's record), deletes its files from its index and
// its records outside it, and ends with tenancy.FinishDelete. Every step
// is idempotent, so a crash midway leaves the deletion recorded as in
// progress, and the next keeper pass finishes it. The run's blobs are not
// touched: another run may hold the same bytes; the collection (Collect)
// removes those no run holds. See docs/DECISIONS.md, "Deleting runs and
// collecting blobs".

// DeleteHook is a surface's part of deleting a run: what it keeps about
// the run outside the core (share links, an E2B sandbox's record). It is
// called after the run is not found any more, and again if a crash
// interrupted the deletion, so it must be idempotent.
type DeleteHook func(ctx context.Context, run runid.ID) error

// OnDelete adds a hook every deletion runs. Call it while wiring, before
// the orchestrator serves.
func (o *Orchestrator) OnDelete(h DeleteHook) {
	o.deleteHooks = append(o.deleteHooks, h)
}

// DeleteRun deletes a run of the caller's tenant (an admin may delete any
// tenant's): its kernel is stopped, its files and records removed, and
// from then on it is not found anywhere. Another tenant's run, a run that
// does not exist and a deleted run are not found.
func (o *Orchestrator) DeleteRun(ctx context.Context, id runid.ID) error {
	r, done := o.runs.use(id)
	defer done()
	ow, err := o.access(ctx, r, auth.Runs, false)
	if err != nil {
		return err
	}
	return o.deleteRun(context.WithoutCancel(ctx), r, ow)
}

// deleteRun is the one path of a deletion (see above).
func (o *Orchestrator) deleteRun(ctx context.Context, r *run, ow tenancy.Owner) error {
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	if o.kernels != nil {
		// What it used until now stays in its tenant's sums.
		o.kernels.Meter(ctx, r.id)
	}
	if err := o.t.MarkDeleted(ctx, ow); err != nil {
		return storeErr(err, r.id, "")
	}
	r.mu.Lock()
	r.owner, r.owned = tenancy.Owner{}, false
	r.mu.Unlock()
	if o.kernels != nil {
		o.kernels.Drop(r.id)
	}
	o.sb.drop(r.id)
	for _, h := range o.deleteHooks {
		if err := h(ctx, r.id); err != nil {
			return storeErr(fmt.Errorf("delete run %s: %w", r.id, err), r.id, "")
		}
	}
	files, err := o.store.List(ctx, r.id, "")
	if err != nil {
		return storeErr(err, r.id, "")
	}
	for _, f := range files {
		if err := o.store.Delete(ctx, r.id, f.Path); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return storeErr(err, r.id, f.Path)
		}
	}
	if err := o.store.Meta().DeleteMeta(ctx, "journal/"+r.id.String()+"/started"); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return storeErr(err, r.id, "")
	}
	if err := o.t.FinishDelete(ctx, ow); err != nil {
		return storeErr(err, r.id, "")
	}
	o.forget(r, true)
	o.log.InfoContext(ctx, "run deleted", "run", r.id, "tenant", ow.Tenant)
	return nil
}

// KeepConfig sets what the keeper does in the background of a server.
type KeepConfig struct {
	// Retain deletes runs whose last activity is older than this; zero
	// keeps every run.
	Retain time.Duration
	// Every is how often a pass runs: deletions a crash interrupted,
	// the retention, then a collection of blobs. Zero: no keeper.
	Every time.Duration
	// Grace is how long a blob no run holds stays before a collection
	// may remove it: far longer than any write takes between storing a
	// blob and linking it (default 6 hours). At least ten times
	// tmpfs.FreshenAge.
	Grace time.Duration
}

// DefaultGrace is KeepConfig.Grace when it is zero.
const DefaultGrace = 6 * time.Hour

// KeepReport sums up a keeper pass.
type KeepReport struct {
	Resumed int // deletions a crash had interrupted, finished
	Retired int // runs the retention deleted
	tmpfs.CollectReport
}

// keeper runs Keep every KeepConfig.Every until Close.
type keeper struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// StartKeeper starts the background passes; Close stops them. Call it
// once, after wiring.
func (o *Orchestrator) StartKeeper(c KeepConfig) {
	if c.Every <= 0 {
		return
	}
	k := &keeper{stop: make(chan struct{}), done: make(chan struct{})}
	o.keep = k
	go func() {
		defer close(k.done)
		tick := time.NewTicker(c.Every)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-k.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			rep, err := o.Keep(ctx, c)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				o.log.Error("keeper pass failed", "err", err)
			} else if err == nil {
				o.log.Info("keeper pass done", "resumed", rep.Resumed, "retired", rep.Retired, "blobs_removed", rep.Removed, "bytes_removed", rep.Bytes)
			}
			select {
			case <-k.stop:
				return
			case <-tick.C:
			}
		}
	}()
}

func (k *keeper) close() {
	if k == nil {
		return
	}
	k.once.Do(func() {
		close(k.stop)
		<-k.done
	})
}

// Keep runs one keeper pass now: it finishes the deletions a crash
// interrupted, deletes the runs the retention no longer keeps, and
// collects the blobs no run holds that were stored before now minus the
// grace period. `triad gc` and the server's keeper call it.
func (o *Orchestrator) Keep(ctx context.Context, c KeepConfig) (KeepReport, error) {
	var rep KeepReport
	pending, err := o.t.PendingDeletes(ctx)
	if err != nil {
		return rep, fmt.Errorf("list deletions in progress: %w", err)
	}
	for _, ow := range pending {
		if err := o.deleteByOwner(ctx, ow); err != nil {
			return rep, err
		}
		rep.Resumed++
	}
	if c.Retain > 0 {
		stale, err := o.t.Stale(ctx, time.Now().Add(-c.Retain))
		if err != nil {
			return rep, fmt.Errorf("list runs past retention: %w", err)
		}
		for _, ow := range stale {
			if err := o.deleteByOwner(ctx, ow); err != nil {
				return rep, err
			}
			rep.Retired++
		}
	}
	grace := c.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	cr, err := o.store.Collect(ctx, tmpfs.CollectOptions{Before: time.Now().Add(-grace)})
	rep.CollectReport = cr
	return rep, err
}

// deleteByOwner deletes a run the keeper found, as its owner's tenant.
func (o *Orchestrator) deleteByOwner(ctx context.Context, ow tenancy.Owner) error {
	r, done := o.runs.use(ow.Run)
	defer done()
	if err := o.deleteRun(ctx, r, ow); err != nil {
		return fmt.Errorf("delete run %s: %w", ow.Run, err)
	}
	return nil
}
