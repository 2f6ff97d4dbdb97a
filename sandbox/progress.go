package sandbox

import (
	"context"
	"fmt"
	"time"
)

// MinProgress is the CPU time a booting kernel must use in each
// ProgressWindow, once its quiet-machine time is up, for WhileProgressing
// to keep waiting. A kernel starved on a loaded machine still gets its
// share of a core (tens of milliseconds a second at a load of 50 on two
// cores); a kernel that is stuck (waiting on nothing, deadlocked) uses none.
const MinProgress = 20 * time.Millisecond

// ProgressWindow is how often WhileProgressing samples the CPU time.
const ProgressWindow = 20 * time.Second

// WhileProgressing bounds a wait (a kernel's boot) by progress rather than
// by the clock: the returned context ends with ctx, or when, after quiet
// (how long the wait takes on a quiet machine, times a margin), the CPU
// time that used reports grows by less than MinProgress within one
// ProgressWindow. A deadline load can miss fails healthy kernels on a busy
// machine; this one fails only kernels that stopped working. A failed
// sample (the container is going away) ends nothing: whoever watches the
// kernel's exit does. See docs/DECISIONS.md, "Boots bounded by progress".
func WhileProgressing(ctx context.Context, quiet time.Duration, used func(context.Context) (time.Duration, error)) (context.Context, context.CancelFunc) {
	return whileProgressing(ctx, quiet, ProgressWindow, used)
}

func whileProgressing(ctx context.Context, quiet, window time.Duration, used func(context.Context) (time.Duration, error)) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTimer(quiet)
		defer t.Stop()
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
		start := time.Now().Add(-quiet)
		last, lastOK := time.Duration(0), false
		if u, err := used(wctx); err == nil {
			last, lastOK = u, true
		}
		tick := time.NewTicker(window)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			u, err := used(wctx)
			if err != nil {
				lastOK = false
				continue
			}
			if lastOK && u-last < MinProgress {
				cancel(fmt.Errorf("%w: it used %s of CPU in the last %s, %s after it began: it is stuck, not slow",
					ErrStalled, (u - last).Round(time.Millisecond), window, time.Since(start).Round(time.Second)))
				return
			}
			last, lastOK = u, true
		}
	}()
	return wctx, func() { cancel(context.Canceled) }
}

// ErrStalled is the cause of a wait WhileProgressing ended.
var ErrStalled = fmt.Errorf("the kernel made no progress")
