// Package sandbox defines the seam between Triad and the kernels that run untrusted Python cells.
//
// A Backend starts Kernels; a Kernel is one persistent interpreter with a
// working directory. Implementations live in sub-packages named for what
// they wrap: sandbox/docker (ipykernel in a jailed container) and
// sandbox/wasm (CPython compiled to WASI, run by wazero inside the binary).
// sandbox/hostdir is the WorkDir both implement over a host directory, and
// sandbox/sandboxtest is the conformance suite every backend runs.
//
// Backends know nothing about runs' content-addressed files: the caller
// materialises a run's files through Kernel.Files before a cell and
// harvests what the cell wrote afterwards, so files_in and files_out behave
// the same on every backend. WorkDir is an interface over a stream-able API
// (put, remove, scan, open), not a host path, so that a kernel whose files
// live elsewhere (a Kubernetes pod) can implement it too; see "The
// sandbox seam" in docs/DECISIONS.md.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Backend starts kernels of one kind.
type Backend interface {
	// Name is the backend's name as reported in exec responses
	// (kernel.backend): "docker", "wasm" or "kube".
	Name() string
	// Start returns a ready kernel: its interpreter answers and its working
	// directory exists and is empty. Backends with a warm pool hand out a
	// pooled kernel here. ctx bounds the wait only; the kernel outlives it.
	Start(ctx context.Context, spec Spec) (Kernel, error)
	// Close stops every kernel the backend started. It is safe to call twice.
	Close() error
}

// Pool is a Backend that keeps its own warm pool of ready kernels: an
// optional ability, found with Ability. The kernel manager asks for it and,
// when the backend has one, keeps no pool of its own: Start already hands
// out a pooled kernel, and a pool above the backend would hand out kernels
// without asking the backend whether the run already has one elsewhere (a
// Kubernetes pod another replica serves). See "The warm pool is the
// backend's when it has one" in docs/DECISIONS.md.
type Pool interface {
	Backend
	// Pooled returns how many ready kernels this process holds in the
	// backend's pool.
	Pooled() int
}

// Imager is a Backend whose kernels all run one named image: an optional
// ability, found with Ability. Image is what runs record of their sandbox
// (a Docker image tag, the python.wasm build).
type Imager interface {
	Backend
	Image() string
}

// Runtimer is a Backend whose kernels run under a named container runtime:
// an optional ability, found with Ability. Runtime names it as the run's
// records show it, "runc" or "runsc" (gVisor): what separates a cell from
// the host's kernel.
type Runtimer interface {
	Backend
	Runtime() string
}

// Polyglot is a Backend whose kernels implement Languages: an optional
// ability, found with Ability. Languages lists what every kernel's
// Languages does, so a caller can tell before any kernel starts.
type Polyglot interface {
	Backend
	Languages() []string
}

// Wrapper is a Backend that wraps another (to count or time its calls)
// and passes the inner one's optional abilities on through Unwrap.
type Wrapper interface {
	Backend
	Unwrap() Backend
}

// Ability returns b, or the first backend b wraps (Wrapper), that has the
// optional ability T, as errors.As finds an error of a type: a wrapper need
// not re-implement every ability of what it wraps, and cannot claim one
// its inner backend lacks.
func Ability[T Backend](b Backend) (T, bool) {
	for b != nil {
		if t, ok := b.(T); ok {
			return t, true
		}
		w, ok := b.(Wrapper)
		if !ok {
			break
		}
		b = w.Unwrap()
	}
	var zero T
	return zero, false
}

// Spec describes the kernel a caller wants.
type Spec struct {
	// Owner labels the kernel (a run id) so that a restarted server can
	// find and remove what an earlier process started.
	Owner string
	// Limits bound the kernel; zero fields take the backend's defaults.
	Limits Limits
	// Image is the image the kernel runs (a sandbox template's), for a
	// backend of images (Imager); empty means the backend's own. A
	// backend's warm pool holds kernels of its own image only.
	Image string
}

