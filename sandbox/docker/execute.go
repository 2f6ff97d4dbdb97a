package docker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker/jupyter"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// Execute implements sandbox.Kernel. Each output message is handed over
// by the Jupyter client's iopub reader as it arrives and delivered at
// once, so neither the client nor the backend gathers a cell's output (see
// docs/DECISIONS.md, "Output is delivered message by message"). A
// timed-out or abandoned cell is interrupted over the control channel and
// the kernel is restarted if the cell does not end within
// Config.InterruptGrace. See sandbox.Kernel for the contract.
func (k *Kernel) Execute(ctx context.Context, cell sandbox.Cell) (*sandbox.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("execute on kernel %s: %w", k.ID(), err)
	}
	timeout := cell.Timeout
	if timeout <= 0 {
		timeout = k.b.cfg.CellTimeout
	}
	c := &cellRun{k: k, timeout: timeout, setup: cell.Setup, em: emit.New(k.limits.OutputBytes, cell.Output), msgs: make(chan jupyter.Msg), quit: make(chan struct{})}
	defer c.release()
	if k.client == nil {
		// An earlier death could not restart the kernel; try again now.
		if err := k.restartLocked(ctx); err != nil {
			return nil, fmt.Errorf("kernel %s is down and did not restart: %w", k.ID(), err)
		}
		c.restarted = true
	}
	c.start = time.Now()
	return c.run(ctx, cell.Code)
}

// cellRun is one Execute in progress.
type cellRun struct {
	k         *Kernel
	ex        *jupyter.Execution
	em        *emit.Meter
	start     time.Time
	timeout   time.Duration
	restarted bool
	setup     bool // a setup cell: not counted in the execution counter

	// msgs carries each output message from the client's iopub reader to
	// the goroutine that called Execute, unbuffered: the reader waits
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

// stopReason says why a running cell is being stopped: the kind and ename
// its result carries, and how to say it in evalue.
type stopReason struct {
	kind, ename string
	what        string // "the cell ran past its 2s timeout"
}

// onOutput is the client's ExecOptions.OnOutput: it hands m to the
// Execute goroutine, or drops it once that has stopped listening.
func (c *cellRun) onOutput(m jupyter.Msg) {
	select {
	case c.msgs <- m:
	case <-c.quit:
	}
}

// release stops the hand-over: the client's reader is never left blocked
// on a cell nobody waits for, so closing the client cannot hang. It is
// called before anything closes the client, and when Execute returns.
func (c *cellRun) release() { c.quitOnce.Do(func() { close(c.quit) }) }

func (c *cellRun) run(ctx context.Context, code string) (*sandbox.Result, error) {
	k := c.k
	ex, err := c.send(ctx, code)
	if err != nil {
		c.release()
		switch {
		case errors.Is(err, jupyter.ErrKernelDead):
			return k.died(ctx, c), nil
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
		return nil, fmt.Errorf("execute on kernel %s: %w", k.ID(), err)
	}
	c.ex = ex
	client, exited := k.client, k.exited
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
		case <-k.closing:
			return nil, sandbox.ErrClosed
		case <-deadline.C:
			return c.stop(ctx, c.timeoutReason())
		case <-ctx.Done():
			return c.stop(ctx, c.hangUpReason(ctx))
		}
	}
}

func (c *cellRun) timeoutReason() stopReason {
	return stopReason{kind: sandbox.KindTimeout, ename: "TimeoutError", what: fmt.Sprintf("the cell ran past its %s timeout", c.timeout)}
}

func (c *cellRun) hangUpReason(ctx context.Context) stopReason {
	return stopReason{kind: sandbox.KindInterrupted, ename: "Interrupted", what: "the caller stopped waiting (" + context.Cause(ctx).Error() + ")"}
}

