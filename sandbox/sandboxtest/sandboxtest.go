// Package sandboxtest is the conformance suite that every sandbox backend must pass.
//
// A backend's own tests call Run with a constructor; the suite starts real
// kernels and checks the contract documented on sandbox.Kernel and
// sandbox.WorkDir: state across cells, output events in order, the error
// shape, timeouts and the caller's hang-up, kernel death, files through the
// WorkDir seam (symlinks and special files never followed), Close, parallel
// kernels, the output limit and streaming, and the optional abilities it
// claims (sandbox.Contexts, sandbox.Commander, sandbox.Egress). A new backend is done when
// it passes, not when it compiles.
package sandboxtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// Options describe the backend under test.
type Options struct {
	// New returns a fresh backend, closed when the test ends. Its
	// interrupt grace period must be short enough for the suite's cells
	// (a few seconds, the backends' default).
	New func(t *testing.T) sandbox.Backend
	// Interrupts is true when the backend can stop a running cell and
	// keep the kernel's state (Docker's SIGINT); false when stopping a
	// running cell always restarts the kernel (wasm has no signals). The
	// suite checks whichever the backend claims.
	Interrupts bool
	// HostDir returns the host directory behind k.Files(), so the suite
	// can plant what a cell may not be able to make (a symlink to a host
	// file, a FIFO, a socket). Nil for a backend whose files are not on
	// this host; cells then make what they can.
	HostDir func(k sandbox.Kernel) string
	// Contexts is true when the backend's kernels implement
	// sandbox.Contexts, Commands when they implement sandbox.Commander.
	// The suite checks whichever the backend claims: an ability claimed
	// must pass its tests, one not claimed must not be implemented.
	Contexts, Commands bool
	// Egress is true when the backend's kernels implement sandbox.Egress.
	Egress bool
}

// Run runs the suite.
func Run(t *testing.T, o Options) {
	t.Run("State", func(t *testing.T) { t.Parallel(); testState(t, o) })
	t.Run("Outputs", func(t *testing.T) { t.Parallel(); testOutputs(t, o) })
	t.Run("Error", func(t *testing.T) { t.Parallel(); testError(t, o) })
	t.Run("Timeout", func(t *testing.T) { t.Parallel(); testTimeout(t, o) })
	t.Run("TimeoutIgnoringInterrupt", func(t *testing.T) { t.Parallel(); testTimeoutIgnoringInterrupt(t, o) })
	t.Run("KernelDied", func(t *testing.T) { t.Parallel(); testKernelDied(t, o) })
	t.Run("Files", func(t *testing.T) { t.Parallel(); testFiles(t, o) })
	t.Run("FilesNeverFollowed", func(t *testing.T) { t.Parallel(); testFilesNeverFollowed(t, o) })
	t.Run("CallerHangUp", func(t *testing.T) { t.Parallel(); testHangUp(t, o) })
	t.Run("Close", func(t *testing.T) { t.Parallel(); testClose(t, o) })
	t.Run("ParallelKernels", func(t *testing.T) { t.Parallel(); testParallel(t, o) })
	t.Run("OutputLimit", func(t *testing.T) { t.Parallel(); testOutputLimit(t, o) })
	t.Run("Streaming", func(t *testing.T) { t.Parallel(); testStreaming(t, o) })
	t.Run("Contexts", func(t *testing.T) { t.Parallel(); testContexts(t, o) })
	t.Run("Commands", func(t *testing.T) { t.Parallel(); testCommands(t, o) })
	t.Run("Egress", func(t *testing.T) { t.Parallel(); testEgress(t, o) })
}

// start starts a kernel on b, closed when the test ends.
func start(t *testing.T, b sandbox.Backend, spec sandbox.Spec) sandbox.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// outcome is one Execute: its result and everything delivered.
type outcome struct {
	res    *sandbox.Result
	col    *sandbox.Collector
	events []sandbox.Event
}

func (o outcome) String() string {
	b, _ := json.Marshal(o.res)
	return fmt.Sprintf("%s stdout=%.200q stderr=%.200q", b, o.col.Stdout.String(), o.col.Stderr.String())
}

