package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

var _ sandbox.Commander = (*Kernel)(nil)

// commandSupervisor runs a command for Kernel.Command inside the kernel's
// container: it enters the directory (argv[1]), starts the command (the
// rest of argv) in a session of its own with stdin closed, passes its exit
// status on (128+N for signal N, as a shell does), and kills the whole
// session when its own stdin reaches EOF, which is how the host stops a
// command: docker has no call that signals an exec, but it closes an
// exec's stdin when the attached client half-closes. When the command
// ends, what it left running in its session is killed too, so a command's
// processes never outlive its answer and the output stream always ends.
// Written without single quotes, like image.KernelLauncher.
const commandSupervisor = `import os, signal, subprocess, sys, threading
cwd, args = sys.argv[1], sys.argv[2:]
try:
    os.chdir(cwd)
except OSError as e:
    sys.stderr.write("triad: cannot enter %s: %s\n" % (cwd, e.strerror))
    sys.stderr.flush()
    os._exit(1)
try:
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
except OSError as e:
    sys.stderr.write("%s: %s\n" % (args[0], e.strerror))
    sys.stderr.flush()
    os._exit(126 if isinstance(e, PermissionError) else 127)
def kill():
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
def watch():
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except OSError:
        pass
    kill()
threading.Thread(target=watch, daemon=True).start()
rc = p.wait()
kill()
os._exit(rc if rc >= 0 else 128 - rc)
`

// Command implements sandbox.Commander: the command runs as a docker exec
// in the kernel's container, as the kernel's uid, so it has the same jail
// as a cell (no network, no capabilities, the seccomp profile, the
// container's memory, CPU and pids limits) and the same /work. Its stdout
// and stderr stream to cmd.Output as docker delivers them, counted against
// the cell output limit. See docs/DECISIONS.md, "Contexts and commands at
// the seam".
func (k *Kernel) Command(ctx context.Context, cmd sandbox.Command) (*sandbox.CommandResult, error) {
	if len(cmd.Args) == 0 || cmd.Args[0] == "" {
		return nil, fault.New(fault.BadInput, "the command is empty", "send the program and its arguments")
	}
	dir := ctrWork
	if cmd.Dir != "" {
		d, err := safepath.Clean(cmd.Dir)
		if err != nil {
			return nil, err
		}
		dir = ctrWork + "/" + d
	}
	env := make([]string, 0, len(cmd.Env))
	for _, key := range slices.Sorted(maps.Keys(cmd.Env)) {
		if key == "" || strings.ContainsAny(key, "=\x00") || strings.ContainsRune(cmd.Env[key], 0) {
			return nil, fault.Badf("environment variable names are non-empty and hold no '=' or NUL; values hold no NUL", "environment variable %q is not valid", key)
		}
		env = append(env, key+"="+cmd.Env[key])
	}
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("command on kernel %s: %w", k.ID(), err)
	}
	start := time.Now()
	argv := append([]string{"python3", "-I", "-S", "-c", commandSupervisor, dir}, cmd.Args...)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	ex, err := k.b.cli.ContainerExecCreate(cctx, k.containerID, container.ExecOptions{
		User:         fmt.Sprintf("%d:%d", k.b.cfg.UID, k.b.cfg.GID),
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Env:          env,
		WorkingDir:   ctrWork,
		Cmd:          argv,
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
		mu  sync.Mutex
		why string // why the host stopped the command, set by the stopper
	)
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
		why = w
		mu.Unlock()
		_ = att.CloseWrite()
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
	stdout := &eventWriter{kind: sandbox.EventStdout, m: m, over: over}
	stderr := &eventWriter{kind: sandbox.EventStderr, m: m, over: over}
	_, cerr := stdcopy.StdCopy(stdout, stderr, att.Reader)
	stdout.flush()
	stderr.flush()
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
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
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

// eventWriter turns one demultiplexed stream of an exec into Events. A
// chunk that ends inside a UTF-8 sequence keeps the incomplete tail for the
// next one, so every event's text is whole characters.
type eventWriter struct {
	kind  sandbox.EventKind
	m     *emit.Meter
	over  func()
	carry []byte
}

func (w *eventWriter) Write(p []byte) (int, error) {
	b := append(w.carry, p...)
	cut := len(b)
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				cut = i
			}
			break
		}
	}
	w.carry = append(w.carry[:0:0], b[cut:]...)
	w.emit(b[:cut])
	return len(p), nil
}

// flush delivers an incomplete tail the stream ended with.
func (w *eventWriter) flush() {
	w.emit(w.carry)
	w.carry = nil
}

func (w *eventWriter) emit(b []byte) {
	if len(b) == 0 || w.m.Over() {
		return
	}
	if !w.m.Emit(sandbox.Event{Kind: w.kind, Text: string(b)}) {
		w.over()
	}
}
