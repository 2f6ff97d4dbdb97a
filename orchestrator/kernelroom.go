package orchestrator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// The tenant's kernels: the quota a new kernel is claimed in, the idle
// kernel it may reclaim, and the list and actions of GET /kernels. See
// docs/DECISIONS.md, "Idle kernels are reclaimed at the quota".

// claim is the kernel quota's claim for a call of who in ow's run
// (kernels.Claim): a start that would take the tenant past its quota
// reclaims its least recently used idle kernel, which is stopped here,
// before the new kernel starts, and recorded in its run's journal.
func (o *Orchestrator) claim(who auth.Principal, ow tenancy.Owner) kernels.Claim {
	return func(ctx context.Context) (func(), error) {
		var taken *kernels.Session
		release, rec, err := o.t.ReserveKernel(who, ow, o.liveKernels, func(run runid.ID) bool {
			taken = o.kernels.TakeIdle(run)
			return taken != nil
		})
		if err != nil {
			return nil, err
		}
		if rec != nil {
			o.log.InfoContext(ctx, "reclaimed an idle kernel at the tenant's kernel quota; its files stay",
				"run", rec.Run, "for", rec.For, "tenant", rec.Tenant, "idle", rec.Idle)
			// Stopped before the new kernel starts, so the tenant's
			// sandboxes never outnumber its quota.
			o.kernels.Retire(rec.Run, taken)
			o.reclaimed(rec)
		}
		return release, nil
	}
}

// liveKernels lists the live kernels with their runs' tenants, for the
// kernel quota. A run with a live kernel stays in the run table (its
// owner cached there), so this reads nothing from the store.
func (o *Orchestrator) liveKernels() []tenancy.Kernel {
	var out []tenancy.Kernel
	for _, k := range o.kernels.List() {
		r, done := o.runs.use(k.Run)
		if ow, ok := o.kernelOwner(context.Background(), r); ok {
			out = append(out, tenancy.Kernel{Run: k.Run, Tenant: ow.Tenant, Busy: k.Busy, LastUsed: k.LastUsed})
		}
		done()
	}
	return out
}

// reclaimed records a kernel reclaimed from its run: the run's entry
// keeps the journal section until someone holds the run's lock, which
// writes it (writeReclaims) before anything else. A goroutine takes the
// lock now for that; a call of the run that takes it first writes the
// section before its step. The claimant never waits for the other run's
// lock.
func (o *Orchestrator) reclaimed(rec *tenancy.Reclaimed) {
	if o.j == nil {
		return
	}
	r, done := o.runs.use(rec.Run)
	r.mu.Lock()
	r.reclaims = append(r.reclaims, cel.Reclaim{When: rec.At, For: rec.For, Tenant: rec.Tenant, Limit: rec.Limit, Idle: rec.Idle})
	r.mu.Unlock()
	o.recording.Add(1)
	go func() {
		defer o.recording.Done()
		defer done()
		ctx := context.Background()
		held, err := o.lockRun(ctx, r) // writes the section
		if err != nil {
			o.log.WarnContext(ctx, "record a reclaimed kernel in its run's journal; its next call will", "run", r.id, "err", err)
			return
		}
		held.Unlock()
	}()
}

// writeReclaims writes the run's pending reclaim sections; the caller
// holds the run's lock. A section that cannot be written stays pending
// for the run's next holder.
func (o *Orchestrator) writeReclaims(ctx context.Context, r *run) {
	r.mu.Lock()
	pending := r.reclaims
	r.reclaims = nil
	r.mu.Unlock()
	for i, rc := range pending {
		err := o.appendSection(ctx, r, rc.When, "reclaim", func(ctx context.Context) ([]cel.Write, error) {
			return o.j.CEL().AppendReclaim(ctx, r.id, rc)
		})
		if err != nil {
			o.log.WarnContext(ctx, "record a reclaimed kernel in its run's journal; will try again", "run", r.id, "err", err)
			r.mu.Lock()
			r.reclaims = append(pending[i:], r.reclaims...)
			r.mu.Unlock()
			return
		}
	}
}