// execute runs code and fails the test if the call itself errs.
func execute(t *testing.T, k sandbox.Kernel, code string, timeout time.Duration) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+3*time.Minute)
	defer cancel()
	o := outcome{col: &sandbox.Collector{}}
	res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: timeout, Output: func(e sandbox.Event) {
		o.events = append(o.events, e)
		o.col.Add(e)
	}})
	if err != nil {
		t.Fatalf("Execute(%q): %v", firstLine(code), err)
	}
	o.res = res
	return o
}

// ok runs a cell that has to succeed.
func ok(t *testing.T, k sandbox.Kernel, code string) outcome {
	t.Helper()
	o := execute(t, k, code, 60*time.Second)
	if !o.res.OK {
		t.Fatalf("cell %q failed: %s", firstLine(code), o)
	}
	return o
}

// value is the text/plain of the cell's result.
func value(t *testing.T, o outcome) string {
	t.Helper()
	if o.col.Value == nil {
		t.Fatalf("no result: %s", o)
	}
	var s string
	if err := json.Unmarshal(o.col.Value.Data["text/plain"], &s); err != nil {
		t.Fatalf("text/plain of %s: %v", o.col.Value.Data["text/plain"], err)
	}
	return s
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func testState(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "state"})
	first := ok(t, k, "x = 21")
	if first.col.Value != nil || first.res.ExecutionCount != 1 || first.res.Restarted {
		t.Errorf("x = 21: got %s, want no value, execution count 1, no restart", first)
	}
	second := ok(t, k, "x * 2")
	if got := value(t, second); got != "42" {
		t.Errorf("x * 2: got %s, want 42", got)
	}
	if second.res.ExecutionCount != 2 {
		t.Errorf("execution count: got %d, want 2", second.res.ExecutionCount)
	}
	if got := value(t, ok(t, k, "import os\nos.getcwd() == os.path.realpath('.') and len(os.listdir('.')) >= 0")); got != "True" {
		t.Errorf("working directory: got %s, want True", got)
	}
}

// kinds compresses an event list to its kinds, runs of one kind merged.
func kinds(events []sandbox.Event) []string {
	var out []string
	for _, e := range events {
		s := e.Kind.String()
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

func testOutputs(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "outputs"})
	out := ok(t, k, `import sys
class Rich:
    def __repr__(self): return 'Rich()'
    def _repr_html_(self): return '<b>rich</b>'
print('out1', flush=True)
print('err1', file=sys.stderr, flush=True)
display(Rich())
'value'`)
	if got, want := out.col.Stdout.String(), "out1\n"; got != want {
		t.Errorf("stdout: got %q, want %q", got, want)
	}
	if got, want := out.col.Stderr.String(), "err1\n"; got != want {
		t.Errorf("stderr: got %q, want %q", got, want)
	}
	if len(out.col.Display) != 1 || string(out.col.Display[0].Data["text/html"]) != `"<b>rich</b>"` || string(out.col.Display[0].Data["text/plain"]) != `"Rich()"` {
		t.Errorf("display: got %+v, want one bundle with text/html and text/plain", out.col.Display)
	}
	if got := value(t, out); got != "'value'" {
		t.Errorf("result: got %s, want 'value'", got)
	}
	if got, want := kinds(out.events), []string{"stdout", "stderr", "display", "result"}; !slices.Equal(got, want) {
		t.Errorf("event order: got %v, want %v", got, want)
	}
	// No value, no result event; a semicolon hides the value.
	for _, code := range []string{"None", "y = 1", "1 + 1;"} {
		if o := ok(t, k, code); o.col.Value != nil || slices.Contains(kinds(o.events), "result") {
			t.Errorf("%q: got a result %s, want none", code, o)
		}
	}
}

func testError(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "error"})
	ok(t, k, "x = 1")
	out := execute(t, k, "def f(a, b):\n    return a / b\nf(1, 0)", 60*time.Second)
	e := out.res.Error
	if out.res.OK || e == nil {
		t.Fatalf("1/0: got %s, want an execution error", out)
	}
	if e.Kind != sandbox.KindExecution || e.Ename != "ZeroDivisionError" || e.Evalue != "division by zero" || out.res.Restarted {
		t.Errorf("1/0: got %+v restarted=%v, want execution_error ZeroDivisionError: division by zero", e, out.res.Restarted)
	}
	tb := strings.Join(e.Traceback, "\n")
	if len(e.Traceback) < 2 || !strings.Contains(tb, "ZeroDivisionError") || !strings.Contains(tb, "return a / b") {
		t.Errorf("traceback: got %q, want the failing line and the exception", e.Traceback)
	}
	if strings.Contains(tb, "\x1b[") {
		t.Errorf("traceback carries ANSI colour codes: %q", tb)
	}
	if got := value(t, ok(t, k, "x")); got != "1" {
		t.Errorf("x after an error: got %s, want 1", got)
	}
	out = execute(t, k, "1 +", 60*time.Second)
	if out.res.Error == nil || out.res.Error.Kind != sandbox.KindExecution || out.res.Error.Ename != "SyntaxError" {
		t.Errorf("1 +: got %s, want a SyntaxError", out)
	}
}

