package orchestrator_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// sharedLock is a run lock shared by several orchestrators in one test,
// standing for several processes: a holder, and a version that moves on
// every acquire and release (as a Lease's resourceVersion does).
type sharedLock struct {
	mu      sync.Mutex
	free    *sync.Cond
	holder  string
	version int
}

func newSharedLock() *sharedLock {
	l := &sharedLock{}
	l.free = sync.NewCond(&l.mu)
	return l
}

// proc is one process's view of the lock: the version it left the run at.
type proc struct {
	l    *sharedLock
	name string
	seen int
}

func (p *proc) Lock(ctx context.Context, run runid.ID) (orchestrator.Held, error) {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.holder != "" {
		l.free.Wait()
	}
	h := &held{p: p, stale: l.version != p.seen}
	l.holder = p.name
	l.version++
	return h, nil
}

func (p *proc) Changed(context.Context, runid.ID) bool {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	return p.l.version != p.seen
}

// die releases the lock as a dead holder's expiry would: the call it began
// is recorded for the next holder in the store's records, not here.
func (p *proc) die() {
	p.l.mu.Lock()
	p.l.holder = ""
	p.l.version++
	p.l.mu.Unlock()
	p.l.free.Signal()
}

type held struct {
	p     *proc
	stale bool
}

func (h *held) Stale() bool { return h.stale }
func (h *held) Unlock() {
	l := h.p.l
	l.mu.Lock()
	l.holder = ""
	l.version++
	h.p.seen = l.version
	l.mu.Unlock()
	l.free.Signal()
}

