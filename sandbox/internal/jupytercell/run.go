package jupytercell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
	"github.com/triadhq/triad/sandbox/jupyter"
)

// Kernel is a backend's side of a running kernel: how to reach it, restart
// it and say why it died. Run calls its methods from the goroutine that
// called Run, with the backend's kernel lock held.
type Kernel interface {
	// Client is the Jupyter client of the current kernel; nil while the
	// kernel is down.
	Client() *jupyter.Client
	// Exited is closed when the current kernel's process has ended.
	Exited() <-chan struct{}
	// Closing is closed when the kernel is being closed.
	Closing() <-chan struct{}
	// Restart replaces the kernel with a fresh one (a new process or pod,
	// same working directory).
	Restart(ctx context.Context) error
	// Cut drops the connection to a kernel whose cell floods it, so that
	// nothing more of the flood is read, interrupts the cell, connects
	// again and waits until the kernel answers, all within ctx; an error
	// means the kernel is to be restarted.
	Cut(ctx context.Context) error
	// Died waits briefly for the backend to learn why the kernel ended,
	// logs it and returns the reason ("OOMKilled", "exited with code 1").
	Died(ctx context.Context) string
}

// Settings are what a backend runs a cell with.
type Settings struct {
	// Timeout bounds a cell that sets none; Grace is how long a cell has to
	// end once interrupted before the kernel is restarted.
	Timeout, Grace time.Duration
	// OutputBytes is a cell's output limit (sandbox.Limits.OutputBytes).
	OutputBytes int64
	// Restarted is set when the kernel was restarted since the last cell:
	// the Result says so.
	Restarted bool
	// NoThreads is set for a kernel that is not Python's: it is not asked
	// for the threads a cell left (Result.Threads stays nil).
	NoThreads bool
	// ID names the kernel in log records; Log receives them.
	ID  string
	Log *slog.Logger
}

// Check is what Execute checks before it touches the kernel: ErrClosed
// once k is closing, else the caller's error if ctx is done.
func Check(ctx context.Context, k Kernel, id string) error {
	select {
	case <-k.Closing():
		return sandbox.ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("execute on kernel %s: %w", id, err)
	}
	return nil
}

// Run runs cell on k and reports it as sandbox.Kernel.Execute does. Each
// output message is handed over by the Jupyter client's iopub reader as it
// arrives and delivered at once, so neither the client nor the backend
// gathers a cell's output (see docs/DECISIONS.md, "Output is delivered
// message by message"). A timed-out or abandoned cell is interrupted over
// the control channel and the kernel is restarted if the cell does not end
// within s.Grace; a cell whose output passes the limit is cut
// (Kernel.Cut). The caller holds the kernel's lock and has checked that k
// has a client.
func Run(ctx context.Context, k Kernel, cell sandbox.Cell, s Settings) (*sandbox.Result, error) {
	timeout := cell.Timeout
	if timeout <= 0 {
		timeout = s.Timeout
	}
	c := &run{k: k, cfg: s, timeout: timeout, setup: cell.Setup, restarted: s.Restarted, em: emit.New(s.OutputBytes, cell.Output), msgs: make(chan jupyter.Msg), quit: make(chan struct{}), start: time.Now()}
	defer c.release()
	return c.run(ctx, cell.Code)
}

// run is one cell in progress.
type run struct {
	k         Kernel
	cfg       Settings
	ex        *jupyter.Execution
	em        *emit.Meter
	start     time.Time
	timeout   time.Duration
	restarted bool
	setup     bool // a setup cell: not counted in the execution counter

	// msgs carries each output message from the client's iopub reader to
	// the goroutine that called Run, unbuffered: the reader waits
	// until the message is taken, so at most one is in flight. quit is
	// closed when nobody takes them any more, which releases the reader.
	msgs     chan jupyter.Msg
	quit     chan struct{}
	quitOnce sync.Once

	// Display bookkeeping, for update_display_data and clear_output: the
	// displays delivered since the last clear (their bundles are the ones
	// the sink got, so keeping them costs the sink nothing more), and a
	// clear_output(wait=True) not applied yet.
	shown        []shownDisplay
	pendingClear bool
	// value is the execute_result, held until the cell is complete so
	// that it is the last event.
	value *sandbox.Bundle
}

