package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
	"github.com/triadhq/triad/sandbox/internal/supervisor"
)

var _ sandbox.Commander = (*Kernel)(nil)

// Command implements sandbox.Commander: the command runs under the
// supervisor (sandbox/internal/supervisor) as a docker exec in the
// kernel's container, as the kernel's uid, so it has the same jail
// as a cell (no network, no capabilities, the seccomp profile, the
// container's memory, CPU and pids limits) and the same /work. Its stdout
// and stderr stream to cmd.Output as docker delivers them, counted against
// the cell output limit. See docs/DECISIONS.md, "Contexts and commands at
// the seam".
func (k *Kernel) Command(ctx context.Context, cmd sandbox.Command) (*sandbox.CommandResult, error) {
	p, err := supervisor.Prepare(ctrWork, cmd)
	if err != nil {
		return nil, err
	}
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("command on kernel %s: %w", k.ID(), err)
	}
	start := time.Now()
	ctl := cmd.Control
	if ctl != nil {
		defer ctl.Ended()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
	defer cancel()
	ex, err := k.b.cli.ContainerExecCreate(cctx, k.containerID, container.ExecOptions{
		User:         fmt.Sprintf("%d:%d", k.b.cfg.UID, k.b.cfg.GID),
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Env:          p.Env,
		WorkingDir:   ctrWork,
		Cmd:          p.Argv(cmd.Args),
	})
	if err != nil {
		if k.isClosing() {
			return nil, sandbox.ErrClosed
		}
		return nil, fmt.Errorf("command on kernel %s: create exec: %w", k.ID(), err)
	}
	att, err := k.b.cli.ContainerExecAttach(cctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		if k.isClosing() {
			return nil, sandbox.ErrClosed
		}
		return nil, fmt.Errorf("command on kernel %s: start exec: %w", k.ID(), err)
	}
	defer att.Close()

	// The stopper half-closes the exec's stdin, which makes the
	// supervisor kill the command's session; if the stream has not ended
	// a grace period later, it cuts the connection so the read below
	// returns whatever the process does.
	var (
		mu     sync.Mutex
		why    string // why the host stopped the command, set by the stopper
		closed bool   // the exec's stdin is half-closed: no more ops
	)
	send := func(op sandbox.ControlOp) error {
		b, err := supervisor.EncodeOp(op)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return sandbox.ErrCommandEnded
		}
		_, err = att.Conn.Write(b)
		return err
	}
	stop := make(chan string, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		var w string
		select {
		case <-done:
			return
		case <-ctx.Done():
			w = sandbox.KindInterrupted
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				w = sandbox.KindTimeout
			}
		case w = <-stop:
		case <-k.closing:
		}
		mu.Lock()
		why, closed = w, true
		_ = att.CloseWrite()
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(k.b.cfg.InterruptGrace):
			att.Close()
		}
	}()

	m := emit.New(k.limits.OutputBytes, cmd.Output)
	over := func() {
		select {
		case stop <- sandbox.KindOutputLimit:
		default:
		}
	}
	stdout := supervisor.NewStdout(m, over)
	stderr := supervisor.NewStderr(m, over, func(pid int) {
		if ctl != nil {
			ctl.Started(pid, send)
		}
	})
	_, cerr := stdcopy.StdCopy(stdout, stderr, att.Reader)
	stdout.Flush()
	stderr.Flush()
	res := &sandbox.CommandResult{Duration: time.Since(start)}
	mu.Lock()
	res.Stopped = why
	mu.Unlock()
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	code, err := k.execExitCode(context.WithoutCancel(ctx), ex.ID)
	if err != nil {
		if cerr != nil && !errors.Is(cerr, io.EOF) {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("command on kernel %s: %w", k.ID(), err)
	}
	res.ExitCode = code
	return res, nil
}

// execExitCode waits for an exec to be recorded as ended and returns its
// exit code. The output stream can end a moment before the engine has
// noted the exit.
func (k *Kernel) execExitCode(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	for {
		in, err := k.b.cli.ContainerExecInspect(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("inspect exec: %w", err)
		}
		if !in.Running {
			return in.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("exec still running after its output ended: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