func testTimeout(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "timeout"})
	ok(t, k, "x = 21\nopen('kept.txt', 'w').write('kept')")
	out := execute(t, k, "print('spinning', flush=True)\nwhile True: pass", 2*time.Second)
	if out.res.OK || out.res.Error == nil || out.res.Error.Kind != sandbox.KindTimeout {
		t.Fatalf("while True: got %s, want kind timeout", out)
	}
	if got := out.col.Stdout.String(); got != "spinning\n" {
		t.Errorf("output before the timeout: got %q, want %q", got, "spinning\n")
	}
	if out.res.Restarted == o.Interrupts {
		t.Errorf("Restarted: got %v, want %v (the backend says it can interrupt: %v)", out.res.Restarted, !o.Interrupts, o.Interrupts)
	}
	want := "(True, 'kept')"
	if !o.Interrupts {
		want = "(False, 'kept')"
	}
	if got := value(t, ok(t, k, "'x' in globals(), open('kept.txt').read()")); got != want {
		t.Errorf("after the timeout: got %s, want %s", got, want)
	}
}

// ignoresInterrupt is a cell that swallows every KeyboardInterrupt, so only
// a restart stops it.
const ignoresInterrupt = `import time
while True:
    try:
        print('stubborn', flush=True)
        while True:
            time.sleep(0.01)
    except KeyboardInterrupt:
        pass`

func testTimeoutIgnoringInterrupt(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "stubborn"})
	ok(t, k, "x = 21\nopen('kept.txt', 'w').write('kept')")
	out := execute(t, k, ignoresInterrupt, 2*time.Second)
	if out.res.OK || out.res.Error == nil || out.res.Error.Kind != sandbox.KindTimeout || !out.res.Restarted {
		t.Fatalf("a cell ignoring interrupts: got %s, want kind timeout with Restarted", out)
	}
	next := ok(t, k, "'x' in globals(), open('kept.txt').read()")
	if got := value(t, next); got != "(False, 'kept')" {
		t.Errorf("after the restart: got %s, want (False, 'kept'): state gone, files kept", got)
	}
	if next.res.ExecutionCount != 1 {
		t.Errorf("execution count after a restart: got %d, want 1", next.res.ExecutionCount)
	}
}

func testKernelDied(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "died"})
	ok(t, k, "x = 1")
	out := execute(t, k, "import os\nos._exit(3)", 60*time.Second)
	e := out.res.Error
	if out.res.OK || e == nil || e.Kind != sandbox.KindKernelDied || !out.res.Restarted {
		t.Fatalf("os._exit(3): got %s, want kind kernel_died with Restarted", out)
	}
	if !strings.Contains(e.Reason, "code 3") {
		t.Errorf("reason: got %q, want the exit code 3", e.Reason)
	}
	if got := value(t, ok(t, k, "'x' in globals()")); got != "False" {
		t.Errorf("state after the death: x defined = %s, want False", got)
	}
}