// Limits are the resource bounds of one kernel. Zero means "backend default".
type Limits struct {
	MemoryBytes int64   // memory, swap included
	CPUs        float64 // CPU share, e.g. 1.0
	Pids        int64   // process/thread count
	DiskBytes   int64   // quota on the working directory
	// OutputBytes bounds what one cell may send back: its stdout, stderr,
	// display data and result together, counted by the host as they
	// arrive. Zero means DefaultOutputBytes.
	OutputBytes int64
}

// Or returns l with each zero field taken from d: a spec's limits over a
// backend's defaults.
func (l Limits) Or(d Limits) Limits {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.CPUs == 0 {
		l.CPUs = d.CPUs
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = d.DiskBytes
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = d.OutputBytes
	}
	return l
}

// DefaultOutputBytes is the output limit of a cell when Limits.OutputBytes
// is zero.
const DefaultOutputBytes = 64 << 20

// Kernel is one persistent interpreter. Variables survive from one Execute to
// the next until the kernel restarts or dies. Methods are not safe for
// concurrent use, except Close, which may be called while Execute runs;
// callers serialize cells per run.
type Kernel interface {
	// ID identifies the kernel for logs (a container id, an instance id).
	ID() string
	// Files is the kernel's working directory: the cell's current
	// directory and the only place a cell can write that outlives the
	// cell. It may carry a disk quota. It stays valid across Restart and
	// fails with ErrClosed after Close.
	Files() WorkDir
	// Execute runs cell.Code and returns when it has finished, failed or
	// been stopped.
	//
	// Output: everything the cell produces is passed to cell.Output as it
	// arrives, in order, from the goroutine that called Execute, never
	// concurrently and never after Execute returns. The Result carries no
	// output. The host counts the bytes it receives (stdout, stderr,
	// display and result data) against Limits.OutputBytes; past it,
	// nothing more is delivered, the cell is stopped as on a timeout, and
	// the Result's Error has kind KindOutputLimit.
	//
	// Stopping a cell (its Timeout passed, the output limit, or the
	// caller's hang-up below): the backend interrupts it; if the cell ends
	// within the backend's grace period the kernel keeps its state,
	// otherwise the kernel is restarted and Result.Restarted is set. A
	// backend that cannot interrupt running code (wasm, for a cell in a
	// loop) restarts at once.
	//
	// Caller hang-up: if ctx is cancelled while the cell runs, the cell is
	// stopped as above and Execute returns a Result whose Error has kind
	// KindInterrupted, with a nil error, so that the caller learns whether
	// the kernel kept its state. If ctx is done before the cell is handed
	// to the kernel, nothing runs and Execute returns ctx's error.
	//
	// A cell that fails (an exception, a timeout, a dead kernel) is not an
	// error: it comes back as a Result whose Error says what happened. The
	// returned error is reserved for the kernel being unusable before the
	// cell could run, and for ErrClosed when Close ends the cell.
	Execute(ctx context.Context, cell Cell) (*Result, error)
	// Restart replaces the interpreter with a fresh one; state is lost, the
	// working directory is kept.
	Restart(ctx context.Context) error
	// Close stops the kernel and releases its resources, including its
	// working directory. The caller copies out files it wants to keep
	// first. A cell running at the time ends with ErrClosed. Close is safe
	// to call twice.
	Close() error
}

// Contexts is a Kernel that can start more interpreters beside itself: an
// optional ability, found by type assertion. Each context is its own
// interpreter with its own variables and current directory, in the same
// sandbox as the kernel: the same jail, the same limits (shared, not added)
// and the same working directory. See "Contexts and commands at the seam"
// in docs/DECISIONS.md.
type Contexts interface {
	// NewContext starts an interpreter that begins each cell in cwd, a
	// slash-separated path relative to the working directory ("" is its
	// root), made if missing. The returned Kernel's Files is the
	// kernel's own WorkDir. Restarting or closing the context leaves the
	// kernel and its other contexts alone; closing the kernel closes its
	// contexts, and restarting it may end them (a context whose sandbox
	// was restarted reports it as a death and comes back fresh). A
	// context's methods follow Kernel's rules, and contexts may run cells
	// at the same time as the kernel and each other.
	NewContext(ctx context.Context, cwd string) (Kernel, error)
}

