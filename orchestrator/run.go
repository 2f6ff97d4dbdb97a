package orchestrator

import (
	"sync"
	"time"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/wire"
)

// What the process keeps about a run in memory (its owner, its setup, the
// journal's view of it, its command count, its replay settings, its
// subscribers) lives in one struct per run, in one table, with one lock,
// one idle clock and one eviction. It is a cache of what the store holds,
// kept while the run is in use: a run is idle once it has had no call or
// read in flight, no live kernel, no subscriber and nothing waiting to be
// written for Config.RunIdle, and the table's sweep then drops it; its
// next use reads it back from the store, as a replica does after another
// one held the run. So the server's memory grows with the runs in use,
// not with every run it has served. See docs/DECISIONS.md, "The run's
// memory".

// DefaultRunIdle is how long an unused run keeps its in-memory state when
// Config.RunIdle is zero.
const DefaultRunIdle = time.Minute

// run is one run's in-memory state.
type run struct {
	id runid.ID

	// mu guards every field but journal.
	mu    sync.Mutex
	calls int       // uses in flight: calls, reads
	last  time.Time // when the last use ended, for the idle clock

	owner    tenancy.Owner // valid when owned
	owned    bool
	setup    *wire.RunSetup // as set or recorded, nil until known
	fresh    bool           // its kernel restarted since its last cell
	header   *cel.Header    // recipe and objective, set before its first call
	replay   *replaying     // nil: the server's default
	replayed map[string]int // replayed searches per request key
	commands int            // background commands numbered so far
	counted  bool           // commands is read from the trace
	marked   bool           // every file's blob marked for its tenant once
	// recovered is true once this process looked for a call a crash
	// interrupted in the run (journal.Interrupted).
	recovered bool
	// recording is closed once the last call that answered is recorded;
	// nil when nothing is pending (see call).
	recording chan struct{}
	subs      map[chan Update]struct{}
	// reclaims are the journal sections of kernels reclaimed from the
	// run, not yet written: whoever next holds the run's lock writes
	// them (lockRun), before anything else it does.
	reclaims []cel.Reclaim

	// journal is used only by the call that holds the run's lock.
	journal journal.Cache
}

// replaying is a run's search replay setting.
type replaying struct {
	on  bool
	src runid.ID // the run whose records answer; zero: its own
}

// table holds the runs in use. Its sweep is started by newTable and
// stopped by close.
type table struct {
	idle time.Duration
	// keep reports whether something else still needs a run kept (a live
	// kernel, index writes pending); asked by the sweep, with no lock held.
	keep func(runid.ID) bool
	// drop is called for each run the sweep evicts, after it left the
	// table, to drop what other caches hold of it.
	drop func(runid.ID)

	mu   sync.Mutex
	runs map[runid.ID]*run

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newTable(idle time.Duration, keep func(runid.ID) bool, drop func(runid.ID)) *table {
	t := &table{idle: idle, keep: keep, drop: drop, runs: map[runid.ID]*run{}, stop: make(chan struct{}), done: make(chan struct{})}
	go t.sweeper()
	return t
}

// close stops the sweep; it is safe to call twice.
func (t *table) close() {
	t.once.Do(func() {
		close(t.stop)
		<-t.done
	})
}

// use returns the run's entry, made if missing, marked in use until done
// is called.
func (t *table) use(id runid.ID) (r *run, done func()) {
	t.mu.Lock()
	r = t.runs[id]
	if r == nil {
		r = &run{id: id}
		t.runs[id] = r
	}
	// The count is taken under the table's lock, so the sweep, which
	// evicts under it, never drops a run a use is starting on.
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	t.mu.Unlock()
	var once sync.Once
	return r, func() {
		once.Do(func() {
			r.mu.Lock()
			r.calls--
			r.last = time.Now()
			r.mu.Unlock()
		})
	}
}

// peek returns the run's entry if the table has it.
func (t *table) peek(id runid.ID) *run {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runs[id]
}

// sweeper evicts idle runs every idle/4 until close.
func (t *table) sweeper() {
	defer close(t.done)
	tick := time.NewTicker(max(t.idle/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.sweep(now)
		}
	}
}

// sweep evicts every run idle at now.
func (t *table) sweep(now time.Time) {
	t.mu.Lock()
	var idle []*run
	for _, r := range t.runs {
		if r.idleAt(now, t.idle) {
			idle = append(idle, r)
		}
	}
	t.mu.Unlock()
	for _, r := range idle {
		if t.keep(r.id) {
			continue
		}
		t.mu.Lock()
		// Evicted under the table's lock, and only if still idle, so no
		// use of the run starts meanwhile: the drop is in memory only.
		gone := t.runs[r.id] == r && r.idleAt(now, t.idle)
		if gone {
			delete(t.runs, r.id)
		}
		t.mu.Unlock()
		if gone {
			t.drop(r.id)
		}
	}
}

// idleAt reports whether the run can be evicted at now: nothing uses it,
// for idle, and it holds no setting that exists nowhere else (a replay
// setting) and no subscriber.
func (r *run) idleAt(now time.Time, idle time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls == 0 && now.Sub(r.last) > idle && r.recording == nil && len(r.subs) == 0 && (r.replay == nil || !r.replay.on)
}

// len is the number of runs in the table.
func (t *table) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.runs)
}

// forget drops what the run's entry caches of the store that another
// process may have changed: the journal's view and the command count. The
// owner (immutable), the setup (fixed before the first call), the
// settings and the subscribers stay. Call it with the run locked.
func (r *run) forget() {
	r.journal.Forget()
	r.mu.Lock()
	r.counted, r.commands = false, 0
	r.mu.Unlock()
}

// RunCaches counts what the process keeps in memory by run, for tests and
// for an operator who wants to see that it stays bounded.
type RunCaches struct {
	// InUse is the runs in the run table: used within Config.RunIdle, or
	// with a call in flight, a live kernel or a subscriber.
	InUse int
	// Store is the runs whose file index (or an index lock) is in memory.
	Store int
	// Journal is the runs whose journal state (CEL.md's step count and
	// notes) is in memory.
	Journal int
	// Other is the runs with index writes pending, and the runs the run
	// lock holds or awaits.
	Other int
}

// Total is every entry counted.
func (c RunCaches) Total() int { return c.InUse + c.Store + c.Journal + c.Other }