func testFiles(t *testing.T, o Options) {
	ctx := t.Context()
	k := start(t, o.New(t), sandbox.Spec{Owner: "files"})
	wd := k.Files()
	l, err := wd.Scan(ctx)
	if err != nil || len(l.Files) != 0 {
		t.Fatalf("a new kernel's directory: got %+v, %v, want it empty", l, err)
	}
	// Put: the cell reads it, in a subdirectory made for it.
	e, err := wd.Put(ctx, "in/data.csv", strings.NewReader("a,b\n1,2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "in/data.csv" || e.Size != 8 || e.Stamp == "" {
		t.Errorf("Put: got %+v, want path in/data.csv, size 8 and a stamp", e)
	}
	if got := value(t, ok(t, k, "open('in/data.csv').read()")); got != `'a,b\n1,2\n'` {
		t.Errorf("the cell reads the put file: got %s", got)
	}
	// What the cell writes shows in Scan, and Open reads it as Scan saw it.
	ok(t, k, "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('result')")
	l, err = wd.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	var scanned sandbox.Entry
	for _, f := range l.Files {
		paths = append(paths, f.Path)
		if f.Path == "out/r.txt" {
			scanned = f
		}
	}
	if want := []string{"in/data.csv", "out/r.txt"}; !slices.Equal(paths, want) {
		t.Fatalf("Scan: got %v, want %v", paths, want)
	}
	r, opened, err := wd.Open(ctx, "out/r.txt")
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(data) != "result" || opened != scanned || opened.Size != 6 {
		t.Errorf("Open: got %q %+v %v, want %q and the entry Scan gave, %+v", data, opened, err, "result", scanned)
	}
	// Put replaces a file; its stamp changes.
	e2, err := wd.Put(ctx, "out/r.txt", strings.NewReader("replaced"))
	if err != nil {
		t.Fatal(err)
	}
	if e2.Stamp == scanned.Stamp || e2.Size != 8 {
		t.Errorf("Put over a file: got %+v, want a new stamp and size 8 (was %+v)", e2, scanned)
	}
	if got := value(t, ok(t, k, "open('out/r.txt').read()")); got != "'replaced'" {
		t.Errorf("the cell reads the replaced file: got %s", got)
	}
	// A directory in the way of Put is left alone.
	if _, err := wd.Put(ctx, "out", strings.NewReader("x")); !errors.Is(err, sandbox.ErrNotRegular) {
		t.Errorf("Put over a directory: got %v, want ErrNotRegular", err)
	}
	// Remove, and Remove of what is missing.
	if err := wd.Remove(ctx, "out/r.txt"); err != nil {
		t.Fatal(err)
	}
	if err := wd.Remove(ctx, "out/r.txt"); err != nil {
		t.Errorf("Remove of a missing file: got %v, want nil", err)
	}
	if got := value(t, ok(t, k, "import os\nos.path.exists('out/r.txt')")); got != "False" {
		t.Errorf("after Remove the cell sees the file: %s", got)
	}
	if _, _, err := wd.Open(ctx, "out/r.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a removed file: got %v, want fs.ErrNotExist", err)
	}
	// Paths that leave the directory are refused.
	for _, p := range []string{"../escape", "/etc/passwd", "a/../../b"} {
		if _, err := wd.Put(ctx, p, strings.NewReader("x")); err == nil {
			t.Errorf("Put(%q) succeeded", p)
		}
		if _, _, err := wd.Open(ctx, p); err == nil {
			t.Errorf("Open(%q) succeeded", p)
		}
	}
}

func testFilesNeverFollowed(t *testing.T, o Options) {
	ctx := t.Context()
	k := start(t, o.New(t), sandbox.Spec{Owner: "links"})
	wd := k.Files()
	// The cell makes what it can; a backend may refuse each (wasm has no
	// symlinks or FIFOs), and whatever exists must be skipped.
	ok(t, k, `import os
for make in (lambda: os.symlink('/etc/passwd', 'cell-link'), lambda: os.mkfifo('cell-fifo')):
    try:
        make()
    except (OSError, AttributeError, NotImplementedError):
        pass
open('plain.txt', 'w').write('plain')`)
	planted := []string{"cell-link", "cell-fifo"}
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o.HostDir != nil {
		dir := o.HostDir(k)
		for _, err := range []error{
			os.Symlink(secret, filepath.Join(dir, "link")),
			os.Symlink(outside, filepath.Join(dir, "dirlink")),
			syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644),
			mksocket(filepath.Join(dir, "sock")),
		} {
			if err != nil {
				t.Fatalf("plant: %v", err)
			}
		}
		planted = append(planted, "link", "dirlink", "fifo", "sock")
	}
	l, err := wd.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range l.Files {
		files = append(files, f.Path)
	}
	if !slices.Equal(files, []string{"plain.txt"}) {
		t.Errorf("Scan files: got %v, want only plain.txt", files)
	}
	for _, p := range planted {
		exists := o.HostDir != nil && exists(o.HostDir(k), p)
		if exists && !slices.Contains(l.Skipped, p) {
			t.Errorf("Scan skipped %v, want %s among them", l.Skipped, p)
		}
		// Open refuses it at once: a FIFO never blocks it.
		done := make(chan error, 1)
		go func() {
			r, _, err := wd.Open(ctx, p)
			if err == nil {
				r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, sandbox.ErrNotRegular) && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Open(%s): got %v, want ErrNotRegular (or missing)", p, err)
			}
		case <-time.After(time.Minute): // a hang guard, not a speed check
			t.Fatalf("Open(%s) blocked", p)
		}
	}
	if o.HostDir == nil {
		return
	}
	if _, _, err := wd.Open(ctx, "dirlink/secret.txt"); err == nil {
		t.Errorf("Open through a symlinked directory succeeded")
	}
	// Put replaces a symlink, and a symlinked directory, without writing
	// through either.
	if _, err := wd.Put(ctx, "link", strings.NewReader("mine")); err != nil {
		t.Fatal(err)
	}
	if _, err := wd.Put(ctx, "dirlink/secret.txt", strings.NewReader("mine")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host secret" {
		t.Errorf("the host file behind the links: got %q, %v, want it untouched", b, err)
	}
	if got := value(t, ok(t, k, "open('link').read(), open('dirlink/secret.txt').read()")); got != "('mine', 'mine')" {
		t.Errorf("the cell reads the replaced links: got %s", got)
	}
	if st, err := os.Lstat(filepath.Join(o.HostDir(k), "link")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("link after Put: got %v, %v, want a regular file", st, err)
	}
}