// Languages is a Kernel that can start contexts whose interpreter is
// another language's Jupyter kernel (R's IRkernel, Deno's for JavaScript
// and TypeScript, a bash kernel): an optional ability, found by type
// assertion. Such a context is like one from Contexts.NewContext (the
// same sandbox, jail, limits and working directory), with the same Kernel
// contract, except that a Cell's Code is in its language and Result.Threads
// is always nil. See "Kernels in more languages" in docs/DECISIONS.md.
type Languages interface {
	// Languages lists the languages NewLanguageContext starts, from
	// LanguageR, LanguageBash, LanguageJavaScript and LanguageTypeScript.
	Languages() []string
	// NewLanguageContext starts an interpreter of language that begins in
	// cwd, as Contexts.NewContext does. A language the kernel does not
	// list fails with ErrLanguage.
	NewLanguageContext(ctx context.Context, cwd, language string) (Kernel, error)
}

// The languages of kernels. LanguagePython is every Kernel's own.
const (
	LanguagePython     = "python"
	LanguageR          = "r"
	LanguageBash       = "bash"
	LanguageJavaScript = "javascript"
	LanguageTypeScript = "typescript"
)

// Commander is a Kernel that can run commands in its sandbox, under the same
// jail as its cells: an optional ability, found by type assertion. A
// backend whose sandbox has no processes (wasm) does not implement it.
type Commander interface {
	// Command runs cmd and returns when it has ended. It is safe to call
	// while a cell runs and while other commands run. When ctx is done
	// the command (with every process it started) is killed, and the
	// result says why it stopped: KindTimeout for ctx's deadline,
	// KindInterrupted for a cancellation. The returned error is reserved
	// for a command that could not be started (a closed or broken
	// kernel); a command that fails is a result with its exit code.
	Command(ctx context.Context, cmd Command) (*CommandResult, error)
}

// Command is one command to run in a kernel's sandbox.
type Command struct {
	// Args is the argv; Args[0] is looked up in the sandbox's PATH.
	Args []string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Dir is where the command starts: a slash-separated path relative
	// to the working directory, "" for its root.
	Dir string
	// Output receives the command's stdout and stderr (EventStdout,
	// EventStderr) as they arrive, from the goroutine that called
	// Command, never concurrently and never after it returns. Both count
	// against the kernel's Limits.OutputBytes; past it the command is
	// killed and the result says KindOutputLimit. Nil discards them.
	Output func(Event)
	// Stdin keeps the command's standard input open for Control's Data
	// (closed by a Close op); without it stdin is empty.
	Stdin bool
	// Pty runs the command in a pseudo-terminal of that size, the
	// leader of its session: the terminal is its stdin, stdout and
	// stderr, its output arrives as EventStdout, and Control's Data is
	// typed into it.
	Pty *TermSize
	// Control, when set, is started (CommandControl.Started) with the
	// command's pid once it runs, and ended when it has ended. A backend
	// that cannot control commands answers Stdin, Pty or Control with an
	// unsupported error.
	Control *CommandControl
}

// CommandResult is how a command ended.
type CommandResult struct {
	// ExitCode is the command's exit status: 128+N when signal N ended
	// it, as a shell reports it.
	ExitCode int
	// Stopped says why the host killed the command: "" when it ended by
	// itself, else KindTimeout, KindInterrupted or KindOutputLimit.
	Stopped string
	// Duration is how long the command ran.
	Duration time.Duration
}

// Cell is one unit of code to run.
type Cell struct {
	// Code is the Python source.
	Code string
	// Timeout bounds the cell's run time; zero means the backend's default.
	Timeout time.Duration
	// Output receives the cell's output as it arrives (see
	// Kernel.Execute); nil discards it. It should return promptly: the
	// backend does not watch the cell's deadline while it runs, and it
	// must not call the kernel's methods.
	Output func(Event)
	// Setup marks a cell Triad runs for itself (seeding a run's kernel):
	// it does not advance the kernel's execution counter, so the caller's
	// first cell is still number 1.
	Setup bool
}

// EventKind says what an Event carries.
type EventKind uint8

