package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
	"github.com/triadhq/triad/sandbox/internal/supervisor"
)

var _ sandbox.Commander = (*Kernel)(nil)

// Command implements sandbox.Commander: the command runs under the
// supervisor (sandbox/internal/supervisor, the one sandbox/docker runs) in
// a pods/exec session into the kernel container of the kernel's current
// pod. The session runs in the container's cgroup under the pod's security
// context, so the command has a cell's jail: the pod's uid, no
// capabilities, the read-only root, the seccomp profile, the deny-all
// NetworkPolicy, the container's memory and CPU limits; its process limit,
// which the kubelet does not carry into an exec, is set again as the
// kernel's is (commandArgv). Its stdout and stderr stream to cmd.Output
// as the session delivers them, counted against the cell output limit.
// Stopping it half-closes the session's stdin, whose EOF makes the
// supervisor kill the command's session. See docs/DECISIONS.md, "Commands
// on Kubernetes".
func (k *Kernel) Command(ctx context.Context, cmd sandbox.Command) (*sandbox.CommandResult, error) {
	p, err := supervisor.Prepare(podWork, cmd)
	if err != nil {
		return nil, err
	}
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("command on kernel %s: %w", k.ID(), err)
	}
	pc := k.current()
	if pc == nil {
		return nil, sandbox.ErrClosed
	}
	if pc.gone() {
		// Execute restarts a dead kernel; a command, which runs beside
		// cells and so cannot take the kernel's lock, does not.
		return nil, fmt.Errorf("command on kernel %s: the kernel is down (%s); run a cell to restart it", pc.name, deathReason(pc.watch.last.Load()))
	}
	defer k.use()()
	start := time.Now()
	ctl := cmd.Control
	if ctl != nil {
		defer ctl.Ended()
	}
	req := k.b.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(k.b.cfg.Namespace).Name(pc.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: kernelContainer,
			Command:   k.commandArgv(p, cmd.Args),
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := k.b.executor(req.URL())
	if err != nil {
		return nil, fmt.Errorf("command on kernel %s: %w", pc.name, err)
	}
	res, err := runSession(ctx, ex, cmd, sessionSettings{OutputBytes: k.limits.OutputBytes, Grace: k.b.cfg.InterruptGrace, Closing: k.closing})
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	if err != nil {
		return nil, fmt.Errorf("command on kernel %s: %w", pc.name, err)
	}
	res.Duration = time.Since(start)
	return res, nil
}

// sessionSettings are what runSession takes from the kernel.
type sessionSettings struct {
	OutputBytes int64           // the output limit (sandbox.Limits.OutputBytes)
	Grace       time.Duration   // how long a stopped session may take to end before it is cut
	Closing     <-chan struct{} // closed when the kernel closes, which stops the command
}

