package kube

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker/jupyter"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// pollInterval is how often a running cell's output is looked at. It bounds
// how late output reaches the caller, and how much more than the output
// limit the Jupyter client can buffer before the connection is cut (at the
// ~100 MB/s a cell can print, about 0.5 MB).
const pollInterval = 5 * time.Millisecond

// Execute implements sandbox.Kernel, as sandbox/docker does: output is
// delivered as the Jupyter client gathers it, polled every pollInterval; a
// timed-out or abandoned cell is interrupted over the control channel, and
// the kernel is restarted (moved to a fresh pod with its files) if the
// cell does not end within Config.InterruptGrace. See sandbox.Kernel for
// the contract.
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
	k.busy.Store(true)
	defer k.busy.Store(false)
	c := &cellRun{k: k, timeout: timeout, em: emit.New(k.limits.OutputBytes, cell.Output), restarted: k.restarted}
	k.restarted = false
	if pc := k.current(); pc == nil || pc.client == nil || pc.gone() {
		// An earlier death could not restart the kernel, or the pod went
		// away between calls (evicted, deleted): start afresh now.
		if err := k.restartLocked(ctx); err != nil {
			return nil, fmt.Errorf("kernel %s is down and did not restart: %w", k.ID(), err)
		}
		c.restarted = true
	}
	k.touch(k.current())
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

	// What has been delivered, as of the last snapshot. The strings share
	// the client's buffers, so keeping them costs nothing while they grow
	// in place.
	stdout, stderr string
	displays       []jupyter.Display
}

var errCellTimeout = errors.New("cell timeout")

// stopReason says why a running cell is being stopped: the kind and ename
// its result carries, and how to say it in evalue.
type stopReason struct {
	kind, ename string
	what        string // "the cell ran past its 2s timeout"
}

func (c *cellRun) run(ctx context.Context, code string) (*sandbox.Result, error) {
	k := c.k
	ex, err := c.send(ctx, code)
	if err != nil {
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
	pc := k.current()
	client, exited := pc.client, pc.watch.gone
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ex.Done():
			return c.finish(), nil
		case <-client.Dead():
			return c.dead(ctx)
		case <-exited:
			return c.dead(ctx)
		case <-k.closing:
			return nil, sandbox.ErrClosed
		case <-tick.C:
			c.pump(ex.Output())
			if c.em.Over() {
				return c.cut(ctx), nil
			}
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
	pc := k.current()
	client := pc.client
	ch := make(chan sent, 1)
	go func() {
		ex, err := client.Execute(context.WithoutCancel(ctx), code, jupyter.ExecOptions{})
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
	case <-pc.watch.gone:
		return nil, jupyter.ErrKernelDead
	case <-client.Dead():
		return nil, jupyter.ErrKernelDead
	case <-k.closing:
		return nil, sandbox.ErrClosed
	}
}

// pump delivers what the snapshot o holds beyond what was delivered
// before: new stream text, then new displays. A snapshot that does not
// extend the last one means the cell cleared its output (clear_output, or
// an update_display_data of one of its displays): EventClear, then the
// snapshot's whole content, so a Collector ends with what a notebook shows.
func (c *cellRun) pump(o jupyter.Output) {
	if c.em.Over() {
		return
	}
	if !strings.HasPrefix(o.Stdout, c.stdout) || !strings.HasPrefix(o.Stderr, c.stderr) || !extends(o.Displays, c.displays) {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventClear})
		c.stdout, c.stderr, c.displays = "", "", nil
	}
	if len(o.Stdout) > len(c.stdout) {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventStdout, Text: o.Stdout[len(c.stdout):]})
	}
	if len(o.Stderr) > len(c.stderr) {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventStderr, Text: o.Stderr[len(c.stderr):]})
	}
	for _, d := range o.Displays[len(c.displays):] {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventDisplay, Bundle: &sandbox.Bundle{Data: d.Data, Metadata: d.Metadata}})
	}
	c.stdout, c.stderr, c.displays = o.Stdout, o.Stderr, o.Displays
}

// extends reports whether now starts with the displays of before, the same
// bundles (the client never changes a bundle's map, it replaces the
// display).
func extends(now, before []jupyter.Display) bool {
	if len(now) < len(before) {
		return false
	}
	for i, d := range before {
		if reflect.ValueOf(now[i].Data).UnsafePointer() != reflect.ValueOf(d.Data).UnsafePointer() {
			return false
		}
	}
	return true
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

// finish reports a cell that completed.
func (c *cellRun) finish() *sandbox.Result {
	o := c.ex.Output()
	c.pump(o)
	res := c.result(o)
	if o.Result != nil {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventResult, Bundle: &sandbox.Bundle{Data: o.Result.Data, Metadata: o.Result.Metadata}})
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
		return c.finish(), nil
	default:
	}
	c.pump(c.ex.Output())
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
	pc := k.current()
	client, exited := pc.client, pc.watch.gone
	ierr := make(chan error, 1)
	go func() { ierr <- client.Interrupt(gctx) }()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
wait:
	for {
		select {
		case <-c.ex.Done():
			o := c.ex.Output()
			c.pump(o)
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
			return res, nil
		case <-client.Dead():
			return c.dead(ctx)
		case <-exited:
			return c.dead(ctx)
		case <-k.closing:
			return nil, sandbox.ErrClosed
		case <-tick.C:
			c.pump(c.ex.Output())
			if c.em.Over() {
				break wait // it floods while winding down: restart
			}
		case <-gctx.Done():
			break wait
		}
	}
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
// first, the whole port-forward with it (its streams are full of the
// flood, and a new stream on it would wait behind them), so the client
// buffers nothing more of the flood; a new client
// then interrupts the cell over the control channel and waits for the
// kernel to answer again, which it does once the cell has ended. If that
// takes longer than the grace period, the kernel is restarted.
func (c *cellRun) cut(ctx context.Context) *sandbox.Result {
	k := c.k
	count := c.ex.Output().ExecutionCount
	pc := k.current()
	_ = pc.client.Close()
	pc.client = nil
	_ = pc.fwd.Close()
	grace := k.b.cfg.InterruptGrace
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	what := fmt.Sprintf("the cell's output passed the %s limit", emit.Bytes(c.em.Limit()))
	res := c.result(jupyter.Output{ExecutionCount: count})
	res.OK = false
	res.Error = &sandbox.ExecError{Kind: sandbox.KindOutputLimit, Ename: "OutputLimitExceeded", Traceback: []string{}}
	client, err := pc.dial(gctx)
	if err == nil {
		if err = client.Interrupt(gctx); err == nil {
			err = client.WaitReady(gctx)
		}
		if err != nil {
			client.Close()
		}
	}
	if err == nil {
		pc.client = client
		res.Error.Evalue = what + " and was interrupted; the kernel kept its state"
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

// wedged restarts a kernel that did not take a cell.
func (c *cellRun) wedged(ctx context.Context, why stopReason) *sandbox.Result {
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