// shownDisplay is a display delivered in this cell.
type shownDisplay struct {
	id     string // transient display_id, "" if it cannot be updated
	bundle *sandbox.Bundle
}

var errCellTimeout = errors.New("cell timeout")

// interruptDelivery bounds an interrupt_request's round trip: a kernel
// that leaves its control channel unanswered this long is wedged, and is
// restarted. The grace period starts only after the reply.
const interruptDelivery = time.Minute

// stopReason says why a running cell is being stopped: the kind and ename
// its result carries, and how to say it in evalue.
type stopReason struct {
	kind, ename string
	what        string // "the cell ran past its 2s timeout"
}

// onOutput is the client's ExecOptions.OnOutput: it hands m to the
// Execute goroutine, or drops it once that has stopped listening.
func (c *run) onOutput(m jupyter.Msg) {
	select {
	case c.msgs <- m:
	case <-c.quit:
	}
}

// release stops the hand-over: the client's reader is never left blocked
// on a cell nobody waits for, so closing the client cannot hang. It is
// called before anything closes the client, and when Execute returns.
func (c *run) release() { c.quitOnce.Do(func() { close(c.quit) }) }

func (c *run) run(ctx context.Context, code string) (*sandbox.Result, error) {
	k := c.k
	ex, err := c.send(ctx, code)
	if err != nil {
		c.release()
		switch {
		case errors.Is(err, jupyter.ErrKernelDead):
			return c.died(ctx), nil
		case errors.Is(err, sandbox.ErrClosed) || errors.Is(err, jupyter.ErrClosed):
			return nil, sandbox.ErrClosed
		case errors.Is(err, errCellTimeout):
			// The request could not even be sent within the cell's
			// timeout: the kernel is wedged, so replace it.
			return c.wedged(ctx, c.timeoutReason()), nil
		case ctx.Err() != nil:
			// Whether the kernel queued the cell is unknown; a fresh
			// kernel is the only state nobody has to guess about.
			return c.wedged(ctx, c.hangUpReason(ctx)), nil
		}
		return nil, fmt.Errorf("execute on kernel %s: %w", c.cfg.ID, err)
	}
	c.ex = ex
	client, exited := k.Client(), k.Exited()
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-c.msgs:
			c.deliver(m)
			if c.em.Over() {
				return c.cut(ctx), nil
			}
		case <-ex.Over():
			return c.cut(ctx), nil
		case <-ex.Done():
			return c.finish(ctx), nil
		case <-client.Dead():
			return c.dead(ctx)
		case <-exited:
			return c.dead(ctx)
		case <-k.Closing():
			return nil, sandbox.ErrClosed
		case <-deadline.C:
			return c.stop(ctx, c.timeoutReason())
		case <-ctx.Done():
			return c.stop(ctx, c.hangUpReason(ctx))
		}
	}
}

func (c *run) timeoutReason() stopReason {
	return stopReason{kind: sandbox.KindTimeout, ename: "TimeoutError", what: fmt.Sprintf("the cell ran past its %s timeout", c.timeout)}
}

func (c *run) hangUpReason(ctx context.Context) stopReason {
	return stopReason{kind: sandbox.KindInterrupted, ename: "Interrupted", what: "the caller stopped waiting (" + context.Cause(ctx).Error() + ")"}
}