// runSession runs one supervisor session through ex, whose command line
// is the supervisor's, and delivers its output and control as
// sandbox.Commander says. The error is the session's when it failed
// before an exit status came back.
func runSession(ctx context.Context, ex remotecommand.Executor, cmd sandbox.Command, set sessionSettings) (*sandbox.CommandResult, error) {
	ctl := cmd.Control
	// The session's stdin is a pipe: the supervisor's control ops go in,
	// and closing it is the half-close that stops the command. It is
	// closed when runSession returns too (before Command's deferred
	// ctl.Ended), which releases a send blocked on a session that went
	// away, and client-go's copy of stdin with it, at an EOF rather than
	// an error, which client-go would log.
	inR, inW := io.Pipe()
	defer inW.Close()
	sctx, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()

	// client-go writes stdout and stderr from goroutines of its own; the
	// funnel brings every chunk to this goroutine, which alone delivers
	// output, as sandbox.Command.Output requires. quit releases a write
	// still in flight once this goroutine stops reading (after a cut,
	// client-go's copies can outlive the session's return).
	chunks := make(chan chunk)
	quit := make(chan struct{})
	defer close(quit)
	ended := make(chan error, 1)
	go func() {
		ended <- ex.StreamWithContext(sctx, remotecommand.StreamOptions{
			Stdin:  inR,
			Stdout: funnel{kind: sandbox.EventStdout, to: chunks, quit: quit},
			Stderr: funnel{kind: sandbox.EventStderr, to: chunks, quit: quit},
		})
	}()

	// The stopper closes the session's stdin, which makes the supervisor
	// kill the command's session; if the session has not ended a grace
	// period later, it cuts it, so the loop below returns whatever the
	// process does.
	var (
		mu     sync.Mutex
		why    string // why the host stopped the command, set by the stopper
		closed bool   // the session's stdin is closed: no more ops
		wasCut bool   // the stopper cut the session
	)
	send := func(op sandbox.ControlOp) error {
		b, err := supervisor.EncodeOp(op)
		if err != nil {
			return err
		}
		mu.Lock()
		c := closed
		mu.Unlock()
		if c {
			return sandbox.ErrCommandEnded
		}
		// Not under mu: a write blocks until the session takes it, and
		// the stopper must not wait behind it. A write the stopper's
		// Close overtakes fails, and io.Pipe keeps two writes whole.
		if _, err := inW.Write(b); err != nil {
			if errors.Is(err, io.ErrClosedPipe) {
				return sandbox.ErrCommandEnded
			}
			return err
		}
		return nil
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
		case <-set.Closing:
		}
		mu.Lock()
		why, closed = w, true
		mu.Unlock()
		_ = inW.Close() // EOF, not an error: client-go logs a copy that fails
		select {
		case <-done:
		case <-time.After(set.Grace):
			mu.Lock()
			wasCut = true
			mu.Unlock()
			cut()
		}
	}()

	m := emit.New(set.OutputBytes, cmd.Output)
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
	var serr error
	// A session that returns has finished its copies (client-go waits for
	// them before it reads the exit status), so every chunk was taken;
	// only a cut session can leave a write behind, which quit releases.
	for waiting := true; waiting; {
		select {
		case c := <-chunks:
			if c.kind == sandbox.EventStdout {
				_, _ = stdout.Write(c.b)
			} else {
				_, _ = stderr.Write(c.b)
			}
		case serr = <-ended:
			waiting = false
		}
	}
	stdout.Flush()
	stderr.Flush()
	res := &sandbox.CommandResult{}
	mu.Lock()
	res.Stopped = why
	c := wasCut
	mu.Unlock()
	var ee utilexec.ExitError
	switch {
	case serr == nil:
		res.ExitCode = 0
	case errors.As(serr, &ee):
		res.ExitCode = ee.ExitStatus()
	case c && res.Stopped != "":
		// The session did not end within the grace after its stdin
		// closed (the API server or the kubelet stopped answering), so
		// no exit status came back: the command ended as the host
		// killed it, as the orchestrator reports a command killed
		// before it could start.
		res.ExitCode = 128 + 9
	default:
		return nil, serr
	}
	return res, nil
}

// commandArgv is the session's command line: the supervisor's, under
// the kernel's process limit and without core files, as kernelScript
// sets them for the kernel (an exec gets the container runtime's limits,
// not those its kernel set for itself), with cmd's environment added by
// env (pods/exec takes no environment; the container's own is there
// already, as a docker exec has it).
func (k *Kernel) commandArgv(p supervisor.Prepared, args []string) []string {
	argv := []string{"/bin/sh", "-c", fmt.Sprintf(`ulimit -p %d || exit 90; ulimit -c 0; exec "$@"`, k.limits.Pids), "sh", "env", "--"}
	argv = append(argv, p.Env...)
	return append(argv, p.Argv(args)...)
}

// chunk is one write of the session's stdout or stderr, copied.
type chunk struct {
	kind sandbox.EventKind
	b    []byte
}

// funnel is one of the session's output streams: each write is copied
// and handed to the goroutine that delivers the command's output.
type funnel struct {
	kind sandbox.EventKind
	to   chan<- chunk
	quit <-chan struct{}
}

func (f funnel) Write(p []byte) (int, error) {
	select {
	case f.to <- chunk{kind: f.kind, b: append([]byte(nil), p...)}:
		return len(p), nil
	case <-f.quit:
		return 0, sandbox.ErrCommandEnded
	}
}
