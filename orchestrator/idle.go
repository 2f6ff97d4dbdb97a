package orchestrator

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// What the process keeps about a run in memory (its owner, its setup, its
// file index, its journal's step count, its citations, its command count,
// its replay counts) is a cache of what the store holds, kept while the run
// is in use. A run is idle once it has had no call in flight, and no live
// kernel, for Config.RunIdle; the sweep then drops all of it, and the run's
// next use reads it back from the store, as a replica does after another
// one held the run. So the server's memory grows with the runs in use, not
// with every run it has served. See docs/DECISIONS.md, "The run's memory".

// DefaultRunIdle is how long an unused run keeps its in-memory state when
// Config.RunIdle is zero.
const DefaultRunIdle = time.Minute

// runUse is a run's use of this process: calls in flight, and when the
// last one ended.
type runUse struct {
	calls int
	last  time.Time
}

// runs tracks which runs are in use, for the idle sweep.
type runs struct {
	idle time.Duration

	mu       sync.Mutex // taken before any lock of the caches the sweep drops
	use      map[runid.ID]*runUse
	sweeping bool
}

// use marks run in use until the returned func is called.
func (o *Orchestrator) use(run runid.ID) (done func()) {
	o.runs.mu.Lock()
	u := o.touchLocked(run)
	u.calls++
	o.runs.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			o.runs.mu.Lock()
			u.calls--
			u.last = time.Now()
			o.runs.mu.Unlock()
		})
	}
}

// touch notes a use of run outside a call (a read, a setting), so that
// what it cached is swept in its turn.
func (o *Orchestrator) touch(run runid.ID) {
	o.runs.mu.Lock()
	o.touchLocked(run)
	o.runs.mu.Unlock()
}

func (o *Orchestrator) touchLocked(run runid.ID) *runUse {
	u := o.runs.use[run]
	if u == nil {
		u = &runUse{}
		o.runs.use[run] = u
	}
	u.last = time.Now()
	if !o.runs.sweeping {
		o.runs.sweeping = true
		go o.sweeper()
	}
	return u
}

// sweeper drops idle runs until no run is left in use, then ends; the
// next use starts it again.
func (o *Orchestrator) sweeper() {
	every := max(o.runs.idle/4, 10*time.Millisecond)
	for {
		time.Sleep(every)
		if !o.sweepIdle(time.Now()) {
			return
		}
	}
}

// sweepIdle drops every run idle at now and reports whether any run is
// left in use; when none is, the sweeper is marked stopped.
func (o *Orchestrator) sweepIdle(now time.Time) bool {
	o.runs.mu.Lock()
	defer o.runs.mu.Unlock()
	for run, u := range o.runs.use {
		if u.calls > 0 || now.Sub(u.last) <= o.runs.idle {
			continue
		}
		o.t.smu.Lock()
		_, summing := o.t.sums[run]
		o.t.smu.Unlock()
		if summing {
			// Its index entry is still to be written (summaries.go),
			// which reads the run's files: in use a little longer.
			continue
		}
		if o.kernels != nil && o.kernels.Peek(run) != nil {
			// A live kernel (its reaper stops it once idle) keeps the
			// run's state: its session knows the working directory.
			continue
		}
		// Dropped with runs.mu held, so no call of the run starts
		// meanwhile: the drop is in memory only, and quick.
		o.drop(run)
		delete(o.runs.use, run)
	}
	if len(o.runs.use) == 0 {
		o.runs.sweeping = false
		return false
	}
	return true
}

// drop forgets everything this process keeps about run in memory. The run
// has no call in flight and no live kernel. Only the settings that exist
// nowhere else stay: a run replaying searches keeps its replay state, and
// a run's code contexts stay with the kernel manager (both are made only
// on request, a few per run).
func (o *Orchestrator) drop(run runid.ID) {
	o.forget(run, false)
	if o.j != nil {
		o.j.mu.Lock()
		delete(o.j.meta, run)
		o.j.mu.Unlock()
	}
	o.smu.Lock()
	delete(o.setups, run)
	delete(o.fresh, run)
	o.smu.Unlock()
	o.cmds.Delete(run)
	o.rmu.Lock()
	if !o.replayRuns[run] {
		delete(o.replayRuns, run)
		delete(o.replayCount, run)
		delete(o.replaySrc, run)
	}
	o.rmu.Unlock()
	o.t.mu.Lock()
	delete(o.t.owners, run)
	o.t.mu.Unlock()
	o.t.smu.Lock()
	delete(o.t.listed, run) // the next flush marks all its files again
	o.t.smu.Unlock()
	if f, ok := o.lock.(interface{ Forget(runid.ID) }); ok {
		f.Forget(run)
	}
}

// RunCaches counts what the process keeps in memory by run, for tests and
// for an operator who wants to see that it stays bounded.
type RunCaches struct {
	// InUse is the runs the idle sweep tracks: used within Config.RunIdle,
	// or with a call in flight or a live kernel.
	InUse int
	// Store is the runs whose file index (or an index lock) is in memory.
	Store int
	// Journal is the runs whose journal state is in memory.
	Journal int
	// Other is the entries of the orchestrator's other per-run maps:
	// owners, setups, replay state, citations, run info, command counts.
	Other int
}

// Total is every entry counted.
func (c RunCaches) Total() int { return c.InUse + c.Store + c.Journal + c.Other }

// Caches counts what the process keeps in memory by run now.
func (o *Orchestrator) Caches() RunCaches {
	var c RunCaches
	o.runs.mu.Lock()
	c.InUse = len(o.runs.use)
	o.runs.mu.Unlock()
	c.Store = o.store.Cached()
	if o.j != nil {
		c.Journal = o.j.cel.Cached()
		o.j.mu.Lock()
		c.Other += len(o.j.cites) + len(o.j.meta) + len(o.j.views) + len(o.j.recovered)
		o.j.mu.Unlock()
	}
	o.smu.Lock()
	c.Other += len(o.setups) + len(o.fresh)
	o.smu.Unlock()
	o.cmds.Range(func(any, any) bool { c.Other++; return true })
	o.rmu.Lock()
	c.Other += len(o.replayRuns) + len(o.replayCount) + len(o.replaySrc)
	o.rmu.Unlock()
	o.t.mu.Lock()
	c.Other += len(o.t.owners)
	o.t.mu.Unlock()
	o.t.smu.Lock()
	c.Other += len(o.t.listed)
	o.t.smu.Unlock()
	if l, ok := o.lock.(interface{ Len() int }); ok {
		c.Other += l.Len()
	}
	return c
}

// commandsSoFar is the highest number a background command of the run was
// given, from its trace, for a command counter the sweep dropped: numbers
// go on from there.
func (o *Orchestrator) commandsSoFar(ctx context.Context, run runid.ID) int {
	tr, err := o.trace(ctx, run)
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range tr {
		c, _ := r.Inputs["command"].(string)
		if num, ok := strings.CutSuffix(c, " started in the background"); ok {
			if k, err := strconv.Atoi(strings.TrimPrefix(num, "#")); err == nil {
				n = max(n, k)
			}
		}
	}
	return n
}