// send hands the cell to the kernel. The Jupyter client's send is not bounded by a
// context and blocks while the kernel does not read, so it runs aside and
// the wait is bounded by the cell's timeout, the caller, the kernel's exit
// and Close; a send left blocked ends when the client is closed (the
// restart that follows a wedged kernel closes it).
func (c *run) send(ctx context.Context, code string) (*jupyter.Execution, error) {
	k := c.k
	type sent struct {
		ex  *jupyter.Execution
		err error
	}
	client := k.Client()
	ch := make(chan sent, 1)
	opts := jupyter.ExecOptions{OnOutput: c.onOutput, MaxOutput: c.em.Limit(), UserExpressions: threadExprs, SkipHistory: c.setup}
	if c.cfg.NoThreads {
		opts.UserExpressions = nil
	}
	go func() {
		ex, err := client.Execute(context.WithoutCancel(ctx), code, opts)
		ch <- sent{ex, err}
	}()
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case s := <-ch:
		return s.ex, s.err
	case <-t.C:
		return nil, errCellTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-k.Exited():
		return nil, jupyter.ErrKernelDead
	case <-client.Dead():
		return nil, jupyter.ErrKernelDead
	case <-k.Closing():
		return nil, sandbox.ErrClosed
	}
}

// deliver passes one output message on to the cell's sink, within the
// output limit, applying clear_output and display updates as a notebook
// does. A display update of one of this cell's displays is delivered as
// EventClear followed by the cell's displays again, the updated one in
// place (they count against the limit again, which bounds a cell that
// updates in a loop); streams are not repeated. The execute_result is
// held back until the cell completes.
func (c *run) deliver(m jupyter.Msg) {
	if m.Kind == jupyter.MsgClear {
		c.pendingClear = m.Wait
		if !m.Wait {
			c.clear()
		}
		return
	}
	if c.pendingClear {
		c.pendingClear = false
		c.clear()
	}
	switch m.Kind {
	case jupyter.MsgStream:
		switch m.Stream {
		case "stdout":
			c.em.Emit(sandbox.Event{Kind: sandbox.EventStdout, Text: m.Text})
		case "stderr":
			c.em.Emit(sandbox.Event{Kind: sandbox.EventStderr, Text: m.Text})
		}
	case jupyter.MsgDisplay:
		c.show(m.Display)
	case jupyter.MsgUpdateDisplay:
		d := m.Display
		b := bundle(d.Bundle)
		found := false
		for i := range c.shown {
			if d.DisplayID != "" && c.shown[i].id == d.DisplayID {
				c.shown[i].bundle = b
				found = true
			}
		}
		if !found {
			// A display an earlier cell showed: this cell shows the update.
			c.show(d)
			return
		}
		c.em.Emit(sandbox.Event{Kind: sandbox.EventClear})
		for _, s := range c.shown {
			c.em.Emit(sandbox.Event{Kind: sandbox.EventDisplay, Bundle: s.bundle})
		}
	case jupyter.MsgResult:
		c.value = bundle(m.Result.Bundle)
	}
}

// show delivers a new display and notes it.
func (c *run) show(d *jupyter.Display) {
	b := bundle(d.Bundle)
	if c.em.Emit(sandbox.Event{Kind: sandbox.EventDisplay, Bundle: b}) {
		c.shown = append(c.shown, shownDisplay{id: d.DisplayID, bundle: b})
	}
}

// clear delivers a clear_output.
func (c *run) clear() {
	c.shown = nil
	c.em.Emit(sandbox.Event{Kind: sandbox.EventClear})
}

func bundle(b jupyter.Bundle) *sandbox.Bundle {
	return &sandbox.Bundle{Data: b.Data, Metadata: b.Metadata}
}

// drain delivers the messages the reader is handing over right now, then
// releases it: for a cell that is over (dead, stopped), what already
// arrived still reaches the caller.
func (c *run) drain() {
	for {
		select {
		case m := <-c.msgs:
			c.deliver(m)
		default:
			c.release()
			return
		}
	}
}

// result is a Result for the cell with its counter and duration from o,
// and no error yet.
func (c *run) result(o jupyter.Output) *sandbox.Result {
	return &sandbox.Result{
		OK:             o.Status == jupyter.StatusOK && o.Error == nil,
		ExecutionCount: o.ExecutionCount,
		Restarted:      c.restarted,
		Duration:       time.Since(c.start),
	}
}

