package kernels

import (
	"context"
	"math"
	"slices"
	"sync"

	"github.com/triadhq/triad/sandbox"
)

// admission lets a bounded number of kernel starts run at once and serves
// the runs waiting for one in the order they came (FIFO). Starting every
// run of a burst at once shares the cores among all the starts, so each
// run waits about as long as the whole burst. In order, the first runs get
// their kernels after about one start's time, and the warm cells of runs
// already going compete with a few starts instead of all of them. The pool
// filler takes a slot only when no run is waiting and no run's start is
// under way: a run's start comes before a pooled kernel nobody has asked
// for yet, and a refill started beside the last runs of a burst would
// take CPU from the starts they wait for. Unbounded it never makes a run
// wait. On a shared host few starts get a small fair
// share of the CPU. See docs/DECISIONS.md, "Kernel start admission".
type admission struct {
	mu    sync.Mutex
	free  int
	runs  int             // slots held by runs' starts (the rest by the filler)
	queue []chan struct{} // waiting runs, oldest first; closed when granted
}

// newAdmission admits n starts at once; n ≤ 0 admits every start at once.
func newAdmission(n int) *admission {
	if n <= 0 {
		n = math.MaxInt
	}
	return &admission{free: n}
}

// acquire waits for a start slot, in arrival order, or until ctx is done
// or take (if not nil) yields a kernel, which it returns instead: a kernel
// the pool receives while a run waits serves that run at once.
func (a *admission) acquire(ctx context.Context, take <-chan sandbox.Kernel) (sandbox.Kernel, error) {
	a.mu.Lock()
	if a.free > 0 && len(a.queue) == 0 {
		a.free--
		a.runs++
		a.mu.Unlock()
		return nil, nil
	}
	ch := make(chan struct{})
	a.queue = append(a.queue, ch)
	a.mu.Unlock()
	select {
	case <-ch:
		return nil, nil
	case k := <-take:
		a.leave(ch)
		return k, nil
	case <-ctx.Done():
		a.leave(ch)
		return nil, ctx.Err()
	}
}

// leave takes a waiter out of the queue, or hands its slot on when it was
// granted meanwhile.
func (a *admission) leave(ch chan struct{}) {
	a.mu.Lock()
	if i := slices.Index(a.queue, ch); i >= 0 {
		a.queue = slices.Delete(a.queue, i, i+1)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	a.releaseRun()
}

// tryAcquire takes a slot for the pool's filler, only if one is free, no
// run is waiting and no run's start is under way.
func (a *admission) tryAcquire() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.free > 0 && len(a.queue) == 0 && a.runs == 0 {
		a.free--
		return true
	}
	return false
}

// release ends the filler's start (tryAcquire).
func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.grant()
}

// releaseRun ends a run's start (acquire).
func (a *admission) releaseRun() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs--
	a.grant()
}

// grant gives a slot just given up to the oldest waiting run, or frees it.
func (a *admission) grant() {
	if len(a.queue) > 0 {
		close(a.queue[0])
		a.queue = a.queue[1:]
		a.runs++
		return
	}
	a.free++
}

// waiting is how many runs wait for a start slot.
func (a *admission) waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue)
}