func exists(dir, p string) bool {
	_, err := os.Lstat(filepath.Join(dir, p))
	return err == nil
}

// mksocket leaves a unix socket file at p.
func mksocket(p string) error {
	l, err := net.Listen("unix", p)
	if err != nil {
		return err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l.Close()
}

func testHangUp(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "hangup"})
	ok(t, k, "x = 21")

	// ctx already done: nothing runs.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := k.Execute(ctx, sandbox.Cell{Code: "x = 99", Timeout: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Execute with a done ctx: got %v, want context.Canceled", err)
	}
	if got := value(t, ok(t, k, "x")); got != "21" {
		t.Fatalf("x after a refused cell: got %s, want 21", got)
	}

	// The caller hangs up while the cell runs: interrupted, kept when the
	// backend can interrupt.
	res := hangUp(t, k, "print('started', flush=True)\nwhile True: pass")
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindInterrupted || res.Restarted == o.Interrupts {
		t.Fatalf("hang-up: got %+v restarted=%v, want kind interrupted, Restarted %v", res.Error, res.Restarted, !o.Interrupts)
	}
	want := "'21'"
	if !o.Interrupts {
		want = "'None'"
	}
	if got := value(t, ok(t, k, "str(globals().get('x'))")); got != want {
		t.Errorf("x after the hang-up: got %s, want %s", got, want)
	}
	ok(t, k, "x = 21")

	// A cell that ignores the interrupt: the kernel restarts.
	res = hangUp(t, k, ignoresInterrupt)
	if res.Error == nil || res.Error.Kind != sandbox.KindInterrupted || !res.Restarted {
		t.Fatalf("hang-up of a stubborn cell: got %+v restarted=%v, want kind interrupted with Restarted", res.Error, res.Restarted)
	}
	if got := value(t, ok(t, k, "str(globals().get('x'))")); got != "'None'" {
		t.Errorf("x after the restart: got %s, want 'None'", got)
	}
}

// hangUp runs code, cancels the call once the cell has printed, and
// returns the result.
func hangUp(t *testing.T, k sandbox.Kernel, code string) *sandbox.Result {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: 5 * time.Minute, Output: func(e sandbox.Event) {
		if e.Kind == sandbox.EventStdout {
			cancel()
		}
	}})
	if err != nil {
		t.Fatalf("Execute: got error %v, want a Result", err)
	}
	return res
}