// send hands the cell to the kernel. The Jupyter client's send is not bounded by a
// context and blocks while the kernel does not read, so it runs aside and
// the wait is bounded by the cell's timeout, the caller, the kernel's exit
// and Close; a send left blocked ends when the client is closed (the
// restart that follows a wedged kernel closes it).
func (c *cellRun) send(ctx context.Context, code string) (*jupyter.Execution, error) {
	k := c.k
	type sent struct {
		ex  *jupyter.Execution
		err error
	}
	client := k.client
	ch := make(chan sent, 1)
	opts := jupyter.ExecOptions{OnOutput: c.onOutput, MaxOutput: c.em.Limit(), UserExpressions: threadExprs, SkipHistory: c.setup}
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
	case <-k.exited:
		return nil, jupyter.ErrKernelDead
	case <-client.Dead():
		return nil, jupyter.ErrKernelDead
	case <-k.closing:
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
func (c *cellRun) deliver(m jupyter.Msg) {
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
func (c *cellRun) show(d *jupyter.Display) {
	b := bundle(d.Bundle)
	if c.em.Emit(sandbox.Event{Kind: sandbox.EventDisplay, Bundle: b}) {
		c.shown = append(c.shown, shownDisplay{id: d.DisplayID, bundle: b})
	}
}

// clear delivers a clear_output.
func (c *cellRun) clear() {
	c.shown = nil
	c.em.Emit(sandbox.Event{Kind: sandbox.EventClear})
}

func bundle(b jupyter.Bundle) *sandbox.Bundle {
	return &sandbox.Bundle{Data: b.Data, Metadata: b.Metadata}
}

// drain delivers the messages the reader is handing over right now, then
// releases it: for a cell that is over (dead, stopped), what already
// arrived still reaches the caller.
func (c *cellRun) drain() {
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
func (c *cellRun) result(o jupyter.Output) *sandbox.Result {
	return &sandbox.Result{
		OK:             o.Status == jupyter.StatusOK && o.Error == nil,
		ExecutionCount: o.ExecutionCount,
		Restarted:      c.restarted,
		Duration:       time.Since(c.start),
	}
}

// finish reports a cell that completed, with the threads it left
// running. Every output message was delivered before Done closed.
func (c *cellRun) finish(ctx context.Context) *sandbox.Result {
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
func (c *cellRun) dead(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-c.ex.Done():
		return c.finish(ctx), nil
	default:
	}
	c.drain()
	return c.k.died(ctx, c), nil
}

// stop interrupts a running cell (past its deadline, or abandoned by the
// caller). If the cell ends within the grace period the kernel keeps its
// state; if not, the kernel is restarted. Output goes on being delivered,
// within the limit, while the cell winds down.
func (c *cellRun) stop(ctx context.Context, why stopReason) (*sandbox.Result, error) {
	k := c.k
	grace := k.b.cfg.InterruptGrace
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	client, exited := k.client, k.exited
	ierr := make(chan error, 1)
	go func() { ierr <- client.Interrupt(gctx) }()
wait:
	for {
		select {
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
		case <-k.closing:
			return nil, sandbox.ErrClosed
		case <-gctx.Done():
			break wait
		}
	}
	c.release()
	var interruptErr error
	select {
	case interruptErr = <-ierr:
	default:
	}
	k.b.log.WarnContext(ctx, "cell did not stop when interrupted; restarting the kernel", "kernel", k.ID(), "why", why.kind, "interrupt_err", interruptErr)
	res := c.result(jupyter.Output{})
	res.OK = false
	res.Error = &sandbox.ExecError{
		Kind:      why.kind,
		Ename:     why.ename,
		Evalue:    fmt.Sprintf("%s and did not stop within %s of an interrupt; the kernel was restarted and its state is lost", why.what, grace),
		Traceback: []string{},
	}
	if err := k.restartLocked(context.WithoutCancel(ctx)); err != nil {
		res.Error.Evalue = fmt.Sprintf("%s and did not stop when interrupted; restarting the kernel failed (%v), the next cell will try again", why.what, err)
		return res, nil
	}
	res.Restarted = true
	return res, nil
}

// cut stops a cell whose output passed the limit. The connection goes
// first, so the host reads nothing more of the flood; the cell is then
// interrupted with SIGINT (what interrupt_request does inside ipykernel),
// and a new connection waits for the kernel to answer again, which it does
// once the cell has ended. If that takes longer than the grace period, the
// kernel is restarted.
func (c *cellRun) cut(ctx context.Context) *sandbox.Result {
	k := c.k
	c.release()
	count := c.ex.Output().ExecutionCount
	k.stopKernel()
	grace := k.b.cfg.InterruptGrace
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	what := fmt.Sprintf("the cell's output passed the %s limit", emit.Bytes(c.em.Limit()))
	res := c.result(jupyter.Output{ExecutionCount: count})
	res.OK = false
	res.Error = &sandbox.ExecError{Kind: sandbox.KindOutputLimit, Ename: "OutputLimitExceeded", Traceback: []string{}}
	err := k.signal(gctx, "INT")
	if err == nil {
		err = k.redial(gctx)
	}
	if err == nil {
		res.Error.Evalue = what + " and was interrupted; the kernel kept its state"
		res.Threads = c.threads(ctx, jupyter.Output{})
		return res
	}
	k.b.log.WarnContext(ctx, "cell did not stop after passing the output limit; restarting the kernel", "kernel", k.ID(), "err", err)
	res.Error.Evalue = fmt.Sprintf("%s and did not stop within %s of an interrupt; the kernel was restarted and its state is lost", what, grace)
	if rerr := k.restartLocked(context.WithoutCancel(ctx)); rerr != nil {
		res.Error.Evalue = fmt.Sprintf("%s and did not stop when interrupted; restarting the kernel failed (%v), the next cell will try again", what, rerr)
		return res
	}
	res.Restarted = true
	return res
}

// redial connects a new client to the running kernel and waits until it
// answers (after the cell in progress, if any, has ended).
func (k *Kernel) redial(ctx context.Context) error {
	client, err := jupyter.Dial(ctx, k.info, k.sockPrefix(), k.dialOptions())
	if err != nil {
		return fmt.Errorf("redial kernel: %w", err)
	}
	if err := client.WaitReady(ctx); err != nil {
		client.Close()
		return fmt.Errorf("redial kernel: %w", err)
	}
	k.client = client
	return nil
}

// wedged restarts a kernel that did not take a cell.
func (c *cellRun) wedged(ctx context.Context, why stopReason) *sandbox.Result {
	c.release()
	res := c.result(jupyter.Output{})
	res.Error = &sandbox.ExecError{
		Kind:      why.kind,
		Ename:     why.ename,
		Evalue:    why.what + " before the kernel accepted the cell; the kernel was restarted and its state is lost",
		Traceback: []string{},
	}
	if err := c.k.restartLocked(context.WithoutCancel(ctx)); err != nil {
		res.Error.Evalue = fmt.Sprintf("%s before the kernel accepted the cell, and restarting it failed (%v); the next cell will try again", why.what, err)
		return res
	}
	res.Restarted = true
	return res
}
