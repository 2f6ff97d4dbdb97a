package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/tenancy"
)

// Regrade backoff: the first retry of a run's ungraded steps comes
// regradeFirst after they were found, each next one twice as late, at
// most regradeMax. See docs/DECISIONS.md, "Ungraded steps and the
// regrade".
const (
	regradeFirst = time.Second
	regradeMax   = time.Minute
)

// regrader grades the steps the evaluator could not grade again, in the
// background, with backoff, until each has a verdict: under the run's
// lock, like a call, so its appends are serialized with the run's other
// writers. It keeps only a queue of runs; what grading a step again takes
// is in the step's ungraded evaluations.jsonl line, so a step still
// ungraded when the process stops is found again by the run's next holder
// (lockRun) or a reader that sees it (RunReader.Status). The Orchestrator
// owns it: New starts its goroutine, Close stops it and waits.
type regrader struct {
	o *Orchestrator

	mu    sync.Mutex
	due   map[runid.ID]time.Time // runs with ungraded steps, and when to try next
	tries map[runid.ID]int
	// graded is closed, and replaced, when a run's verdicts change, for
	// Graded's waiters.
	graded map[runid.ID]chan struct{}

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newRegrader(o *Orchestrator) *regrader {
	g := &regrader{o: o, due: map[runid.ID]time.Time{}, tries: map[runid.ID]int{}, graded: map[runid.ID]chan struct{}{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	go g.loop()
	return g
}

// add queues run, whose steps include an ungraded one, for a regrade now
// (or at its backoff, if already queued).
func (g *regrader) add(run runid.ID) {
	if g == nil {
		return
	}
	g.mu.Lock()
	if _, ok := g.due[run]; !ok {
		g.due[run] = time.Now()
	}
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// close stops the loop and waits for it; a regrade in progress is
// abandoned (its step stays ungraded, to be found again). Safe twice.
func (g *regrader) close() {
	if g == nil {
		return
	}
	g.cancel()
	<-g.done
}

func (g *regrader) loop() {
	defer close(g.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now := time.Now()
		var ready []runid.ID
		next := now.Add(time.Hour)
		g.mu.Lock()
		for run, at := range g.due {
			if !at.After(now) {
				ready = append(ready, run)
			} else if at.Before(next) {
				next = at
			}
		}
		g.mu.Unlock()
		for _, run := range ready {
			if g.ctx.Err() != nil {
				return
			}
			left := g.regrade(g.ctx, run)
			g.mu.Lock()
			if left == 0 {
				delete(g.due, run)
				delete(g.tries, run)
			} else {
				g.tries[run]++
				d := regradeFirst << min(g.tries[run]-1, 10)
				g.due[run] = time.Now().Add(min(d, regradeMax))
			}
			g.mu.Unlock()
		}
		if len(ready) > 0 {
			continue // some may be due again, or new
		}
		t.Reset(time.Until(next))
		select {
		case <-g.ctx.Done():
			return
		case <-g.wake:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// regrade grades run's ungraded steps again and returns how many are
// still ungraded.
func (g *regrader) regrade(ctx context.Context, id runid.ID) int {
	o := g.o
	r, done := o.runs.use(id)
	defer done()
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return 1
	}
	defer held.Unlock()
	pending, err := o.j.Ungraded(ctx, id)
	if err != nil {
		o.log.WarnContext(ctx, "read ungraded steps; will try again", "run", id, "err", err)
		return 1
	}
	left := 0
	for _, p := range pending {
		if ctx.Err() != nil {
			left++
			continue
		}
		v, writes, err := o.j.Regrade(ctx, id, p)
		if err != nil {
			o.log.ErrorContext(ctx, "record a late verdict; will try again", "run", id, "step", p.Step, "err", err)
			left++
			continue
		}
		if v.Ungraded {
			left++
			continue
		}
		o.files.journal(ctx, id, writes)
		// The run index first: a subscriber told of the verdict finds
		// the index saying the same.
		g.note(ctx, r, v)
		g.publish(ctx, r, p.Step)
	}
	// Waiters look again whatever happened: another process may have
	// graded the steps.
	g.mu.Lock()
	if ch, ok := g.graded[id]; ok {
		close(ch)
		delete(g.graded, id)
	}
	g.mu.Unlock()
	return left
}

// publish tells the run's subscribers the step's late verdict, as the
// step's call event with its verdict now.
func (g *regrader) publish(ctx context.Context, r *run, step int) {
	trace, err := g.o.j.Trace(ctx, r.id)
	if err != nil {
		return
	}
	for _, tr := range trace {
		if tr.Step == step {
			ev := journal.CallEvent(tr)
			r.publish(Update{Verdict: &ev})
			return
		}
	}
}

// note counts the late verdict in the run's entry of its tenant's index.
func (g *regrader) note(ctx context.Context, r *run, v evaluator.Verdict) {
	ow, owned, err := g.o.ownerOf(ctx, r)
	if err != nil || !owned {
		return
	}
	g.o.t.Note(ctx, ow, nil, false, func(sum *tenancy.Summary) {
		if v.Pass {
			sum.Passed++
		} else {
			sum.Failed++
		}
		if sum.LastVerdict == "UNGRADED" {
			sum.LastVerdict = v.Word()
		}
	})
}

// Graded returns the verdict of a run's step, waiting while the step is
// ungraded for the regrade to grade it: a recipe step's pass or fail
// waits for a real verdict. It waits as long as ctx allows; the regrade
// goes on with backoff until the evaluator answers.
func (o *Orchestrator) Graded(ctx context.Context, id runid.ID, step int) (evaluator.Verdict, error) {
	if o.j == nil {
		return evaluator.Verdict{}, fault.New(fault.NotConfigured, "the journal is off", "start triad normally; the journal is always on in triad serve")
	}
	g := o.regrade
	for {
		v, ok, err := o.j.Verdict(ctx, id, step)
		if err != nil || !ok || !v.Ungraded {
			return verdictOf(id, step, v, ok, err)
		}
		// Registered before looking again, so a regrade in between is
		// not missed.
		g.mu.Lock()
		ch, ok := g.graded[id]
		if !ok {
			ch = make(chan struct{})
			g.graded[id] = ch
		}
		g.mu.Unlock()
		if v, ok, err = o.j.Verdict(ctx, id, step); err != nil || !ok || !v.Ungraded {
			return verdictOf(id, step, v, ok, err)
		}
		g.add(id)
		select {
		case <-ch:
		case <-ctx.Done():
			return v, fault.Wrap(fault.Timeout, ctx.Err(), "the step is still ungraded: the evaluator has not answered yet", "ask again later; the step is graded again in the background")
		}
	}
}

func verdictOf(id runid.ID, step int, v evaluator.Verdict, ok bool, err error) (evaluator.Verdict, error) {
	if err == nil && !ok {
		err = fault.New(fault.NotFound, fmt.Sprintf("run %s has no verdict for step %d", id, step), "look at the run's steps with GET /runs/{id}")
	}
	return v, err
}