func testClose(t *testing.T, o Options) {
	b := o.New(t)
	k := start(t, b, sandbox.Spec{Owner: "close"})
	ok(t, k, "open('f.txt', 'w').write('f')")
	// Close during a cell ends it with ErrClosed.
	errc := make(chan error, 1)
	running := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := k.Execute(context.Background(), sandbox.Cell{Code: "print('running', flush=True)\nimport time\nwhile True: time.sleep(0.01)", Timeout: 5 * time.Minute,
			Output: func(sandbox.Event) { once.Do(func() { close(running) }) }})
		errc <- err
	}()
	<-running
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute during Close: got %v, want ErrClosed", err)
	}
	if err := k.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := k.Execute(t.Context(), sandbox.Cell{Code: "1", Timeout: time.Minute}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute after Close: got %v, want ErrClosed", err)
	}
	if err := k.Restart(t.Context()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Restart after Close: got %v, want ErrClosed", err)
	}
	if _, err := k.Files().Scan(t.Context()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Scan after Close: got %v, want ErrClosed", err)
	}
	if _, err := k.Files().Put(t.Context(), "g.txt", strings.NewReader("g")); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Put after Close: got %v, want ErrClosed", err)
	}
	// The backend's Close closes the kernels it started, and is safe twice.
	k2 := start(t, b, sandbox.Spec{Owner: "close-2"})
	if err := b.Close(); err != nil {
		t.Fatalf("Backend.Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Backend.Close: %v", err)
	}
	if _, err := k2.Execute(t.Context(), sandbox.Cell{Code: "1", Timeout: time.Minute}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute after Backend.Close: got %v, want ErrClosed", err)
	}
	if _, err := b.Start(t.Context(), sandbox.Spec{}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Start after Backend.Close: got %v, want ErrClosed", err)
	}
}

func testParallel(t *testing.T, o Options) {
	b := o.New(t)
	var ks [2]sandbox.Kernel
	for i := range ks {
		ks[i] = start(t, b, sandbox.Spec{Owner: fmt.Sprintf("parallel-%d", i)})
	}
	// Both run at once: each cell waits until the other's has started.
	for _, k := range ks {
		if _, err := k.Files().Put(t.Context(), "peer", strings.NewReader("")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	outs := make([]outcome, 2)
	errs := make([]error, 2)
	for i, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			col := &sandbox.Collector{}
			code := fmt.Sprintf(`import os, time
x = %d
open('mine-%d.txt', 'w').write('%d')
print('started', flush=True)
while not os.path.exists('peer-started'):
    time.sleep(0.02)
(x, sorted(os.listdir('.')))`, i, i, i)
			var once sync.Once
			res, err := k.Execute(context.Background(), sandbox.Cell{Code: code, Timeout: 2 * time.Minute, Output: func(e sandbox.Event) {
				col.Add(e)
				if e.Kind == sandbox.EventStdout {
					// Tell the other kernel this one is running.
					once.Do(func() {
						go func() { _, _ = ks[1-i].Files().Put(context.Background(), "peer-started", strings.NewReader("")) }()
					})
				}
			}})
			outs[i], errs[i] = outcome{res: res, col: col}, err
		}()
	}
	wg.Wait()
	for i := range ks {
		if errs[i] != nil || !outs[i].res.OK {
			t.Fatalf("kernel %d: %v %s", i, errs[i], outs[i])
		}
		want := fmt.Sprintf("(%d, ['mine-%d.txt', 'peer', 'peer-started'])", i, i)
		if got := value(t, outs[i]); got != want {
			t.Errorf("kernel %d: got %s, want %s", i, got, want)
		}
	}
	if got := value(t, ok(t, ks[1], "x")); got != "1" {
		t.Errorf("kernel 1 after both ran: x = %s, want 1", got)
	}
}

