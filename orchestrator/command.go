package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// bashArgs is how a bash command runs: a login shell, as E2B's envd runs
// commands.run, so the image's profile applies.
func bashArgs(script string) []string { return []string{"/bin/bash", "-l", "-c", script} }

// RunsCommands reports whether sandbox.exec takes language bash on this
// server (true when no sandbox is configured: exec is then refused as a
// whole).
func (o *Orchestrator) RunsCommands() bool { return o.kernels == nil || o.kernels.RunsCommands() }

// commander returns the session's kernel as a sandbox.Commander, or the
// fault a backend without commands answers with.
func (o *Orchestrator) commander(sess *kernels.Session) (sandbox.Commander, error) {
	cm, ok := sess.Kernel.(sandbox.Commander)
	if !ok {
		return nil, fault.New(fault.Unsupported,
			fmt.Sprintf("the %s sandbox cannot run commands: its kernels have no processes", o.kernels.Backend()),
			"start triad with --sandbox docker to run bash commands, or do the work in a Python cell")
	}
	return cm, nil
}

// command1 is sandbox.exec with language bash in the foreground: the
// command runs in the run's kernel container, its output streamed to on,
// and the call answers when it has ended, with what it wrote harvested as
// a cell's would be.
func (o *Orchestrator) command1(ctx context.Context, run runid.ID, in wire.ExecRequest, timeout time.Duration, s *Step, oc *ExecOutcome, on func(ExecEvent)) (wire.ExecResponse, error) {
	out := wire.ExecResponse{Display: []wire.Bundle{}, FilesOut: []wire.FileRef{}, Kernel: wire.KernelInfo{Backend: o.kernels.Backend()}}
	oc.Backend = out.Kernel.Backend
	sess, ow, err := o.session(ctx, run, oc)
	if err != nil {
		return out, err
	}
	defer o.kernels.Release(sess)
	cm, err := o.commander(sess)
	if err != nil {
		return out, err
	}
	if err := o.filesIn(ctx, run, ow, sess, s, in.FilesIn); err != nil {
		return out, err
	}
	outp := newOutput(o.exec.StreamCap, o.exec.SpoolDir, on)
	defer outp.close()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := cm.Command(cctx, sandbox.Command{Args: bashArgs(in.Code), Env: o.commandEnv(run, in.Env), Dir: in.Cwd, Output: outp.add})
	if err != nil {
		return out, sandboxErr(err)
	}
	o.commandEnded(ctx, run, sess, res, outp, timeout, s, oc, &out, true)
	return out, nil
}

// commandEnded fills in the answer of an ended command: its streams (kept
// whole as run files when over the cap), its exit code and how it failed,
// and, when harvest is set, the files it left in the working directory.
func (o *Orchestrator) commandEnded(ctx context.Context, run runid.ID, sess *kernels.Session, res *sandbox.CommandResult, outp *output, timeout time.Duration, s *Step, oc *ExecOutcome, out *wire.ExecResponse, harvest bool) {
	if harvest {
		if err := o.harvest(ctx, run, sess, s, oc, out); err != nil {
			oc.HarvestErr = fault.From(err).Message
		}
	}
	prefix := fmt.Sprintf("outputs/cmd-%s", time.Now().UTC().Format("20060102T150405.000"))
	o.keepStreams(ctx, run, outp, prefix, s, out)
	code := res.ExitCode
	out.ExitCode = &code
	out.DurationMs = res.Duration.Milliseconds()
	out.OK = res.Stopped == "" && code == 0
	switch res.Stopped {
	case sandbox.KindTimeout:
		out.Error = &wire.ExecError{Kind: wire.CellTimeout, Message: fmt.Sprintf("the command ran past its %s deadline and was killed", timeout),
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
	oc.Egress = o.takeEgress(run)
}

// Command is a command started by StartCommand. It runs in the run's
// kernel container without holding the run: the run's other calls go on
// while it runs. Its start and its end are each a step of the run's
// journal.
type Command struct {
	// N numbers the command among the run's commands, from 1.
	N int

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
	if err := o.validateExec(run, &in); err != nil {
		return nil, err
	}
	timeout := o.execTimeout(in)
	oc := o.execOutcome(in, timeout)
	oc.Phase = PhaseStart
	co := callOpts(opts)
	oc.Stdin = stdinMode(co.stdin, co.pty)
	c := &Command{done: make(chan struct{}), ctl: sandbox.NewCommandControl(), stdin: co.stdin, pty: co.pty}
	var (
		sess *kernels.Session
		cm   sandbox.Commander
	)
	err := o.call(ctx, run, oc, func(ctx context.Context, s *Step) error {
		oc.Backend = o.kernels.Backend()
		var (
			err error
			ow  owner
		)
		if sess, ow, err = o.session(ctx, run, oc); err != nil {
			return err
		}
		if cm, err = o.commander(sess); err == nil {
			err = o.filesIn(ctx, run, ow, sess, s, in.FilesIn)
		}
		if err != nil {
			o.kernels.Release(sess)
			return err
		}
		c.N = o.nextCommand(ctx, run)
		oc.Command, oc.Ran, oc.OK = c.N, true, true
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The session stays busy (never reaped) until the command's end is
	// recorded: Release is in finish.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	c.cancel = cancel
	go o.runCommand(cctx, run, in, timeout, sess, cm, c, on)
	return c, nil
}

// runCommand runs a started command and records its end.
func (o *Orchestrator) runCommand(ctx context.Context, run runid.ID, in wire.ExecRequest, timeout time.Duration, sess *kernels.Session, cm sandbox.Commander, c *Command, on func(ExecEvent)) {
	defer close(c.done)
	defer c.cancel()
	defer o.kernels.Release(sess)
	outp := newOutput(o.exec.StreamCap, o.exec.SpoolDir, on)
	defer outp.close()
	res, cerr := cm.Command(ctx, sandbox.Command{Args: bashArgs(in.Code), Env: o.commandEnv(run, in.Env), Dir: in.Cwd, Output: outp.add,
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
	oc := o.execOutcome(in, timeout)
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
	out := wire.ExecResponse{Display: []wire.Bundle{}, FilesOut: []wire.FileRef{}, Kernel: wire.KernelInfo{Backend: oc.Backend}}
	rctx := context.WithoutCancel(ctx)
	c.err = o.call(rctx, run, oc, func(ctx context.Context, s *Step) error {
		if cerr != nil {
			if errors.Is(cerr, sandbox.ErrClosed) {
				return fault.Wrap(fault.Unavailable, cerr, "the run's kernel was stopped while the command ran, which killed it",
					"run the command again; the run's files stay")
			}
			return sandboxErr(cerr)
		}
		// Harvest only from the run's kernel of now: one that was stopped
		// or replaced meanwhile has nothing the store lacks.
		o.commandEnded(ctx, run, sess, res, outp, timeout, s, oc, &out, o.kernels.Peek(run) == sess)
		return nil
	})
	c.out = out
}

// nextCommand numbers the run's next command.
// Called with the run held; the count starts from the run's trace when
// the idle sweep dropped it (or another process started commands).
func (o *Orchestrator) nextCommand(ctx context.Context, run runid.ID) int {
	v, loaded := o.cmds.LoadOrStore(run, &cmdCounter{})
	ct := v.(*cmdCounter)
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if !loaded {
		ct.n = o.commandsSoFar(ctx, run)
	}
	ct.n++
	return ct.n
}

type cmdCounter struct {
	mu sync.Mutex
	n  int
}
