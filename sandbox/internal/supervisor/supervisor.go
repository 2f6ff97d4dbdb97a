// Package supervisor is the program that runs a sandbox.Command inside a kernel's sandbox and the host's side of its stream, shared by sandbox/docker and sandbox/kube.
//
// A backend starts Argv in the kernel's sandbox (a docker exec, a pods/exec
// session), with the supervisor's stdin, stdout and stderr attached. The
// supervisor's stdin carries the host's control ops (EncodeOp) and its EOF
// kills the command's whole session; its stdout and stderr are the
// command's, except that stderr starts with a line giving the command's pid
// (PidMarker), which the stderr Writer cuts off and reports. See
// docs/DECISIONS.md, "Contexts and commands at the seam" and "Commands on
// Kubernetes".
package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// Script runs a command inside the kernel's sandbox: it enters the
// directory (argv[1]), starts the command (argv[3:]) in a session of its
// own, its stdin empty, a pipe, or a pseudo-terminal (argv[2]: "-", "i", or
// "p<rows>x<cols>"), tells the host the command's pid before the command
// runs (a PidMarker line on stderr, the first thing the supervisor
// writes), passes its exit status on (128+N for signal N, as a shell
// does), and kills the whole session when its own stdin reaches EOF, which
// is how the host stops a command: neither docker nor the Kubernetes API
// has a call that signals an exec, but both close an exec's stdin when the
// client half-closes it. Until then its stdin carries the host's control
// ops, one JSON object a line: {"d": base64} input, {"c": 1} close the
// command's stdin, {"s": N} signal its process group, {"r": [rows, cols]}
// resize its terminal. When the command ends, what it left running in its
// session is killed too, so a command's processes never outlive its answer
// and the output stream always ends. Written without single quotes, like
// image.KernelLauncher.
const Script = `import base64, fcntl, json, os, signal, struct, subprocess, sys, termios, threading
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

// PidMarker starts the line the supervisor writes on stderr, before
// anything else, to say the command's pid.
const PidMarker = "\x00triad-pid "

// Prepared is a command checked and resolved for a sandbox whose working
// directory is work.
type Prepared struct {
	// Dir is the absolute directory the command starts in.
	Dir string
	// Env is the command's extra environment as KEY=VALUE, sorted by key.
	Env []string
	// Mode is the supervisor's stdin mode (argv[2] of Script).
	Mode string
}

// Prepare checks cmd (a program, a Dir inside the working directory,
// environment names without '=' or NUL and values without NUL) and
// resolves it against work, the working directory's absolute path in the
// sandbox. Its errors are fault.BadInput.
func Prepare(work string, cmd sandbox.Command) (Prepared, error) {
	if len(cmd.Args) == 0 || cmd.Args[0] == "" {
		return Prepared{}, fault.New(fault.BadInput, "the command is empty", "send the program and its arguments")
	}
	p := Prepared{Dir: work, Mode: "-"}
	if cmd.Dir != "" {
		d, err := safepath.Clean(cmd.Dir)
		if err != nil {
			return Prepared{}, err
		}
		p.Dir = work + "/" + d
	}
	p.Env = make([]string, 0, len(cmd.Env))
	for _, key := range slices.Sorted(maps.Keys(cmd.Env)) {
		if key == "" || strings.ContainsAny(key, "=\x00") || strings.ContainsRune(cmd.Env[key], 0) {
			return Prepared{}, fault.Badf("environment variable names are non-empty and hold no '=' or NUL; values hold no NUL", "environment variable %q is not valid", key)
		}
		p.Env = append(p.Env, key+"="+cmd.Env[key])
	}
	switch {
	case cmd.Pty != nil:
		p.Mode = fmt.Sprintf("p%dx%d", max(cmd.Pty.Rows, 1), max(cmd.Pty.Cols, 1))
	case cmd.Stdin:
		p.Mode = "i"
	}
	return p, nil
}

// Argv is the command line that runs args under the supervisor, as p
// says: python3 in isolated mode, so nothing in the working directory or
// the environment changes the supervisor itself.
func (p Prepared) Argv(args []string) []string {
	return append([]string{"python3", "-I", "-S", "-c", Script, p.Dir, p.Mode}, args...)
}

// EncodeOp is op as the line the supervisor reads from its stdin.
func EncodeOp(op sandbox.ControlOp) ([]byte, error) {
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
		return nil, err
	}
	return append(b, '\n'), nil
}

// Writer turns one stream of the supervisor (its stdout or its stderr)
// into Events metered by an emit.Meter. A chunk that ends inside a UTF-8
// sequence keeps the incomplete tail for the next one, so every event's
// text is whole characters. It is not safe for concurrent use: a backend
// writes both streams from the goroutine that delivers the command's
// output.
type Writer struct {
	kind  sandbox.EventKind
	m     *emit.Meter
	over  func()
	carry []byte
	// marker, on the stderr writer, takes the supervisor's pid line,
	// which the stream starts with, and is then cleared.
	marker func(pid int)
	head   []byte
}

// NewStdout returns the Writer of the supervisor's stdout: EventStdout
// into m, and over called whenever m refuses an event (the output limit).
func NewStdout(m *emit.Meter, over func()) *Writer {
	return &Writer{kind: sandbox.EventStdout, m: m, over: over}
}

// NewStderr returns the Writer of the supervisor's stderr, which first
// cuts the pid line off and calls started with the pid (0 when the line
// is missing or the command could not start), exactly once: from a Write,
// or from Flush when the stream ended before the line did.
func NewStderr(m *emit.Meter, over func(), started func(pid int)) *Writer {
	return &Writer{kind: sandbox.EventStderr, m: m, over: over, marker: started}
}

// Write implements io.Writer. It always takes the whole of p.
func (w *Writer) Write(p []byte) (int, error) {
	// The whole chunk is always taken: returning less than len(p) (as
	// sandbox/docker did once it cut the pid line off the front) is a
	// short write to stdcopy.StdCopy, which then stops demultiplexing
	// and drops the rest of the stream (a quick command lost its stdout).
	n := len(p)
	if w.marker != nil {
		w.head = append(w.head, p...)
		nl := bytes.IndexByte(w.head, '\n')
		if nl < 0 && len(w.head) < 64 {
			return n, nil
		}
		rest := w.head
		pid := 0
		if line, ok := bytes.CutPrefix(w.head, []byte(PidMarker)); ok && nl >= 0 {
			pid, _ = strconv.Atoi(string(line[:nl-len(PidMarker)]))
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

// Flush delivers an incomplete tail the stream ended with; on the stderr
// writer, a pid line that never came is reported as pid 0.
func (w *Writer) Flush() {
	if w.marker != nil {
		w.marker(0)
		w.marker = nil
		head := w.head
		w.head = nil
		if _, ok := bytes.CutPrefix(head, []byte(PidMarker)); !ok {
			w.carry = append(w.carry, head...)
		}
	}
	w.emit(w.carry)
	w.carry = nil
}

func (w *Writer) emit(b []byte) {
	if len(b) == 0 || w.m.Over() {
		return
	}
	if !w.m.Emit(sandbox.Event{Kind: w.kind, Text: string(b)}) {
		w.over()
	}
}