// Kinds of Event.
const (
	// EventStdout is text the cell wrote to standard output.
	EventStdout EventKind = iota + 1
	// EventStderr is text the cell wrote to standard error.
	EventStderr
	// EventDisplay is a display_data bundle (a figure, a table). An
	// update of a display an earlier cell showed arrives as a new
	// EventDisplay; an update of one this cell showed arrives as
	// EventClear followed by the cell's displays again, the updated one
	// in place.
	EventDisplay
	// EventResult is the execute_result bundle: the value of the cell's
	// last expression. It comes at most once, last.
	EventResult
	// EventClear says the displays delivered before are void: the cell
	// cleared its output (IPython's clear_output), or updated one of its
	// displays in place and its displays follow again. A sink drops the
	// displays it received before. Streams are never taken back: text a
	// cell printed stays printed (Triad keeps a cell's whole stdout), and
	// a backend keeps none of it to send again. What was delivered still
	// counted against the output limit.
	EventClear
)

var eventKindNames = [...]string{"", "stdout", "stderr", "display", "result", "clear"}

// String returns the kind's name: "stdout", "stderr", "display", "result"
// or "clear".
func (k EventKind) String() string {
	if int(k) < len(eventKindNames) && k != 0 {
		return eventKindNames[k]
	}
	return "unknown"
}

// Event is one piece of a cell's output.
type Event struct {
	Kind EventKind
	// Text is set for EventStdout and EventStderr.
	Text string
	// Bundle is set for EventDisplay and EventResult.
	Bundle *Bundle
}

// Size is what the event counts against Limits.OutputBytes: the text's
// bytes, or the bundle's data values as JSON.
func (e Event) Size() int64 {
	n := int64(len(e.Text))
	if e.Bundle != nil {
		for _, v := range e.Bundle.Data {
			n += int64(len(v))
		}
	}
	return n
}

// Collector is a Cell.Output sink that keeps everything: pass its Add
// method as Cell.Output and read the fields after Execute returns. Use it
// by pointer; it must not be copied once used.
type Collector struct {
	Stdout  strings.Builder
	Stderr  strings.Builder
	Display []Bundle // in the order they arrived
	Value   *Bundle  // the execute_result, if any
}

// Add records one event. EventClear drops the displays collected so far;
// the streams are kept whole (see EventClear).
func (c *Collector) Add(e Event) {
	switch e.Kind {
	case EventStdout:
		c.Stdout.WriteString(e.Text)
	case EventStderr:
		c.Stderr.WriteString(e.Text)
	case EventDisplay:
		if e.Bundle != nil {
			c.Display = append(c.Display, *e.Bundle)
		}
	case EventResult:
		c.Value = e.Bundle
	case EventClear:
		c.Display = nil
	}
}

// Result is how a cell ended. Its output went to Cell.Output.
type Result struct {
	// OK is true when the cell ran to completion without an exception.
	OK bool `json:"ok"`
	// Error is set when OK is false.
	Error *ExecError `json:"error,omitempty"`
	// ExecutionCount is the kernel's execution counter after this cell.
	ExecutionCount int `json:"execution_count"`
	// Restarted is true when the kernel was replaced during this call (a
	// cell that could not be stopped otherwise, or a death); state is lost.
	Restarted bool `json:"restarted"`
	// Duration is how long the cell ran, as the backend measured it.
	Duration time.Duration `json:"-"`
	// Threads names the threads the cell's code started (in this cell or
	// an earlier one) that were still running when the cell returned, as
	// far as the backend can tell; nil when there are none or it cannot.
	// Execute does not wait for them and the cell's timeout does not stop
	// them: they run until they end or the kernel restarts. Files they
	// write later are harvested after the next cell. On Docker, what they
	// print (sys.stdout, sys.stderr) after their cell returned is dropped,
	// since ipykernel tags it with that cell; what they display, or write
	// to file descriptors 1 and 2, goes with the cell running at the time
	// and is dropped while none runs.
	Threads []string `json:"threads,omitempty"`
}

