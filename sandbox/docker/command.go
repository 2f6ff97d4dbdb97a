package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
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
// container: it enters the directory (argv[1]), starts the command (argv[3:])
// in a session of its own, its stdin empty, a pipe, or a pseudo-terminal
// (argv[2]: "-", "i", or "p<rows>x<cols>"), tells the host the command's pid
// before the command runs (a pidMarker line on stderr, the first thing the
// supervisor writes), passes its exit status on (128+N for signal N, as a
// shell does), and kills the whole session when its own stdin reaches EOF,
// which is how the host stops a command: docker has no call that signals
// an exec, but it closes an exec's stdin when the attached client
// half-closes. Until then its stdin carries the host's control ops, one
// JSON object a line: {"d": base64} input, {"c": 1} close the command's
// stdin, {"s": N} signal its process group, {"r": [rows, cols]} resize its
// terminal. When the command ends, what it left running in its session is
// killed too, so a command's processes never outlive its answer and the
// output stream always ends. Written without single quotes, like
// image.KernelLauncher.
const commandSupervisor = `import base64, fcntl, json, os, signal, struct, subprocess, sys, termios, threading
cwd, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]
def marker(pid):
    sys.stderr.write("\0triad-pid %d\n" % pid)
    sys.stderr.flush()
try:
    os.chdir(cwd)
except OSError as e:
    marker(0)
    sys.stderr.write("triad: cannot enter %s: %s\n" % (cwd, e.strerror))
    sys.stderr.flush()
    os._exit(1)
master = None
kw = {"stdin": subprocess.DEVNULL}
if mode == "i":
    kw["stdin"] = subprocess.PIPE
elif mode.startswith("p"):
    import pty
    rows, cols = (int(x) for x in mode[1:].split("x"))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    kw = {"stdin": slave, "stdout": slave, "stderr": slave, "preexec_fn": lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0)}
gate_r, gate_w = os.pipe()
wrap = ["/bin/sh", "-c", "read -r _ <&%d; exec %d<&-; exec \"$@\"" % (gate_r, gate_r), "sh"] + args
try:
    p = subprocess.Popen(wrap, start_new_session=True, pass_fds=(gate_r,), **kw)
except OSError as e:
    marker(0)
    sys.stderr.write("%s: %s\n" % (args[0], e.strerror))
    sys.stderr.flush()
    os._exit(126 if isinstance(e, PermissionError) else 127)
os.close(gate_r)
marker(p.pid)
os.write(gate_w, b"\n")
os.close(gate_w)
relay = None
if master is not None:
    os.close(slave)
    def copy():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            os.write(1, b)
    relay = threading.Thread(target=copy, daemon=True)
    relay.start()
def kill():
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
def control(m):
    if "d" in m:
        b = base64.b64decode(m["d"])
        if master is not None:
            os.write(master, b)
        elif p.stdin is not None:
            p.stdin.write(b)
            p.stdin.flush()
    elif "c" in m:
        if master is not None:
            os.write(master, b"\x04")
        elif p.stdin is not None:
            p.stdin.close()
    elif "s" in m:
        os.killpg(p.pid, int(m["s"]))
    elif "r" in m and master is not None:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", m["r"][0], m["r"][1], 0, 0))
def watch():
    try:
        for line in sys.stdin.buffer:
            try:
                control(json.loads(line))
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    kill()
threading.Thread(target=watch, daemon=True).start()
rc = p.wait()
kill()
if relay is not None:
    relay.join(2)
os._exit(rc if rc >= 0 else 128 - rc)
`

// pidMarker starts the line the supervisor writes on stderr, before
// anything else, to say the command's pid.
const pidMarker = "\x00triad-pid "

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
	mode := "-"
	switch {
	case cmd.Pty != nil:
		mode = fmt.Sprintf("p%dx%d", max(cmd.Pty.Rows, 1), max(cmd.Pty.Cols, 1))
	case cmd.Stdin:
		mode = "i"
	}
	ctl := cmd.Control
	if ctl != nil {
		defer ctl.Ended()
	}
	argv := append([]string{"python3", "-I", "-S", "-c", commandSupervisor, dir, mode}, cmd.Args...)
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
		mu     sync.Mutex
		why    string // why the host stopped the command, set by the stopper
		closed bool   // the exec's stdin is half-closed: no more ops
	)
	send := func(op sandbox.ControlOp) error {
		m := map[string]any{}
		switch {
		case op.Close:
			m["c"] = 1
		case op.Signal != 0:
			m["s"] = op.Signal
		case op.Size != nil:
			m["r"] = []uint16{max(op.Size.Rows, 1), max(op.Size.Cols, 1)}
		default:
			m["d"] = op.Data // base64, as encoding/json writes []byte
		}
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return sandbox.ErrCommandEnded
		}
		_, err = att.Conn.Write(append(b, '\n'))
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
	stdout := &eventWriter{kind: sandbox.EventStdout, m: m, over: over}
	stderr := &eventWriter{kind: sandbox.EventStderr, m: m, over: over, marker: func(pid int) {
		if ctl != nil {
			ctl.Started(pid, send)
		}
	}}
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
	// marker, on the stderr writer, takes the supervisor's pid line,
	// which the stream starts with, and is then cleared.
	marker func(pid int)
	head   []byte
}

func (w *eventWriter) Write(p []byte) (int, error) {
	// The whole chunk is always taken: returning less than len(p) (as
	// this did once it cut the pid line off the front) is a short write
	// to stdcopy.StdCopy, which then stops demultiplexing and drops the
	// rest of the stream (a quick command lost its stdout).
	n := len(p)
	if w.marker != nil {
		w.head = append(w.head, p...)
		nl := bytes.IndexByte(w.head, '\n')
		if nl < 0 && len(w.head) < 64 {
			return n, nil
		}
		rest := w.head
		pid := 0
		if line, ok := bytes.CutPrefix(w.head, []byte(pidMarker)); ok && nl >= 0 {
			pid, _ = strconv.Atoi(string(line[:nl-len(pidMarker)]))
			rest = w.head[nl+1:]
		}
		w.marker(pid)
		w.marker, w.head = nil, nil
		if len(rest) == 0 {
			return n, nil
		}
		p = rest
	}
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
	return n, nil
}

// flush delivers an incomplete tail the stream ended with.
func (w *eventWriter) flush() {
	if w.marker != nil {
		w.marker(0)
		w.marker = nil
		head := w.head
		w.head = nil
		if _, ok := bytes.CutPrefix(head, []byte(pidMarker)); !ok {
			w.carry = append(w.carry, head...)
		}
	}
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