// usageTimeout bounds asking a backend what one kernel uses: past it,
// the kernel is listed with its use unknown.
const usageTimeout = 5 * time.Second

// Kernels lists the live kernels of the caller's tenant (the operator's:
// every tenant's), oldest first, with what each uses as its backend
// reports it, and the tenant's use of its kernel quota.
func (o *Orchestrator) Kernels(ctx context.Context) (wire.KernelList, error) {
	p := auth.From(ctx)
	if !p.Has(auth.Read) {
		return wire.KernelList{}, tenancy.Forbidden(p, auth.Read)
	}
	out := wire.KernelList{Kernels: []wire.LiveKernel{}}
	if o.kernels == nil {
		return out, nil
	}
	out.Backend = o.kernels.Backend()
	if !p.IsOperator() {
		out.Quota.Limit = o.t.KernelLimit()
	}
	out.Quota.Starting = o.t.Starting(p.Tenant)
	type item struct {
		run runid.ID
		lk  wire.LiveKernel
	}
	var items []item
	for _, t := range o.liveKernels() {
		if !p.IsOperator() && t.Tenant != p.Tenant {
			continue
		}
		out.Quota.Live++
		if t.Busy {
			out.Quota.Busy++
		}
		items = append(items, item{run: t.Run, lk: wire.LiveKernel{RunID: t.Run.String(), Tenant: t.Tenant}})
	}
	info := map[runid.ID]kernels.Info{}
	for _, k := range o.kernels.List() {
		info[k.Run] = k
	}
	var wg sync.WaitGroup
	for i := range items {
		k, ok := info[items[i].run]
		if !ok {
			continue // stopped since
		}
		lk := &items[i].lk
		lk.Started, lk.LastUsed, lk.Busy, lk.Contexts = k.Started.UTC(), k.LastUsed.UTC(), k.Busy, k.Contexts
		m, ok := k.Kernel.(sandbox.Meter)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			uctx, cancel := context.WithTimeout(ctx, usageTimeout)
			defer cancel()
			u, err := m.Usage(uctx)
			if err != nil {
				return // unknown: the kernel may have stopped since
			}
			if u.CPUTime >= 0 {
				cpu := u.CPUTime.Seconds()
				lk.CPUSeconds = &cpu
			}
			if u.MemoryBytes >= 0 {
				lk.MemoryBytes = &u.MemoryBytes
			}
		}()
	}
	wg.Wait()
	for _, it := range items {
		if !it.lk.Started.IsZero() {
			out.Kernels = append(out.Kernels, it.lk)
		}
	}
	slices.SortFunc(out.Kernels, func(a, b wire.LiveKernel) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	return out, nil
}

// The actions on a run's live kernel (KernelAction).
const (
	KernelInterrupt = "interrupt"
	KernelRestart   = "restart"
	KernelStop      = "stop"
)

// KernelAction interrupts the cells running in the run's live kernel,
// restarts it or stops it (its files stay, and the run's next cell
// starts a fresh kernel). Restart and stop interrupt first and then wait
// for the run's call in flight to end. A run the caller's tenant does not
// own, or without a live kernel, is not found.
func (o *Orchestrator) KernelAction(ctx context.Context, run runid.ID, action string) (wire.KernelAction, error) {
	out := wire.KernelAction{RunID: run.String()}
	if !slices.Contains([]string{KernelInterrupt, KernelRestart, KernelStop}, action) {
		return out, fault.Badf("send interrupt, restart or stop", "unknown kernel action %q", action)
	}
	if o.kernels == nil {
		return out, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, false); err != nil {
		return out, err
	}
	if o.kernels.Peek(run) == nil {
		return out, fault.New(fault.NotFound, fmt.Sprintf("run %s has no live kernel", run),
			"GET /kernels lists your live kernels; the run's next cell starts one")
	}
	out.Interrupted = o.kernels.Interrupt(run)
	switch action {
	case KernelRestart:
		if err := o.Restart(ctx, run); err != nil {
			return out, err
		}
	case KernelStop:
		if err := o.Stop(ctx, run); err != nil {
			return out, err
		}
	}
	out.OK = true
	return out, nil
}
