package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// bashArgs is how a bash command runs: a login shell, as E2B's envd runs
// commands.run, so the image's profile applies.
func bashArgs(script string) []string { return []string{"/bin/bash", "-l", "-c", script} }

// commander returns the session's kernel as a sandbox.Commander, or the
// fault a backend without commands answers with.
func commander(backend string, sess *kernels.Session) (sandbox.Commander, error) {
	cm, ok := sess.Kernel.(sandbox.Commander)
	if !ok {
		return nil, fault.New(fault.Unsupported,
			fmt.Sprintf("the %s sandbox cannot run commands: its kernels have no processes", backend),
			"start triad with --sandbox docker or --sandbox kube to run bash commands, or do the work in a Python cell")
	}
	return cm, nil
}

// command is sandbox.exec with language bash in the foreground: the
// command runs in the run's kernel container, its output streamed to on,
// and the call answers when it has ended, with what it wrote harvested as
// a cell's would be.
func (x *cell) command(ctx context.Context) error {
	o := x.o
	x.out = wire.ExecResponse{Display: []wire.Bundle{}, FilesOut: []wire.FileRef{}, Kernel: wire.KernelInfo{Backend: o.kernels.Backend()}}
	x.oc.Backend = x.out.Kernel.Backend
	if err := x.session(ctx); err != nil {
		return err
	}
	defer o.kernels.Release(x.kernel)
	cm, err := commander(o.kernels.Backend(), x.kernel)
	if err != nil {
		return err
	}
	if err := x.filesIn(ctx); err != nil {
		return err
	}
	outp := newOutput(o.exec.StreamCap, o.exec.SpoolDir, x.on)
	defer outp.close()
	cctx, cancel := context.WithTimeout(ctx, x.timeout)
	defer cancel()
	res, err := cm.Command(cctx, sandbox.Command{Args: bashArgs(x.in.Code), Env: o.sb.commandEnv(x.run, x.in.Env), Dir: x.in.Cwd, Output: outp.add})
	if err != nil {
		return sandboxErr(err)
	}
	x.commandEnded(ctx, res, outp, true)
	return nil
}

// commandEnded fills in the answer of an ended command: its streams (kept
// whole as run files when over the cap), its exit code and how it failed,
// and, when harvest is set, the files it left in the working directory.
func (x *cell) commandEnded(ctx context.Context, res *sandbox.CommandResult, outp *output, harvest bool) {
	out, oc := &x.out, x.oc
	if harvest {
		if err := x.harvest(ctx); err != nil {
			oc.HarvestErr = fault.From(err).Message
		}
	}
	prefix := fmt.Sprintf("outputs/cmd-%s", time.Now().UTC().Format("20060102T150405.000"))
	x.keepStreams(ctx, outp, prefix)
	code := res.ExitCode
	out.ExitCode = &code
	out.DurationMs = res.Duration.Milliseconds()
	out.OK = res.Stopped == "" && code == 0
	switch res.Stopped {
	case sandbox.KindTimeout:
		out.Error = &wire.ExecError{Kind: wire.CellTimeout, Message: fmt.Sprintf("the command ran past its %s deadline and was killed", x.timeout),
			Suggestion: "make the command faster or split it, or raise timeout_s (up to the server maximum)"}
	case sandbox.KindInterrupted:
		out.Error = &wire.ExecError{Kind: wire.CellInterrupted, Message: "the command was killed before it ended",
			Suggestion: "run it again and let it finish"}
	case sandbox.KindOutputLimit:
		out.Error = &wire.ExecError{Kind: wire.CellOutputLimit, Message: "the command's output passed the per-call output limit and it was killed",
			Suggestion: "print less: redirect large output to a file in the working directory (it becomes a run file)"}
	default:
		if code != 0 {
			out.Error = &wire.ExecError{Kind: wire.CellExitCode, Message: fmt.Sprintf("the command exited with code %d", code),
				Suggestion: "read its stderr, fix the command and run it again"}
		}
	}
	oc.Ran, oc.OK, oc.Error, oc.Stderr, oc.ExitCode = true, out.OK, out.Error, out.Stderr, out.ExitCode
	oc.Egress = x.o.sb.take(x.run)
}

// Command is a command started by StartCommand. It runs in the run's
// kernel container without holding the run: the run's other calls go on
// while it runs. Its start and its end are each a step of the run's
// journal.
type Command struct {
	// N numbers the command among the run's commands, from 1.
	N int

	who   auth.Principal // who started it, who its end is recorded as
	cm    sandbox.Commander
	ctl   *sandbox.CommandControl
	stdin bool
	pty   *sandbox.TermSize

	cancel context.CancelFunc
	done   chan struct{}
	out    wire.ExecResponse // set before done closes
	err    error
}

