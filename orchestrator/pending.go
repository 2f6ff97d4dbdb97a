package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// A call answers before its step is recorded: the Step Block, the
// evaluator's verdict, trace.jsonl and evaluations.jsonl are written
// after the tool's answer is returned, still under the run's lock, so the
// run's next call starts only once they are done. Readers of a run's
// records (GET /cel, GET /runs/{id}, the trace, MCP's journal_read, the
// recipe runner's view) wait for that pending work first (settle), so no
// surface ever shows a finished call without its verdict. A crash between
// the answer and the verdict is covered by a step-started marker written
// before the answer: a marker whose Step Block is missing becomes an
// interrupted Step Block on the run's next call or read. See "When the
// evaluator runs" in docs/DECISIONS.md.

// pending tracks the runs whose last call has answered and is being
// recorded.
type pending struct {
	mu sync.Mutex
	m  map[runid.ID]chan struct{}
	wg sync.WaitGroup
}

// begin notes that run's call is being recorded; the caller holds the
// run's lock, so there is at most one per run.
func (p *pending) begin(run runid.ID) chan struct{} {
	ch := make(chan struct{})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[runid.ID]chan struct{}{}
	}
	p.m[run] = ch
	p.wg.Add(1)
	return ch
}

// end notes that the recording begin announced is done.
func (p *pending) end(run runid.ID, ch chan struct{}) {
	p.mu.Lock()
	if p.m[run] == ch {
		delete(p.m, run)
	}
	p.mu.Unlock()
	close(ch)
	p.wg.Done()
}

// wait returns once run has no recording pending, or ctx ends.
func (p *pending) wait(ctx context.Context, run runid.ID) error {
	p.mu.Lock()
	ch := p.m[run]
	p.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fault.Wrap(fault.Timeout, ctx.Err(), "the request ended while the run's last step was being recorded", "retry the request")
	}
}

// settle makes a read of run's records see every call that has answered:
// it waits for the run's pending recording. The first time this process
// touches the run, or when another process may have written it since
// (a shared RunLock), it takes the run's lock instead, which waits for
// the recording wherever it runs, drops what this process caches of the
// run, and turns a crashed call into an interrupted Step Block (lockRun).
// Never call it with the run locked.
func (o *Orchestrator) settle(ctx context.Context, run runid.ID) error {
	if o.j == nil {
		o.refresh(ctx, run)
		return nil
	}
	if o.recoveredRun(run) && !o.lock.Changed(ctx, run) {
		return o.pend.wait(ctx, run)
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return err
	}
	held.Unlock()
	return nil
}

// Settle returns once every call of run that has answered is recorded:
// its Step Block, verdict, trace and evaluation lines and artifact index
// are in the store. Readers that go to the store directly (share links,
// tests) call it first; the orchestrator's own readers do already. It
// checks no access: the caller has.
func (o *Orchestrator) Settle(ctx context.Context, run runid.ID) error {
	return o.settle(ctx, run)
}

// marker is the step-started record a call writes before it answers: what
// an interrupted Step Block needs if the process dies before the real one
// is written.
type marker struct {
	Step    int           `json:"step"`
	Tool    string        `json:"tool"`
	Started time.Time     `json:"started"`
	Inputs  []markerInput `json:"inputs"`
	Label   string        `json:"label,omitempty"`
	KeyID   string        `json:"key_id,omitempty"`
	Tenant  string        `json:"tenant"`
}

type markerInput struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// markerKey is where a run's marker lives: in the store's records outside
// runs (tmpfs.Meta), so no tool or cell can see or change it.
func markerKey(run runid.ID) string { return "journal/" + run.String() + "/started" }

// markStep starts writing s's marker and returns a wait for it. The write
// overlaps the tool call; the call waits for it before answering. A
// marker that cannot be written is logged: the call itself goes on.
func (o *Orchestrator) markStep(ctx context.Context, s *Step) func() {
	n, _, err := o.j.cel.Next(ctx, s.Run)
	if err != nil {
		o.log.WarnContext(ctx, "number the step for its marker", "run", s.Run, "err", err)
		return func() {}
	}
	p := auth.From(ctx)
	m := marker{Step: n, Tool: s.Outcome.Tool(), Started: s.Started, Label: stepInfo(ctx).Label, KeyID: p.KeyID, Tenant: p.Tenant}
	for _, in := range s.Outcome.Inputs() {
		m.Inputs = append(m.Inputs, markerInput(in))
	}
	b, err := json.Marshal(m)
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := o.store.Meta().PutMeta(ctx, markerKey(s.Run), b, tmpfs.Cond{}); err != nil {
			o.log.WarnContext(ctx, "write the step-started marker", "run", s.Run, "step", n, "err", err)
		}
	}()
	return func() { <-done }
}

func (o *Orchestrator) recoveredRun(run runid.ID) bool {
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	return o.j.recovered[run]
}

// recoverRun runs before the first call or read of run in this process,
// with the run locked: a marker for a step the journal does not have is
// a call that started, and perhaps answered, before a crash; it is
// recorded now as an interrupted step, with a FAIL verdict that says so.
func (o *Orchestrator) recoverRun(ctx context.Context, run runid.ID) {
	if o.recoveredRun(run) {
		return
	}
	done := func() {
		o.j.mu.Lock()
		if len(o.j.recovered) >= maxViews {
			clear(o.j.recovered)
		}
		o.j.recovered[run] = true
		o.j.mu.Unlock()
	}
	b, _, err := o.store.Meta().GetMeta(ctx, markerKey(run))
	if errors.Is(err, tmpfs.ErrNotFound) {
		done()
		return
	}
	var m marker
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		o.log.WarnContext(ctx, "read the step-started marker; will retry", "run", run, "err", err)
		return
	}
	n, _, err := o.j.cel.Next(ctx, run)
	if err != nil {
		o.log.WarnContext(ctx, "read the journal for recovery; will retry", "run", run, "err", err)
		return
	}
	done()
	if m.Step != n {
		return // the marked step was recorded
	}
	o.log.WarnContext(ctx, "recording a step interrupted by a crash", "run", run, "step", m.Step, "tool", m.Tool)
	s := &Step{Run: run, Outcome: &InterruptedOutcome{Marked: m.Tool, Input: m.Inputs}, Started: m.Started,
		Err: fault.New(fault.Unavailable, "interrupted: the server stopped before this call was recorded",
			"list the run's files (tmp.list) to see what the call left, and make the call again if its effect is missing")}
	rctx := WithStepInfo(auth.With(ctx, auth.Principal{KeyID: m.KeyID, Tenant: m.Tenant}), StepInfo{Label: m.Label})
	o.finish(rctx, s)
}

// InterruptedOutcome is the part of a step that a crash interrupted: all
// that is known of it is what its marker recorded before the tool ran.
type InterruptedOutcome struct {
	// Marked is the tool that was called.
	Marked string
	Input  []markerInput
}

// Tool implements Outcome.
func (i *InterruptedOutcome) Tool() string { return i.Marked }

// Inputs implements Outcome.
func (i *InterruptedOutcome) Inputs() []Input {
	out := make([]Input, 0, len(i.Input))
	for _, in := range i.Input {
		out = append(out, Input(in))
	}
	return out
}

func (i *InterruptedOutcome) grade(req *evaluator.Request) {}

func (i *InterruptedOutcome) describe(s *Step) (did, next []string, failed bool) {
	return []string{fmt.Sprintf("Called %s; the server stopped before the call was recorded, so whether it took effect is not known", i.Marked)}, nil, true
}