// finish reports a cell that completed, with the threads it left
// running. Every output message was delivered before Done closed.
func (c *run) finish(ctx context.Context) *sandbox.Result {
	c.release()
	o := c.ex.Output()
	res := c.result(o)
	res.Threads = c.threads(ctx, o)
	if c.value != nil {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventResult, Bundle: c.value})
	}
	switch {
	case c.em.Over():
		// The cell ended by itself; only its last output was dropped.
		res.OK = false
		res.Error = &sandbox.ExecError{
			Kind:      sandbox.KindOutputLimit,
			Ename:     "OutputLimitExceeded",
			Evalue:    fmt.Sprintf("the cell's output passed the %s limit; the rest was dropped", emit.Bytes(c.em.Limit())),
			Traceback: []string{},
		}
	case o.Error != nil:
		res.Error = &sandbox.ExecError{
			Kind:      sandbox.KindExecution,
			Ename:     o.Error.Ename,
			Evalue:    o.Error.Evalue,
			Traceback: o.Error.Traceback,
		}
	case o.Aborted:
		res.Error = &sandbox.ExecError{
			Kind:      sandbox.KindExecution,
			Ename:     "CellAborted",
			Evalue:    "the kernel skipped this cell because an earlier one failed",
			Traceback: []string{},
		}
	}
	return res
}

// dead reports a cell whose kernel went away, unless the cell completed
// just before.
func (c *run) dead(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-c.ex.Done():
		return c.finish(ctx), nil
	default:
	}
	c.drain()
	return c.died(ctx), nil
}

// stop interrupts a running cell (past its deadline, or abandoned by the
// caller). If the cell ends within the grace period the kernel keeps its
// state; if not, the kernel is restarted. Output goes on being delivered,
// within the limit, while the cell winds down.
//
// The grace period runs from the kernel's interrupt_reply, not from the
// request, and is lengthened by the request's round trip (the cell's end
// comes back over the same path): on a loaded machine, or over a Kubernetes port-forward, the
// request alone can take longer than the grace, and a kernel that would
// have stopped in time was restarted (the CI of 07cf28a, kube under
// gVisor at load 30). The request itself is bounded by interruptDelivery:
// a kernel that cannot answer its control channel for that long is
// wedged. See docs/DECISIONS.md, "The interrupt grace runs from the reply".
func (c *run) stop(ctx context.Context, why stopReason) (*sandbox.Result, error) {
	k := c.k
	grace := c.cfg.Grace
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptDelivery)
	defer cancel()
	client, exited := k.Client(), k.Exited()
	ierr := make(chan error, 1)
	sent := time.Now()
	go func() { ierr <- client.Interrupt(ictx) }()
	var interruptErr error
	var rtt time.Duration
	var graceOver <-chan time.Time // set once the kernel has replied
wait:
	for {
		select {
		case interruptErr = <-ierr:
			if interruptErr != nil {
				break wait
			}
			// The cell's end reaches us over the same path the reply
			// took: its round trip is added to the grace.
			rtt = time.Since(sent)
			t := time.NewTimer(grace + rtt)
			defer t.Stop()
			graceOver = t.C
		case <-graceOver:
			break wait
		case m := <-c.msgs:
			c.deliver(m)
			if c.em.Over() {
				break wait // it floods while winding down: restart
			}
		case <-c.ex.Over():
			break wait
		case <-c.ex.Done():
			c.release()
			o := c.ex.Output()
			res := c.result(o)
			res.OK = false
			res.Error = &sandbox.ExecError{
				Kind:      why.kind,
				Ename:     why.ename,
				Evalue:    why.what + " and was interrupted; the kernel kept its state",
				Traceback: []string{},
			}
			if o.Error != nil {
				res.Error.Traceback = o.Error.Traceback
			}
			res.Threads = c.threads(ctx, o)
			return res, nil
		case <-client.Dead():
			return c.dead(ctx)
		case <-exited:
			return c.dead(ctx)
		case <-k.Closing():
			return nil, sandbox.ErrClosed
		}
	}
	c.release()
	c.cfg.Log.WarnContext(ctx, "cell did not stop when interrupted; restarting the kernel", "kernel", c.cfg.ID, "why", why.kind, "interrupt_err", interruptErr, "interrupt_rtt", rtt)
	res := c.result(jupyter.Output{})
	res.OK = false
	res.Error = &sandbox.ExecError{
		Kind:      why.kind,
		Ename:     why.ename,
		Evalue:    fmt.Sprintf("%s and did not stop within %s of an interrupt; the kernel was restarted and its state is lost", why.what, grace),
		Traceback: []string{},
	}
	if interruptErr != nil {
		res.Error.Evalue = fmt.Sprintf("%s and the kernel did not take an interrupt (%v); the kernel was restarted and its state is lost", why.what, interruptErr)
	}
	if err := k.Restart(context.WithoutCancel(ctx)); err != nil {
		res.Error.Evalue = fmt.Sprintf("%s and did not stop when interrupted; restarting the kernel failed (%v), the next cell will try again", why.what, err)
		return res, nil
	}
	res.Restarted = true
	return res, nil
}