// Done is closed when the command has ended and its end is recorded.
func (c *Command) Done() <-chan struct{} { return c.done }

// Wait waits for the command to end (or ctx to be done) and returns its
// answer, as sandbox.exec answers a foreground command.
func (c *Command) Wait(ctx context.Context) (wire.ExecResponse, error) {
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
		return wire.ExecResponse{}, ctx.Err()
	}
}

// Kill kills the command and everything it started. Its end is recorded
// as any end is; Wait returns it. Killing an ended command does nothing.
func (c *Command) Kill() { c.cancel() }

// Pid waits until the command runs and returns its pid in the sandbox; ok
// is false when it ended without running (or its backend does not say).
func (c *Command) Pid(ctx context.Context) (pid int, ok bool) { return c.ctl.Pid(ctx) }

// Input writes b to the command's stdin (WithStdin) or types it into its
// terminal (WithPty). What was sent is counted in the command's end step.
func (c *Command) Input(b []byte) error {
	if !c.stdin && c.pty == nil {
		return fault.New(fault.BadInput, "the command was started without stdin", "start it with stdin open to send it input")
	}
	return c.send(sandbox.ControlOp{Data: b})
}

// CloseStdin closes the command's stdin (in a terminal: sends end of file).
func (c *Command) CloseStdin() error {
	if !c.stdin && c.pty == nil {
		return fault.New(fault.BadInput, "the command was started without stdin", "start it with stdin open to close it")
	}
	return c.send(sandbox.ControlOp{Close: true})
}

// Resize resizes the command's terminal.
func (c *Command) Resize(size sandbox.TermSize) error {
	if c.pty == nil {
		return fault.New(fault.BadInput, "the command has no terminal", "start it in a pseudo-terminal to resize it")
	}
	return c.send(sandbox.ControlOp{Size: &size})
}

// Signal sends signal sig to the command's process group.
func (c *Command) Signal(sig int) error { return c.send(sandbox.ControlOp{Signal: sig}) }

func (c *Command) send(op sandbox.ControlOp) error {
	err := c.ctl.Send(op)
	if errors.Is(err, sandbox.ErrCommandEnded) {
		return fault.New(fault.NotFound, "the command is not running", "start it again")
	}
	if err != nil {
		return fault.Wrap(fault.Unavailable, err, "could not reach the command", "try again; the command may have ended")
	}
	return nil
}

// stdinMode says in a step how a command's stdin was set up.
func stdinMode(stdin bool, pty *sandbox.TermSize) string {
	switch {
	case pty != nil:
		return fmt.Sprintf("a %dx%d terminal", pty.Cols, pty.Rows)
	case stdin:
		return "open"
	}
	return ""
}

