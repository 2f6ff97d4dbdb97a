package orchestrator

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/crashpoint"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/sandbox"
)

// StepInfo is what a caller (the recipe runner, a replay) knows about a
// call beyond its inputs; WithStep passes it.
type StepInfo = journal.Info

// Receipt is what the orchestration path recorded about one call.
type Receipt = journal.Receipt

// Step is one finished tool call, as the journal sees it.
type Step = journal.Step

// Outcome is a tool's part of a step.
type Outcome = journal.Outcome

// Input is one salient input of a call.
type Input = journal.Input

// TraceRecord is one line of trace.jsonl.
type TraceRecord = journal.TraceRecord

// CallOption is a per-call knob a surface passes beyond the tool's
// request.
type CallOption func(*callOptions)

type callOptions struct {
	info  journal.Info
	env   CellEnv
	stdin bool
	pty   *sandbox.TermSize
}

func callOpts(opts []CallOption) callOptions {
	var c callOptions
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithStep passes what the caller knows about the call (its label, the
// artifacts it must make, what comes next, where to put the receipt).
func WithStep(info StepInfo) CallOption {
	return func(c *callOptions) { c.info = info }
}

// WithEnv runs a cell with env (see CellEnv).
func WithEnv(env CellEnv) CallOption {
	return func(c *callOptions) { c.env = env }
}

// WithStdin starts a background command with its standard input open
// (Command.Input, Command.CloseStdin).
func WithStdin() CallOption { return func(c *callOptions) { c.stdin = true } }

// WithPty starts a background command in a pseudo-terminal of size
// (Command.Input types into it, Command.Resize resizes it).
func WithPty(size sandbox.TermSize) CallOption {
	return func(c *callOptions) { c.pty = &size }
}

// call is one tool call in flight: everything the orchestration path
// resolved about it, once, which the tool takes. Nothing a tool needs
// about its call is looked up again or rides in the context.
type call struct {
	o   *Orchestrator
	r   *run // the run's in-memory state
	run runid.ID
	// owner is the run's owner, who the caller's tenant may see.
	owner tenancy.Owner
	// who is the caller.
	who auth.Principal
	// held is the run's lock, released by release.
	held Held
	// n is the number the step will have in the journal, notes the
	// operator notes it sees (zero without a journal).
	n     int
	notes []cel.Note
	opts  callOptions
	// step is what the call leaves, which the tool fills in.
	step *journal.Step
	done func() // marks the run's use over
}

// release unlocks the run and ends the call's use of it.
func (c *call) release() {
	c.held.Unlock()
	c.done()
}

// call is the orchestration path. fn performs the tool call, filling in
// the step's artifacts and its outcome's facts; call does everything
// around it: it resolves the call (resolve), writes the call-in-progress
// record beside the tool, and records the step. A call refused before it
// starts (another tenant's run, a scope or quota) is not recorded: it
// never touched the run.
//
// The call answers before its step is recorded: the Step Block, the
// evaluator's verdict, trace.jsonl and evaluations.jsonl are written after
// fn returns, still under the run's lock, so the run's next call starts
// only once they are done, and readers of the run's records wait for them
// (settle): no surface ever shows a finished call without its verdict. A
// crash between the answer and the record is covered by the
// call-in-progress record, written before the answer. A caller that
// reads the receipt (the recipe runner) gets its answer after the record
// instead. See "When the evaluator runs" in docs/DECISIONS.md.
func (o *Orchestrator) call(ctx context.Context, id runid.ID, out Outcome, opts []CallOption, fn func(ctx context.Context, c *call) error) error {
	start := time.Now()
	c, err := o.resolve(ctx, id, out, opts)
	if err != nil {
		o.metrics.toolCall(out.Tool(), outcome(err), time.Since(start))
		return err
	}
	s := &journal.Step{Run: id, Outcome: out, Started: time.Now().UTC()}
	c.step = s
	// The journal must be written even if the caller hung up mid-call.
	wctx := context.WithoutCancel(ctx)
	var begun func()
	if o.j != nil {
		begun = o.j.Begin(wctx, s, c.n, c.who, c.opts.info)
	}
	s.Err = fn(ctx, c)
	s.Elapsed = time.Since(s.Started)
	if begun != nil {
		begun()
	}
	if o.j == nil || c.opts.info.Receipt != nil {
		o.record(wctx, c.r, c.owner, s, c.n, c.notes, c.who, c.opts.info)
		c.release()
		o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
		return s.Err
	}
	// Answer now; record before the run's lock is released. The bytes
	// the call stored count against the tenant's quota at once, before
	// any other call is admitted.
	o.t.Note(wctx, c.owner, nil, false, func(*tenancy.Summary) {})
	ch := c.r.beginRecording()
	hold := crashpoint.Hold()
	o.recording.Add(1)
	go func() {
		defer o.recording.Done()
		defer c.r.endRecording(ch)
		defer c.release()
		if hold {
			select {} // the process is about to die: see internal/crashpoint
		}
		o.record(wctx, c.r, c.owner, s, c.n, c.notes, c.who, c.opts.info)
	}()
	o.metrics.toolCall(out.Tool(), outcome(s.Err), time.Since(start))
	return s.Err
}

// resolve resolves a call once: the caller and its right to the run (its
// scope, its tenant, the tenant's stored-bytes quota), the run's owner,
// the run's lock (and with it any call a crash interrupted), and the
// step's number.
func (o *Orchestrator) resolve(ctx context.Context, id runid.ID, out Outcome, opts []CallOption) (*call, error) {
	r, done := o.runs.use(id)
	c := &call{o: o, r: r, run: id, who: auth.From(ctx), opts: callOpts(opts), done: done}
	need := scopeOf(out.Tool())
	ow, err := o.access(ctx, r, need, true)
	if err == nil && need == auth.Runs && out.Tool() != ToolDelete {
		var add int64
		if t, ok := out.(*TmpOutcome); ok {
			add = int64(t.Bytes)
		}
		err = o.t.CheckBytes(ctx, c.who, ow, add)
	}
	if err == nil && ow.SnapshotOf != "" {
		err = frozen(ow)
	}
	if err != nil {
		done()
		return nil, err
	}
	c.owner = ow
	if c.held, err = o.lockRun(ctx, r); err != nil {
		done()
		return nil, err
	}
	if o.j != nil {
		// A journal that cannot be read now fails the record the same
		// way, which says so; the call itself goes on.
		c.n, c.notes, _ = o.j.Next(ctx, id)
	}
	return c, nil
}

// record records a step that ran: what the run's kernel used, if the
// step ran in it (meterStep), its Step Block with the evaluator's
// verdict, trace and evaluation lines and artifact index (journal.Record),
// the live kernel's copies of them, the run's feed, then the run's entry
// in its tenant's index. Failures are logged, not returned: the tool's
// effect happened.
func (o *Orchestrator) record(ctx context.Context, r *run, ow tenancy.Owner, s *journal.Step, n int, notes []cel.Note, who auth.Principal, info journal.Info) {
	o.meterStep(ctx, r.id, s.Outcome)
	if o.j != nil {
		writes, ev, err := o.j.Record(ctx, journal.Recording{Step: s, N: n, Notes: notes, Info: info, Who: who, Cache: &r.journal,
			Header: func(ctx context.Context) (cel.Header, error) { return o.setups.header(ctx, r, s.Started) }})
		if err != nil {
			o.log.ErrorContext(ctx, "record step", "run", r.id, "tool", s.Outcome.Tool(), "err", err)
		} else {
			o.files.journal(ctx, r.id, writes)
			r.publish(Update{Call: &ev})
			if s.Verdict != nil && s.Verdict.Ungraded {
				o.regrade.add(r.id)
			}
		}
	}
	r.mu.Lock()
	objective := ""
	if r.header != nil {
		objective = r.header.Objective
	}
	all := !r.marked
	r.marked = true
	r.mu.Unlock()
	o.t.Note(ctx, ow, s.Artifacts, all, func(sum *tenancy.Summary) {
		sum.Steps++
		if sum.Objective == "" {
			sum.Objective = objective
		}
		if v := s.Verdict; v != nil {
			sum.LastVerdict = v.Word()
			switch {
			case v.Ungraded: // counted when the regrade grades it
			case v.Pass:
				sum.Passed++
			default:
				sum.Failed++
			}
		}
	})
}

// beginRecording notes that the run's call is being recorded; the caller
// holds the run's lock, so there is at most one.
func (r *run) beginRecording() chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	r.recording = ch
	r.mu.Unlock()
	return ch
}

// endRecording notes that the recording beginRecording announced is done.
func (r *run) endRecording(ch chan struct{}) {
	r.mu.Lock()
	if r.recording == ch {
		r.recording = nil
	}
	r.mu.Unlock()
	close(ch)
}

// waitRecording returns once the run has no recording pending, or ctx
// ends.
func (r *run) waitRecording(ctx context.Context) error {
	r.mu.Lock()
	ch := r.recording
	r.mu.Unlock()
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

// lockRun takes the run's lock, for a call or a journal operation. When
// another process held the run since this one did, what this process
// caches about the run is dropped first; and the first time this process
// holds the run (or after another did), a call that a crash interrupted
// is recorded as interrupted before anything else (journal.Interrupted).
func (o *Orchestrator) lockRun(ctx context.Context, r *run) (Held, error) {
	h, err := o.lock.Lock(ctx, r.id)
	if err != nil {
		return nil, err
	}
	if h.Stale() {
		o.forget(r, true)
	}
	if o.j == nil {
		return h, nil
	}
	// A call a crash interrupted is looked for once each time this
	// process takes the run up.
	r.mu.Lock()
	looked := r.recovered
	r.mu.Unlock()
	if looked {
		o.writeReclaims(context.WithoutCancel(ctx), r)
		return h, nil
	}
	wctx := context.WithoutCancel(ctx)
	it, ok, err := o.j.Interrupted(wctx, r.id)
	if err != nil {
		o.log.WarnContext(ctx, "look for an interrupted call; will look again", "run", r.id, "err", err)
		return h, nil
	}
	r.mu.Lock()
	r.recovered = true
	r.mu.Unlock()
	if ok {
		ow, owned, err := o.ownerOf(wctx, r)
		if err != nil || !owned {
			// Recorded all the same; the run index learns of it at the
			// run's next call.
			ow = tenancy.Owner{Run: r.id}
		}
		o.record(wctx, r, ow, it.Step, it.N, nil, it.Who, it.Info)
	}
	// Steps a process left ungraded (this one before a restart, or
	// another replica) are graded again: their requests are in
	// evaluations.jsonl.
	if p, err := o.j.Ungraded(wctx, r.id); err == nil && len(p) > 0 {
		o.regrade.add(r.id)
	}
	o.writeReclaims(wctx, r)
	return h, nil
}

// forget drops this process's caches of a run another process wrote: the
// store's index, the journal's step count and notes, the run entry's
// journal view and command count, (with kernel) the kernel session,
// whose view of the working directory is stale (its kernel is let go of,
// not stopped, and is adopted again by the next call), and the run's
// egress session, which another process may be charging now.
func (o *Orchestrator) forget(r *run, kernel bool) {
	o.store.Forget(r.id)
	if o.j != nil {
		o.j.CEL().Forget(r.id)
	}
	r.forget()
	r.mu.Lock()
	r.recovered = false // another process may have left a call in progress
	r.mu.Unlock()
	if kernel && o.kernels != nil {
		o.kernels.Forget(r.id)
	}
	o.sb.drop(r.id)
}

// scopeOf is the scope a tool needs: reading a run's files needs read,
// everything else runs.
func scopeOf(tool string) auth.Scope {
	if tool == ToolRead || tool == ToolList {
		return auth.Read
	}
	return auth.Runs
}

// outcome labels a call's result for metrics: "ok" or its error's kind.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return string(fault.From(err).Kind)
}

// countingLookups counts how often the owner of a run is resolved, for
// the test that a call resolves it once.
type countingLookups struct{ n atomic.Int64 }

func (c *countingLookups) add() { c.n.Add(1) }