func testOutputLimit(t *testing.T, o Options) {
	const limit = 64 << 10
	k := start(t, o.New(t), sandbox.Spec{Owner: "flood", Limits: sandbox.Limits{OutputBytes: limit}})
	ok(t, k, "x = 21")
	for _, tc := range []struct{ name, code string }{
		{"print loop", "while True:\n    print('x' * 1000)"},
		{"one large write", "print('y' * (1 << 20))\nimport time\nwhile True: time.sleep(0.01)"},
		{"displays", "class D:\n    def _repr_html_(self): return '<p>' + 'z' * 4000 + '</p>'\nwhile True:\n    display(D())"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var delivered int64
			res, err := k.Execute(t.Context(), sandbox.Cell{Code: tc.code, Timeout: 2 * time.Minute, Output: func(e sandbox.Event) {
				delivered += e.Size()
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindOutputLimit {
				t.Fatalf("got %+v, want kind output_limit", res.Error)
			}
			if delivered > limit {
				t.Errorf("delivered %d bytes, want at most the %d limit", delivered, limit)
			}
			// The kernel works afterwards, with its state unless it says
			// it restarted (then x is set again for the next case).
			want := "'21'"
			if res.Restarted {
				want = "'None'"
			}
			if got := value(t, ok(t, k, "str(globals().get('x'))")); got != want {
				t.Errorf("x after the flood: got %s, want %s (restarted=%v)", got, want, res.Restarted)
			}
			if res.Restarted {
				ok(t, k, "x = 21")
			}
		})
	}
}

func testStreaming(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "stream"})
	// Each line is printed only after the host saw the one before: the
	// cell waits for an acknowledgement file that the test puts when the
	// line's event arrives. Without streaming the cell would wait until
	// its timeout.
	acks := make(chan int, 3)
	var seen strings.Builder
	var events []sandbox.Event
	next := 0
	go func() {
		for i := range acks {
			if _, err := k.Files().Put(context.Background(), fmt.Sprintf("ack%d", i), strings.NewReader("")); err != nil {
				t.Errorf("put ack%d: %v", i, err)
			}
		}
	}()
	defer close(acks)
	res, err := k.Execute(t.Context(), sandbox.Cell{Code: `import os, time
for i in range(3):
    print(i)
    while not os.path.exists('ack%d' % i):
        time.sleep(0.05)
'done'`, Timeout: 2 * time.Minute, Output: func(e sandbox.Event) {
		events = append(events, e)
		if e.Kind != sandbox.EventStdout {
			return
		}
		seen.WriteString(e.Text)
		for next < 3 && strings.Contains(seen.String(), fmt.Sprintf("%d\n", next)) {
			acks <- next
			next++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("got %+v after %d acknowledged lines (stdout %q), want the cell to finish", res.Error, next, seen.String())
	}
	if got, want := kinds(events), []string{"stdout", "result"}; !slices.Equal(got, want) {
		t.Errorf("event kinds: got %v, want %v", got, want)
	}
	var lines []string
	for _, e := range events {
		if e.Kind == sandbox.EventStdout {
			lines = append(lines, e.Text)
		}
	}
	if want := []string{"0\n", "1\n", "2\n"}; !slices.Equal(lines, want) {
		t.Errorf("stdout events: got %q, want one per line %q", lines, want)
	}
}

// egressCell asks for a URL through the sandbox's egress address, as a
// cell with HTTP_PROXY set would, and prints the answer or the refusal.
const egressCell = `import urllib.request, urllib.error
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://` + sandbox.EgressAddr + `"}))
    print(opener.open("http://example.test/path", timeout=120).read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.reason)
except OSError as e:
    print("unreachable:", e)
`

// testEgress: a kernel that implements sandbox.Egress refuses its
// processes' connections while nobody accepts them; once EgressReady
// returns, each reaches AcceptEgress with its bytes both ways, and again
// after a restart; Close ends AcceptEgress.
func testEgress(t *testing.T, o Options) {
	b := o.New(t)
	k := start(t, b, sandbox.Spec{Owner: "egress"})
	e, has := k.(sandbox.Egress)
	if has != o.Egress {
		t.Fatalf("the kernel implements sandbox.Egress: %v; the backend claims %v", has, o.Egress)
	}
	if !has {
		return
	}
	got := ok(t, k, egressCell).col.Stdout.String()
	if !strings.Contains(got, "403 Triad egress denied: this run has no egress policy") && !strings.Contains(got, "unreachable") {
		t.Errorf("with nobody accepting, a connection got %q, want a refusal", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := e.AcceptEgress(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				body := "relayed " + req.Method + " " + req.URL.String()
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer rcancel()
	if err := e.EgressReady(rctx); err != nil {
		t.Fatalf("EgressReady: %v", err)
	}
	if got := ok(t, k, egressCell).col.Stdout.String(); !strings.Contains(got, "relayed GET http://example.test/path") {
		t.Errorf("through the relay: %q, want the host's answer", got)
	}
	if err := k.Restart(rctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := e.EgressReady(rctx); err != nil {
		t.Fatalf("EgressReady after a restart: %v", err)
	}
	if got := ok(t, k, egressCell).col.Stdout.String(); !strings.Contains(got, "relayed GET http://example.test/path") {
		t.Errorf("through the relay after a restart: %q, want the host's answer", got)
	}
	k.Close()
	if _, err := e.AcceptEgress(context.Background()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("AcceptEgress after Close: %v, want ErrClosed", err)
	}
}