// StartCommand is sandbox.exec with language bash in the background: the
// call that starts the command is a step of the journal and returns once
// the command runs; the command goes on without holding the run, its
// output handed to on as it arrives (from the command's goroutine); when it
// ends (by itself, killed, or past in.TimeoutS) its end is recorded as a
// step of its own, with what it wrote to the working directory. The
// command is not tied to ctx: Kill ends it.
func (o *Orchestrator) StartCommand(ctx context.Context, run runid.ID, in wire.ExecRequest, on func(ExecEvent), opts ...CallOption) (*Command, error) {
	if o.kernels == nil {
		return nil, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker")
	}
	if in.Language == "" {
		in.Language = wire.LanguageBash
	}
	if in.Language != wire.LanguageBash {
		return nil, fault.New(fault.BadInput, fmt.Sprintf("language %q cannot run in the background", in.Language), "send language \"bash\"")
	}
	if err := validateExec(o.kernels, run, &in); err != nil {
		return nil, err
	}
	timeout := o.exec.timeout(in)
	oc := execOutcome(in, timeout)
	oc.Phase = PhaseStart
	co := callOpts(opts)
	oc.Stdin = stdinMode(co.stdin, co.pty)
	c := &Command{done: make(chan struct{}), who: auth.From(ctx), ctl: sandbox.NewCommandControl(), stdin: co.stdin, pty: co.pty}
	var x *cell
	err := o.call(ctx, run, oc, nil, func(ctx context.Context, cl *call) error {
		x = &cell{call: cl, in: in, timeout: timeout, oc: oc}
		oc.Backend = o.kernels.Backend()
		if err := x.session(ctx); err != nil {
			return err
		}
		cm, err := commander(o.kernels.Backend(), x.kernel)
		if err == nil {
			err = x.filesIn(ctx)
		}
		if err != nil {
			o.kernels.Release(x.kernel)
			return err
		}
		c.N = cl.r.nextCommand(ctx, o.store)
		c.cm = cm
		oc.Command, oc.Ran, oc.OK = c.N, true, true
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The session stays busy (never reaped) until the command's end is
	// recorded: Release is in runCommand. The command is the
	// orchestrator's: Close kills it and waits for its end's record.
	cctx, cancel := context.WithTimeout(o.stopCmds, timeout)
	c.cancel = cancel
	o.commands.Add(1)
	go func() {
		defer o.commands.Done()
		o.runCommand(cctx, run, in, timeout, x.kernel, c, on)
	}()
	return c, nil
}

// runCommand runs a started command and records its end, as a call of its
// own.
func (o *Orchestrator) runCommand(ctx context.Context, run runid.ID, in wire.ExecRequest, timeout time.Duration, sess *kernels.Session, c *Command, on func(ExecEvent)) {
	defer close(c.done)
	defer c.cancel()
	defer o.kernels.Release(sess)
	outp := newOutput(o.exec.StreamCap, o.exec.SpoolDir, on)
	defer outp.close()
	res, cerr := c.cm.Command(ctx, sandbox.Command{Args: bashArgs(in.Code), Env: o.sb.commandEnv(run, in.Env), Dir: in.Cwd, Output: outp.add,
		Stdin: c.stdin, Pty: c.pty, Control: c.ctl})
	c.ctl.Ended()
	if cerr != nil && ctx.Err() != nil && (errors.Is(cerr, context.Canceled) || errors.Is(cerr, context.DeadlineExceeded)) {
		// Killed (or past its deadline) before it could start: it ended
		// as a killed command does.
		why := sandbox.KindInterrupted
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = sandbox.KindTimeout
		}
		res, cerr = &sandbox.CommandResult{ExitCode: 128 + 9, Stopped: why}, nil
	}
	oc := execOutcome(in, timeout)
	oc.Phase, oc.Command, oc.Backend = PhaseEnd, c.N, o.kernels.Backend()
	oc.Stdin = stdinMode(c.stdin, c.pty)
	if st := c.ctl.Stats(); st != (sandbox.InputStats{}) {
		oc.Stdin += fmt.Sprintf("; sent %d bytes in %d writes, %d resizes, %d signals", st.Bytes, st.Writes, st.Resizes, st.Signals)
		if st.Closed {
			oc.Stdin += ", stdin closed"
		}
	}
	// Ended, so Pid answers at once.
	if pid, ok := c.ctl.Pid(context.Background()); ok {
		oc.Pid = pid
	}
	var out wire.ExecResponse
	// The end is recorded as the caller that started the command.
	rctx := auth.With(context.WithoutCancel(ctx), c.who)
	c.err = o.call(rctx, run, oc, nil, func(ctx context.Context, cl *call) error {
		x := &cell{call: cl, in: in, timeout: timeout, oc: oc, kernel: sess,
			out: wire.ExecResponse{Display: []wire.Bundle{}, FilesOut: []wire.FileRef{}, Kernel: wire.KernelInfo{Backend: oc.Backend}}}
		defer func() { out = x.out }()
		if cerr != nil {
			if errors.Is(cerr, sandbox.ErrClosed) {
				return fault.Wrap(fault.Unavailable, cerr, "the run's kernel was stopped while the command ran, which killed it",
					"run the command again; the run's files stay")
			}
			return sandboxErr(cerr)
		}
		// Harvest only from the run's kernel of now: one that was stopped
		// or replaced meanwhile has nothing the store lacks.
		x.commandEnded(ctx, res, outp, o.kernels.Peek(run) == sess)
		return nil
	})
	c.out = out
}

// nextCommand numbers the run's next command.
// Called with the run held; the count starts from the run's trace when
// the idle sweep dropped it (or another process started commands).
func (r *run) nextCommand(ctx context.Context, store *tmpfs.Store) int {
	r.mu.Lock()
	counted := r.counted
	r.mu.Unlock()
	n := 0
	if !counted {
		n = commandsSoFar(ctx, store, r.id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.counted {
		r.commands, r.counted = n, true
	}
	r.commands++
	return r.commands
}

// commandsSoFar is the highest number a background command of the run was
// given, from its trace: numbers go on from there.
func commandsSoFar(ctx context.Context, store *tmpfs.Store, run runid.ID) int {
	tr, err := journal.ReadTrace(ctx, store, run)
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