// Bundle is a Jupyter MIME bundle: data keyed by MIME type, plus metadata.
// Binary types (image/png, image/jpeg) are base64 strings, as on the wire.
type Bundle struct {
	Data     map[string]json.RawMessage `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// ExecError describes why a cell did not succeed.
type ExecError struct {
	// Kind is one of the Kind constants.
	Kind      string   `json:"kind"`
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
	// Reason says why a kernel died, when the backend knows (e.g. "OOMKilled").
	Reason string `json:"reason,omitempty"`
}

// Kinds of ExecError.
const (
	// KindExecution is an exception raised by the cell.
	KindExecution = "execution_error"
	// KindTimeout means the cell's deadline passed and it was stopped.
	KindTimeout = "timeout"
	// KindKernelDied means the interpreter went away (OOM, os._exit, a
	// crash); Reason says why when the backend knows.
	KindKernelDied = "kernel_died"
	// KindInterrupted means the caller hung up (Execute's ctx ended) and
	// the cell was stopped.
	KindInterrupted = "interrupted"
	// KindOutputLimit means the cell's output passed Limits.OutputBytes
	// and the cell was stopped.
	KindOutputLimit = "output_limit"
)

// WorkDir is a kernel's working directory as the core sees it: a flat
// namespace of slash-separated relative paths, readable and writable in
// whole files. Docker and wasm implement it over a host directory
// (sandbox/hostdir); a remote kernel can implement it over a stream. Paths
// are validated by the implementation; none may leave the directory, and
// no implementation follows a symlink a cell planted, for any method.
type WorkDir interface {
	// Put atomically replaces whatever is at path with the bytes of r: a
	// file, or a symlink (which is replaced, never followed). Missing
	// parent directories are created, and a non-directory in the way of
	// one is removed. A directory at path itself is left alone and Put
	// fails with ErrNotRegular. It returns the entry written.
	Put(ctx context.Context, path string, r io.Reader) (Entry, error)
	// Remove deletes the file (or empty directory) at path. A missing path
	// is not an error.
	Remove(ctx context.Context, path string) error
	// Scan lists every regular file below the directory. Symlinks, special
	// files (FIFOs, sockets, devices), unreadable directories and names the
	// path validator refuses are listed in Skipped instead, and never
	// followed.
	Scan(ctx context.Context) (Listing, error)
	// Open opens the regular file at path for reading, without following
	// a symlink and without blocking on a FIFO; anything but a regular
	// file fails with ErrNotRegular, a missing one with an error matching
	// fs.ErrNotExist. The Entry describes the file as opened.
	Open(ctx context.Context, path string) (io.ReadCloser, Entry, error)
}

// Appender is a WorkDir that can add bytes to the end of a file in place.
// The core keeps the journal's files (CEL.md, trace.jsonl,
// evaluations.jsonl) in a kernel's working directory with it, at a cost
// per step that does not grow with the journal; a WorkDir without it gets
// each new version whole (Put).
type Appender interface {
	// Append writes r's bytes at the end of the regular file at path if
	// that file is still the one stamped want (as Put, Append or Scan last
	// reported it), and returns its new entry. A file that changed, or was
	// replaced by anything else, is left alone and Append fails with
	// ErrStale; a missing one fails with an error matching fs.ErrNotExist.
	Append(ctx context.Context, path string, want Stamp, r io.Reader) (Entry, error)
}

// Entry is one regular file of a WorkDir.
type Entry struct {
	// Path is the file's slash-separated path relative to the directory.
	Path string
	// Size is the file's apparent size in bytes. A sparse file's may be
	// far larger than the disk it occupies; compare it with Listing.Quota.
	Size int64
	// Stamp changes whenever the file may have changed.
	Stamp Stamp
}

// Stamp is an opaque change token for a file, built from its device,
// inode, size, modification and change times: equal stamps mean the file
// is unchanged, so it need not be read again.
type Stamp string

// Listing is what Scan found.
type Listing struct {
	// Files are the regular files, sorted by path.
	Files []Entry
	// Skipped are entries that are not regular files (or not valid
	// paths), sorted.
	Skipped []string
	// Quota is the directory's disk quota in bytes, 0 when it has none.
	// No file can really hold more, so one whose Size is larger is sparse.
	Quota int64
}

// Detacher is a Kernel that outlives the process using it: a Kubernetes
// pod (sandbox/kube) that another Triad replica, or this one restarted,
// adopts with its interpreter state by starting a kernel with the same
// Spec.Owner. Detach lets go of it here (connections, watches) and leaves
// it running; the Kernel then behaves as closed. A caller that merely
// stops using a kernel it may want again (an idle run, a server shutting
// down) detaches it when it can, and closes it otherwise.
type Detacher interface {
	Detach() error
}

// Losable is a WorkDir that can lose its contents with its kernel: a pod
// evicted for its disk use takes its working directory with it, and the
// kernel that replaces it starts empty. Losses counts how often that has
// happened; a caller that keeps the directory in step with a store
// (orchestrator/workspace) puts the store's files back when it moves,
// rather than reading their absence as deletions.
type Losable interface {
	Losses() uint64
}

// EgressAddr is where a process in a sandbox reaches Triad's egress proxy,
// on a backend whose kernels implement Egress: a run with an egress policy
// has HTTP_PROXY and HTTPS_PROXY name it. For a run without one, what
// answers there refuses at once.
const EgressAddr = "127.0.0.1:3128"

// Egress is a Kernel whose sandbox can send connections out through
// Triad's host while its own network stays closed: an optional ability,
// found by type assertion. Connections the sandbox's processes open to
// EgressAddr are relayed to the host, where the caller serves them (the
// egress package decides what they may reach). See "Egress" in
// docs/DECISIONS.md.
type Egress interface {
	// EgressReady starts relaying, if it has not, and returns once a
	// connection opened to EgressAddr from now on will reach AcceptEgress
	// rather than be refused. Call it after the kernel starts or
	// restarts, before a cell that may connect; it waits until ctx ends
	// if the sandbox's relay never answers.
	EgressReady(ctx context.Context) error
	// AcceptEgress returns the next connection a process in the sandbox
	// opened to EgressAddr. It fails with ErrClosed once the kernel is
	// closed.
	AcceptEgress(ctx context.Context) (net.Conn, error)
}

// Ports is a Kernel whose sandbox's TCP ports the host can reach while the
// sandbox's network stays closed: an optional ability, found by type
// assertion. A connection reaches the port on the sandbox's loopback, as a
// process in the sandbox would (Docker: through the egress forwarder's
// ports socket; Kubernetes: a port-forward), so a server a command starts
// there can be reached from Triad's listener (E2B's getHost).
type Ports interface {
	// DialPort connects to port on the sandbox's loopback. A port
	// nothing listens on fails with ErrNoListener.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// Meter is a Kernel that can say what its sandbox uses now: an optional
// ability, found by type assertion, for E2B's metrics, the tenant's list
// of live kernels and each run's accounting (Docker: the container's
// cgroup through the engine's stats; wasm: the interpreter's linear
// memory).
type Meter interface {
	// Usage reads the sandbox's CPU and memory, with its CPU share over
	// the backend's sampling window (Docker: two samples about a second
	// apart).
	Usage(ctx context.Context) (Usage, error)
	// Sample reads the sandbox's CPU time and memory once, at once,
	// without the CPU share (CPUPercent is -1): what a run's accounting
	// folds in after each step, which must not wait a second.
	Sample(ctx context.Context) (Usage, error)
}

// Usage is what a sandbox uses at one moment. A measure the backend cannot
// take is negative (unknown), never a guessed zero.
type Usage struct {
	// At is when it was read.
	At time.Time
	// CPUTime is the CPU time the sandbox's processes have used since it
	// started, and CPUs how many CPUs it may use (its limit, or the
	// host's).
	CPUTime time.Duration
	CPUs    float64
	// Since is when CPUTime began counting: the sandbox's last start. A
	// restart that starts the count again (Docker's kernel restart starts
	// its container anew) moves it, so a reading is compared only with
	// one of the same Since. Zero when the backend does not say.
	Since time.Time
	// CPUPercent is the share of CPUs the sandbox used over the backend's
	// last sampling window (about a second), 0 to 100; -1 from Sample.
	CPUPercent float64
	// MemoryBytes is the memory in use, without the page cache the
	// kernel can reclaim at once (MemoryCacheBytes); MemoryLimitBytes is
	// the limit.
	MemoryBytes      int64
	MemoryCacheBytes int64
	MemoryLimitBytes int64
}

// Errors returned by Backends, Kernels and WorkDirs.
var (
	// ErrClosed means the kernel or backend was closed; start a new kernel.
	ErrClosed = errors.New("sandbox: closed")
	// ErrUnavailable means the backend's engine does not answer (no Docker
	// daemon, an image that cannot be built); pick another backend or fix
	// the engine.
	ErrUnavailable = errors.New("sandbox: backend unavailable")
	// ErrNotRegular means a WorkDir path holds something other than a
	// regular file (a symlink, a FIFO, a device, a directory), which is
	// never read or replaced; skip it.
	ErrNotRegular = errors.New("sandbox: not a regular file")
	// ErrLanguage means the kernel cannot start an interpreter of the
	// language asked for; use one it lists, or another backend.
	ErrLanguage = errors.New("sandbox: language not supported by this kernel")
	// ErrNoListener means nothing in the sandbox listens on the port
	// asked for; start the server first.
	ErrNoListener = errors.New("sandbox: nothing listens on that port")
	// ErrStale means a WorkDir file is no longer the one the caller last
	// saw (a cell changed it); write it whole instead.
	ErrStale = errors.New("sandbox: file changed since it was last seen")
)

// TermSize is a pseudo-terminal's size.
type TermSize struct {
	Rows, Cols uint16
}

// ErrCommandEnded is what a CommandControl answers once its command has
// ended (or before it started, for a command that never did).
var ErrCommandEnded = errors.New("the command is not running")

// CommandControl is how a caller talks to a command while it runs
// (Command.Control): its real pid in the sandbox, its standard input, its
// terminal's size, signals. The caller makes it with NewCommandControl;
// the backend calls Started once the command runs and Ended when it has
// ended. Its methods are safe for concurrent use.
type CommandControl struct {
	mu      sync.Mutex
	pid     int
	send    func(ControlOp) error
	ended   bool
	started chan struct{}
	done    chan struct{}
	in      InputStats
}

// InputStats counts what a caller sent a command, for its journal.
type InputStats struct {
	Writes, Bytes, Resizes, Signals int
	Closed                          bool
}

// ControlOp is one thing a CommandControl sends a running command: Data
// for its stdin (or terminal), Close to close its stdin, Signal to signal
// its process group, Size to resize its terminal.
type ControlOp struct {
	Data   []byte
	Close  bool
	Signal int
	Size   *TermSize
}

// NewCommandControl makes a CommandControl for one command.
func NewCommandControl() *CommandControl {
	return &CommandControl{started: make(chan struct{}), done: make(chan struct{})}
}

// Started is the backend's: the command runs as pid (in the sandbox's pid
// namespace, 0 when it failed before it could start), and send delivers
// ops to it.
func (c *CommandControl) Started(pid int, send func(ControlOp) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.started:
		return
	default:
	}
	c.pid, c.send = pid, send
	close(c.started)
}

// Ended is the backend's (or the caller's, once Command returned): the
// command has ended; ops fail from now on.
func (c *CommandControl) Ended() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.ended = true
		close(c.done)
	}
}

// Pid waits until the command has started and returns its pid; ok is
// false when it ended without starting or ctx ended first.
func (c *CommandControl) Pid(ctx context.Context) (pid int, ok bool) {
	select {
	case <-c.started:
		return c.pid, c.pid > 0
	case <-c.done:
		select {
		case <-c.started:
			return c.pid, c.pid > 0
		default:
			return 0, false
		}
	case <-ctx.Done():
		return 0, false
	}
}

// Send delivers op to the running command.
func (c *CommandControl) Send(op ControlOp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended || c.send == nil {
		return ErrCommandEnded
	}
	if err := c.send(op); err != nil {
		return err
	}
	switch {
	case op.Close:
		c.in.Closed = true
	case op.Signal != 0:
		c.in.Signals++
	case op.Size != nil:
		c.in.Resizes++
	default:
		c.in.Writes++
		c.in.Bytes += len(op.Data)
	}
	return nil
}

// Stats returns what was sent so far.
func (c *CommandControl) Stats() InputStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.in
}