// cut stops a cell whose output passed the limit (Kernel.Cut): the
// connection goes first, so the host reads nothing more of the flood; the
// cell is then interrupted, and a new connection waits for the kernel to
// answer again, which it does once the cell has ended. If that takes
// longer than the grace period, the kernel is restarted.
func (c *run) cut(ctx context.Context) *sandbox.Result {
	k := c.k
	c.release()
	count := c.ex.Output().ExecutionCount
	grace := c.cfg.Grace
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	what := fmt.Sprintf("the cell's output passed the %s limit", emit.Bytes(c.em.Limit()))
	res := c.result(jupyter.Output{ExecutionCount: count})
	res.OK = false
	res.Error = &sandbox.ExecError{Kind: sandbox.KindOutputLimit, Ename: "OutputLimitExceeded", Traceback: []string{}}
	err := k.Cut(gctx)
	if err == nil {
		res.Error.Evalue = what + " and was interrupted; the kernel kept its state"
		res.Threads = c.threads(ctx, jupyter.Output{})
		return res
	}
	c.cfg.Log.WarnContext(ctx, "cell did not stop after passing the output limit; restarting the kernel", "kernel", c.cfg.ID, "err", err)
	res.Error.Evalue = fmt.Sprintf("%s and did not stop within %s of an interrupt; the kernel was restarted and its state is lost", what, grace)
	if rerr := k.Restart(context.WithoutCancel(ctx)); rerr != nil {
		res.Error.Evalue = fmt.Sprintf("%s and did not stop when interrupted; restarting the kernel failed (%v), the next cell will try again", what, rerr)
		return res
	}
	res.Restarted = true
	return res
}

// wedged restarts a kernel that did not take a cell.
func (c *run) wedged(ctx context.Context, why stopReason) *sandbox.Result {
	c.release()
	res := c.result(jupyter.Output{})
	res.Error = &sandbox.ExecError{
		Kind:      why.kind,
		Ename:     why.ename,
		Evalue:    why.what + " before the kernel accepted the cell; the kernel was restarted and its state is lost",
		Traceback: []string{},
	}
	if err := c.k.Restart(context.WithoutCancel(ctx)); err != nil {
		res.Error.Evalue = fmt.Sprintf("%s before the kernel accepted the cell, and restarting it failed (%v); the next cell will try again", why.what, err)
		return res
	}
	res.Restarted = true
	return res
}

// died reports a dead kernel (OOM, os._exit, a crash, an eviction) with
// the reason the backend gives, and brings up a fresh kernel for the next
// cell.
func (c *run) died(ctx context.Context) *sandbox.Result {
	ctx = context.WithoutCancel(ctx)
	reason := c.k.Died(ctx)
	res := c.result(jupyter.Output{})
	res.Error = &sandbox.ExecError{
		Kind:      sandbox.KindKernelDied,
		Ename:     "KernelDied",
		Evalue:    "the kernel died (" + reason + "); its state is lost and a fresh kernel was started",
		Reason:    reason,
		Traceback: []string{},
	}
	if err := c.k.Restart(ctx); err != nil {
		res.Error.Evalue = fmt.Sprintf("the kernel died (%s) and restarting it failed (%v); the next cell will try again", reason, err)
		return res
	}
	res.Restarted = true
	return res
}