// TestSharedRunLock: two orchestrators ("replicas") over one store and one
// shared lock take turns on a run. Each re-reads the journal when the other
// wrote since it last held the run, so steps are 1..n with no gaps and no
// repeats; an operator note taken on one is seen by the next step on the
// other; and a call whose holder died after beginning it (its
// call-in-progress record written) is recorded as
// interrupted before the next call's step.
func TestSharedRunLock(t *testing.T) {
	ctx := t.Context()
	r := newReplicas(t)
	procA, procB, a, bo := r.procA, r.procB, r.a, r.bo
	run := runid.New()

	for i, o := range []*orchestrator.Orchestrator{a, bo, a, a, bo} {
		if _, err := o.Write(ctx, run, wire.WriteRequest{Path: "f.txt", Text: text(strings.Repeat("x", i))}); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := a.Note(ctx, run, "use f.txt", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := bo.List(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	got := blocks(t, mustJournal(t, a, run))
	if len(got) != 6 {
		t.Fatalf("got %d Step Blocks, want 6", len(got))
	}
	for i, blk := range got {
		if blk.n != i+1 {
			t.Errorf("block %d is numbered %d, want %d", i, blk.n, i+1)
		}
	}
	if !strings.Contains(got[5].body, "Saw operator note: “use f.txt”") {
		t.Errorf("step 6 (on the other replica) does not show the note:\n%s", got[5].body)
	}

	// Replica A begins a call and dies before recording it.
	h, err := procA.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	a.StartStep(ctx, h, run, &orchestrator.ExecOutcome{Code: "x = 21  # sha256:0123"})
	procA.die()
	if _, err := bo.List(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	got = blocks(t, mustJournal(t, bo, run))
	if len(got) != 8 || got[6].n != 7 || got[6].tool != orchestrator.ToolExec || got[7].n != 8 || got[7].tool != orchestrator.ToolList {
		t.Fatalf("after the dead replica: got %d blocks, last two %+v, want step 7 sandbox.exec (interrupted) then step 8 tmp.list", len(got), got[len(got)-2:])
	}
	for _, want := range []string{"Interrupted:", "replica-a", "x = 21"} {
		if !strings.Contains(got[6].body, want) {
			t.Errorf("the interrupted block lacks %q:\n%s", want, got[6].body)
		}
	}
	trace, err := orchestratortest.Trace(ctx, bo, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(trace) != 8 || trace[6].OK || trace[6].Error == nil || trace[6].Step != 7 {
		t.Errorf("trace of the interrupted step: got %+v, want step 7 failed", trace[6])
	}

	// A holder that died after recording its call (its call-in-progress
	// record names a step the journal has) leaves nothing to add.
	if _, err = procB.Lock(ctx, run); err != nil {
		t.Fatal(err)
	}
	procB.die()
	if _, err := a.List(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	if got = blocks(t, mustJournal(t, a, run)); len(got) != 9 || got[8].n != 9 || got[8].tool != orchestrator.ToolList {
		t.Errorf("after a holder died past recording: got %d blocks, want 9 with step 9 tmp.list", len(got))
	}
}

// TestCrashWithLeaseAndMarker: a replica dies between a call's answer and
// its verdict, having left the call-in-progress record in the store's
// records (the one record of a call in progress; the lock carries none).
// The next holder, on another replica, records the call as interrupted
// exactly once, and the replica that died, back again, adds nothing
// either.
func TestCrashWithLeaseAndMarker(t *testing.T) {
	ctx := t.Context()
	r := newReplicas(t)
	procA, a, bo := r.procA, r.a, r.bo
	run := runid.New()
	if _, err := bo.Write(ctx, run, wire.WriteRequest{Path: "f.txt", Text: text("one")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, run, wire.WriteRequest{Path: "f.txt", Text: text("two")}); err != nil {
		t.Fatal(err)
	}
	h, err := procA.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	a.StartStep(ctx, h, run, &orchestrator.TmpOutcome{Op: orchestrator.ToolWrite, Path: "g.txt"})
	procA.die()

	if _, err := bo.List(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	a2 := r.open(procA)
	if _, err := a2.List(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	got := blocks(t, mustJournal(t, a2, run))
	var tools []string
	for i, blk := range got {
		tools = append(tools, blk.tool)
		if blk.n != i+1 {
			t.Errorf("block %d is numbered %d, want %d", i, blk.n, i+1)
		}
	}
	want := []string{orchestrator.ToolWrite, orchestrator.ToolWrite, orchestrator.ToolWrite, orchestrator.ToolList, orchestrator.ToolList}
	if strings.Join(tools, " ") != strings.Join(want, " ") {
		t.Fatalf("got Step Blocks %v, want %v (one interrupted tmp.write)", tools, want)
	}
	if !strings.Contains(got[2].body, "Interrupted:") || !strings.Contains(got[2].body, "FAIL") {
		t.Errorf("step 3 is not an interrupted FAIL:\n%s", got[2].body)
	}
	if n := strings.Count(string(mustJournal(t, bo, run)), "the call was interrupted"); n != 1 {
		t.Errorf("the journal records the interruption %d times, want once", n)
	}
}

// replicas is two orchestrators ("replicas") over one local store, each
// with its own handle on one shared lock.
type replicas struct {
	procA, procB *proc
	a, bo        *orchestrator.Orchestrator
	open         func(*proc) *orchestrator.Orchestrator
}

// newReplicas makes the store and both replicas. Every orchestrator open
// makes is closed before the index and the directory go: each writes what
// its calls left pending (run index entries, blob markers), and a flush
// after the test removed the directory failed the test's cleanup.
func newReplicas(t *testing.T) replicas {
	t.Helper()
	dir := t.TempDir()
	b, err := local.NewBlobs(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	x, err := local.NewIndex(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	l := newSharedLock()
	r := replicas{procA: &proc{l: l, name: "replica-a", seen: -1}, procB: &proc{l: l, name: "replica-b", seen: -1}}
	r.open = func(p *proc) *orchestrator.Orchestrator {
		o := orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store), RunLock: p, Replica: p.name})
		t.Cleanup(func() { o.Close() })
		return o
	}
	r.a, r.bo = r.open(r.procA), r.open(r.procB)
	return r
}

func mustJournal(t *testing.T, o *orchestrator.Orchestrator, run runid.ID) []byte {
	t.Helper()
	b, err := o.Journal(t.Context(), run)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
