package jupyter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCells runs cells in order on one kernel, each checking one kind of
// output; later cells rely on the state earlier ones left.
func TestCells(t *testing.T) {
	_, c := startKernel(t, Options{})

	text := func(t *testing.T, b Bundle, mime string) string {
		t.Helper()
		s, ok := b.Text(mime)
		if !ok {
			t.Fatalf("bundle has no %s string: %v", mime, b.Data)
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		code  string
		check func(t *testing.T, out Output)
	}{
		{"assignment", "x = 21", func(t *testing.T, out Output) {
			if out.Status != StatusOK || out.Result != nil || out.Stdout != "" {
				t.Errorf("got status %q result %v stdout %q, want ok, no result, no stdout", out.Status, out.Result, out.Stdout)
			}
		}},
		{"state survives", "x*2", func(t *testing.T, out Output) {
			if out.Result == nil {
				t.Fatalf("got no execute_result, want 42")
			}
			if got := text(t, out.Result.Bundle, "text/plain"); got != "42" {
				t.Errorf("got %q, want 42", got)
			}
			if out.ExecutionCount == 0 || out.Result.ExecutionCount != out.ExecutionCount {
				t.Errorf("got execution counts %d (result) and %d (reply), want equal and non-zero", out.Result.ExecutionCount, out.ExecutionCount)
			}
		}},
		{"stdout", `print("hello")`, func(t *testing.T, out Output) {
			if out.Stdout != "hello\n" {
				t.Errorf("got stdout %q, want %q", out.Stdout, "hello\n")
			}
		}},
		{"stderr", "import sys\nprint('oops', file=sys.stderr)", func(t *testing.T, out Output) {
			if out.Stderr != "oops\n" || out.Stdout != "" {
				t.Errorf("got stderr %q stdout %q, want %q and nothing", out.Stderr, out.Stdout, "oops\n")
			}
		}},
		{"exception", "1/0", func(t *testing.T, out Output) {
			if out.Status != StatusError {
				t.Errorf("got status %q, want %q", out.Status, StatusError)
			}
			if out.Error == nil {
				t.Fatal("got no error, want ZeroDivisionError")
			}
			if out.Error.Ename != "ZeroDivisionError" || out.Error.Evalue != "division by zero" {
				t.Errorf("got %s: %s, want ZeroDivisionError: division by zero", out.Error.Ename, out.Error.Evalue)
			}
			if !strings.Contains(strings.Join(out.Error.Traceback, "\n"), "ZeroDivisionError") {
				t.Errorf("got traceback %q, want it to name ZeroDivisionError", out.Error.Traceback)
			}
		}},
		{"not aborted after an error", "x", func(t *testing.T, out Output) {
			if out.Aborted || out.Status != StatusOK {
				t.Fatalf("got status %q aborted %v, want ok", out.Status, out.Aborted)
			}
			if got := text(t, out.Result.Bundle, "text/plain"); got != "21" {
				t.Errorf("got %q, want 21", got)
			}
		}},
		{"matplotlib", "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()", func(t *testing.T, out Output) {
			if len(out.Displays) != 1 {
				t.Fatalf("got %d displays, want 1 (stderr %q)", len(out.Displays), out.Stderr)
			}
			png, err := base64.StdEncoding.DecodeString(text(t, out.Displays[0].Bundle, "image/png"))
			if err != nil {
				t.Fatalf("image/png is not base64: %v", err)
			}
			if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("got image/png starting %q, want the PNG signature", png[:min(8, len(png))])
			}
		}},
		{"clear_output", "from IPython.display import clear_output\nprint('a')\ndisplay('d')\nclear_output()\nprint('b')", func(t *testing.T, out Output) {
			if out.Stdout != "b\n" || len(out.Displays) != 0 {
				t.Errorf("got stdout %q and %d displays, want %q and none", out.Stdout, len(out.Displays), "b\n")
			}
		}},
		{"clear_output wait", "from IPython.display import clear_output\nimport sys\nprint('a')\nsys.stdout.flush()\nclear_output(wait=True)\nprint('b')", func(t *testing.T, out Output) {
			if out.Stdout != "b\n" {
				t.Errorf("got stdout %q, want %q", out.Stdout, "b\n")
			}
		}},
		{"update_display_data", "h = display('one', display_id=True)\nh.update('two')", func(t *testing.T, out Output) {
			if len(out.Displays) != 1 {
				t.Fatalf("got %d displays, want 1 updated in place", len(out.Displays))
			}
			d := out.Displays[0]
			if got := text(t, d.Bundle, "text/plain"); got != "'two'" || d.DisplayID == "" || d.IsUpdate {
				t.Errorf("got %q id %q update %v, want 'two' with an id, in place", got, d.DisplayID, d.IsUpdate)
			}
		}},
		{"update of an earlier cell's display", "h.update('three')", func(t *testing.T, out Output) {
			if len(out.Displays) != 1 || !out.Displays[0].IsUpdate {
				t.Fatalf("got displays %+v, want one marked IsUpdate", out.Displays)
			}
			if got := text(t, out.Displays[0].Bundle, "text/plain"); got != "'three'" {
				t.Errorf("got %q, want 'three'", got)
			}
		}},
		{"20 MB of stdout", "print('x' * 20_000_000)", func(t *testing.T, out Output) {
			if len(out.Stdout) != 20_000_001 || strings.Trim(out.Stdout, "x") != "\n" {
				t.Errorf("got %d bytes of stdout, want 20000001 x's and a newline", len(out.Stdout))
			}
		}},
		{"20 MB result", "'y' * 20_000_000", func(t *testing.T, out Output) {
			if out.Result == nil {
				t.Fatal("got no execute_result")
			}
			if got := text(t, out.Result.Bundle, "text/plain"); len(got) != 20_000_002 {
				t.Errorf("got a %d-byte repr, want 20000002", len(got))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := run(t, c, tc.code)
			if !out.Complete {
				t.Errorf("got Complete false after Wait returned without error")
			}
			tc.check(t, out)
		})
	}
}

// eventually polls cond until it holds, failing the test if it does not
// within 30 s. It bounds waits for the kernel; it measures nothing.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting: %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitStdout waits until a running cell's stdout contains want.
func waitStdout(t *testing.T, ex *Execution, want string) {
	t.Helper()
	eventually(t, fmt.Sprintf("cell printing %q", want), func() bool { return strings.Contains(ex.Output().Stdout, want) })
}

// TestInterrupt stops an endless cell and checks that the kernel keeps its
// state and runs the next cell normally.
func TestInterrupt(t *testing.T) {
	_, c := startKernel(t, Options{})
	run(t, c, "x = 21")
	// Between cells ipykernel ignores SIGINT, so an interrupt then is
	// answered and harmless.
	if err := c.Interrupt(t.Context()); err != nil {
		t.Fatalf("Interrupt while idle: %v", err)
	}

	ex, err := c.Execute(t.Context(), "print('started', flush=True)\nwhile True: pass", ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitStdout(t, ex, "started")

	// A Wait cut short leaves the cell running and can be repeated.
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	out, err := ex.Wait(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if out.Complete || out.Stdout != "started\n" {
		t.Errorf("got partial output complete=%v stdout %q, want incomplete with %q", out.Complete, out.Stdout, "started\n")
	}
	// The heartbeat thread answers while the cell spins.
	if err := c.Heartbeat(t.Context()); err != nil {
		t.Errorf("Heartbeat during a busy cell: %v", err)
	}

	if err := c.Interrupt(t.Context()); err != nil {
		t.Fatalf("Interrupt: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err = ex.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait after Interrupt: %v", err)
	}
	if out.Error == nil || out.Error.Ename != "KeyboardInterrupt" {
		t.Fatalf("got error %+v, want KeyboardInterrupt", out.Error)
	}

	// Sent right away, as the server will after a timeout (pitfall 10).
	out = run(t, c, "x")
	if out.Aborted || out.Result == nil {
		t.Fatalf("got status %q aborted %v, want ok with a result", out.Status, out.Aborted)
	}
	if got, _ := out.Result.Text("text/plain"); got != "21" {
		t.Errorf("got x = %q after the interrupt, want 21", got)
	}
}

// TestKernelKilled checks that a SIGKILLed kernel is noticed and reported as
// ErrKernelDead by every call, including a Wait already in progress.
func TestKernelKilled(t *testing.T) {
	k, c := startKernel(t, Options{})
	ex, err := c.Execute(t.Context(), "print('started', flush=True)\nwhile True: pass", ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitStdout(t, ex, "started")
	if c.Err() != nil {
		t.Fatalf("got Err %v before the kill, want nil", c.Err())
	}

	if err := k.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := ex.Wait(ctx)
	if !errors.Is(err, ErrKernelDead) {
		t.Fatalf("Wait: got %v, want ErrKernelDead", err)
	}
	if out.Stdout != "started\n" {
		t.Errorf("got partial stdout %q, want %q", out.Stdout, "started\n")
	}
	select {
	case <-c.Dead():
	default:
		t.Fatal("Dead not closed after Wait reported the death")
	}
	if !errors.Is(c.Err(), ErrKernelDead) {
		t.Errorf("Err: got %v, want ErrKernelDead", c.Err())
	}

	for name, call := range map[string]func() error{
		"Execute": func() error {
			_, err := c.Execute(ctx, "1", ExecOptions{})
			return err
		},
		"Interrupt": func() error { return c.Interrupt(ctx) },
		"Heartbeat": func() error { return c.Heartbeat(ctx) },
		"WaitReady": func() error { return c.WaitReady(ctx) },
		"Shutdown":  func() error { return c.Shutdown(ctx, false) },
	} {
		if err := call(); !errors.Is(err, ErrKernelDead) {
			t.Errorf("%s after the kill: got %v, want ErrKernelDead", name, err)
		}
	}
}

// TestShutdown asks the kernel to exit and checks that it does and that the
// death is reported as a shutdown. ipykernel exits either way; restart only
// informs it.
func TestShutdown(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			k, c := startKernel(t, Options{})
			if err := c.Heartbeat(t.Context()); err != nil {
				t.Fatalf("Heartbeat: %v", err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := c.Shutdown(ctx, restart); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			select {
			case <-k.exited:
			case <-ctx.Done():
				t.Fatal("kernel process still running after shutdown_reply")
			}
			if state := k.cmd.ProcessState; state == nil || !state.Success() {
				t.Errorf("got exit %v, want a clean exit", state)
			}
			select {
			case <-c.Dead():
			case <-ctx.Done():
				t.Fatal("Dead not closed after the kernel exited")
			}
			if err := c.Err(); !errors.Is(err, ErrKernelDead) || !strings.Contains(err.Error(), "shut down") {
				t.Errorf("got Err %v, want ErrKernelDead noting the shutdown", err)
			}
		})
	}
}

// clientGoroutines returns the live goroutines (by id) running this
// package's non-test code or zmtp's.
func clientGoroutines() map[string]string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	head := regexp.MustCompile(`^goroutine (\d+) `)
	ownCode := regexp.MustCompile(`sandbox/jupyter/((client|execute|wire|conninfo)|zmtp/[a-z]+)\.go`)
	got := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		m := head.FindStringSubmatch(g)
		if m == nil || strings.Contains(g, "testing.tRunner") {
			continue
		}
		if ownCode.MatchString(g) {
			got[m[1]] = g
		}
	}
	return got
}

// TestCloseTwice checks that Close stops every goroutine the client and its
// sockets started, and that a second Close and later calls are harmless.
func TestCloseTwice(t *testing.T) {
	before := clientGoroutines()
	k, c := startKernel(t, Options{})
	out := run(t, c, "print('hi')")
	if out.Stdout != "hi\n" {
		t.Fatalf("got %q, want %q", out.Stdout, "hi\n")
	}
	if err := c.Heartbeat(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A cell flooding iopub while the client closes: the reader must not
	// be left blocked delivering messages nobody reads.
	pending, err := c.Execute(t.Context(), "print('flood', flush=True)\nfor i in range(10**6): display(i)", ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitStdout(t, pending, "flood")
	eventually(t, "100 displays", func() bool { return len(pending.Output().Displays) >= 100 })

	if err := c.Close(); err != nil {
		t.Errorf("first Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := pending.Wait(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close: got %v, want ErrClosed", err)
	}
	if _, err := c.Execute(t.Context(), "1", ExecOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Execute after Close: got %v, want ErrClosed", err)
	}
	if err := c.Heartbeat(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Heartbeat after Close: got %v, want ErrClosed", err)
	}

	// Close waits for the client's own goroutines; the watchdog timers'
	// goroutines, if one fired, end a moment later.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		leaked := clientGoroutines()
		for id := range before {
			delete(leaked, id)
		}
		if len(leaked) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			for _, g := range leaked {
				t.Errorf("goroutine left after Close:\n%s", g)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Closing the client leaves the kernel alone.
	select {
	case <-k.exited:
		t.Error("kernel exited when the client closed")
	default:
	}
}

// TestBadSignatureDropped has the kernel publish a stream message signed with
// the wrong key next to a genuine one, and checks that only the genuine one
// reaches the cell's output and the forgery is logged.
func TestBadSignatureDropped(t *testing.T) {
	var logs logBuffer
	_, c := startKernel(t, Options{Logger: logs.logger()})
	out := run(t, c, `from jupyter_client.session import Session
_k = get_ipython().kernel
_parent = _k.get_parent("shell")
Session(key=b"not-the-key", session=_k.session.session).send(
    _k.iopub_socket, "stream", {"name": "stdout", "text": "FORGED\n"}, parent=_parent, ident=b"stream.stdout")
_k.session.send(_k.iopub_socket, "stream", {"name": "stdout", "text": "GENUINE\n"}, parent=_parent, ident=b"stream.stdout")
`)
	if out.Error != nil {
		t.Fatalf("cell failed: %s: %s", out.Error.Ename, out.Error.Evalue)
	}
	if out.Stdout != "GENUINE\n" {
		t.Errorf("got stdout %q, want only %q", out.Stdout, "GENUINE\n")
	}
	if !strings.Contains(logs.String(), "bad message signature") {
		t.Errorf("got logs %q, want the dropped forgery logged", logs.String())
	}
}

// TestDialErrors checks that Dial fails with a useful error instead of
// hanging when the sockets cannot be reached.
func TestDialErrors(t *testing.T) {
	dir, err := os.MkdirTemp("", "jd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	prefix := filepath.Join(dir, "k")

	// A regular file where a socket should be refuses connections for
	// ever; so does a missing one. Both must end with ctx, naming the cause.
	if err := os.WriteFile(prefix+"-2", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tooLong := "/tmp/" + strings.Repeat("d", 110) + "/k"
	for _, tc := range []struct {
		name   string
		info   func() ConnInfo
		prefix string
		want   string
	}{
		{"path too long", func() ConnInfo { return NewConnInfo(tooLong) }, "", "unix socket limit"},
		{"not a socket", func() ConnInfo { return NewConnInfo(prefix) }, "", "connection refused"},
		{"no socket", func() ConnInfo { return NewConnInfo(filepath.Join(dir, "absent")) }, "", "no such file or directory"},
		{"parent not a directory", func() ConnInfo { return NewConnInfo(prefix + "-2/k") }, "", "not a directory"},
		{"bad transport", func() ConnInfo { i := NewConnInfo(prefix); i.Transport = "udp"; return i }, "", "transport"},
		{"bad scheme", func() ConnInfo { i := NewConnInfo(prefix); i.SignatureScheme = "hmac-md5"; return i }, "", "signature scheme"},
		{"no port", func() ConnInfo { i := NewConnInfo(prefix); i.HBPort = 0; return i }, "", "hb_port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			c, err := Dial(ctx, tc.info(), tc.prefix, Options{})
			if err == nil {
				c.Close()
				t.Fatal("got a client, want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
			// Errors that waiting cannot fix are returned without waiting.
			retried := strings.Contains(err.Error(), "not answering before")
			if wantRetried := tc.want == "connection refused" || tc.want == "no such file or directory"; retried != wantRetried {
				t.Errorf("got %v, want retried until ctx ended: %v", err, wantRetried)
			}
		})
	}
}

// TestStopOnError checks the default of ExecOptions: with stop_on_error
// on, a cell queued behind a failing one is aborted, and without it (the
// default) it runs. It sends both cells before waiting, so the second is
// queued in the kernel while the first fails.
func TestStopOnError(t *testing.T) {
	_, c := startKernel(t, Options{})
	for _, tc := range []struct {
		name        string
		stop        bool
		wantAborted bool
	}{
		{"default runs the next cell", false, false},
		{"stop_on_error aborts the next cell", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			first, err := c.Execute(ctx, "import time\ntime.sleep(0.2)\nraise ValueError('boom')", ExecOptions{StopOnError: tc.stop})
			if err != nil {
				t.Fatal(err)
			}
			second, err := c.Execute(ctx, "'ran'", ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out, err := first.Wait(ctx)
			if err != nil || out.Error == nil || out.Error.Ename != "ValueError" {
				t.Fatalf("first cell: got %+v, %v; want ValueError", out.Error, err)
			}
			out, err = second.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if out.Aborted != tc.wantAborted || (out.Status == StatusAborted) != tc.wantAborted {
				t.Errorf("second cell: got status %q aborted %v, want aborted %v", out.Status, out.Aborted, tc.wantAborted)
			}
		})
	}
}

// BenchmarkExecuteRoundTrip measures a warm `1+1` from execute_request to
// completion (execute_reply and status idle). The jupyter_client
// sub-benchmark is the baseline: Debian's jupyter_client
// BlockingKernelClient.execute_interactive, which waits for the same two
// messages, on the same kernel in the same run.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	k, c := startKernel(b, Options{})
	run(b, c, "1+1")

	b.Run("triad", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			ex, err := c.Execute(ctx, "1+1", ExecOptions{})
			if err != nil {
				b.Fatal(err)
			}
			out, err := ex.Wait(ctx)
			if err != nil || out.Result == nil {
				b.Fatalf("got %+v, %v", out, err)
			}
		}
	})
	// The baseline client runs as one long-lived process that runs n cells
	// per line it reads, so its start-up stays outside the timed loop.
	const script = `import sys
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient(connection_file=sys.argv[1])
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=30)
for _ in range(5):
    kc.execute_interactive("1+1", timeout=30, output_hook=lambda m: None)
print("ready", flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        kc.execute_interactive("1+1", timeout=30, output_hook=lambda m: None)
    print("done", flush=True)
kc.stop_channels()
`
	py := exec.CommandContext(b.Context(), python, "-c", script, k.connPath)
	stdin, err := py.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := py.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	py.Stderr = os.Stderr
	if err := py.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = py.Wait()
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		b.Fatalf("jupyter_client baseline did not start: %q %v", lines.Text(), lines.Err())
	}
	b.Run("jupyter_client", func(b *testing.B) {
		if _, err := fmt.Fprintln(stdin, b.N); err != nil {
			b.Fatal(err)
		}
		if !lines.Scan() || lines.Text() != "done" {
			b.Fatalf("jupyter_client baseline: got %q %v, want done", lines.Text(), lines.Err())
		}
	})
}

// TestStdioBarrier stands a real ipykernel in for a kernel that publishes
// a cell's line after the cell's idle, as Deno's does: the first cell
// leaves a thread that prints only once the barrier's code releases it, so
// its line comes under the barrier's parent, ahead of the token (both may
// share one stream message). The cell's output has the line, without the
// token; the barrier adds nothing to the execution count; and a barrier
// whose code raises completes the cell instead of holding it.
func TestStdioBarrier(t *testing.T) {
	_, c := startKernel(t, Options{StdioBarrier: func(token string) string {
		return "_release.set(); _late.join(); print(" + strconv.Quote(token) + ")"
	}})
	run := func(code string) Output {
		t.Helper()
		ex, err := c.Execute(context.Background(), code, ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out, err := ex.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !out.Complete {
			t.Fatalf("%q: not complete after Wait", code)
		}
		return out
	}
	first := run(`import threading
_release = threading.Event()
_late = threading.Thread(target=lambda: (_release.wait(), print("late", flush=True)))
_late.start()
print("early")`)
	if first.Stdout != "early\nlate\n" {
		t.Errorf("first cell: got stdout %q, want %q (the line its thread printed at the barrier)", first.Stdout, "early\nlate\n")
	}
	second := run(`print("next")`)
	if second.Stdout != "next\n" || strings.Contains(second.Stdout, "triad-barrier") {
		t.Errorf("second cell: got stdout %q, want %q", second.Stdout, "next\n")
	}
	if second.ExecutionCount != first.ExecutionCount+1 {
		t.Errorf("execution counts %d then %d: the barrier counted", first.ExecutionCount, second.ExecutionCount)
	}
	// The cell deletes what the barrier needs: the barrier raises
	// NameError, and the cell completes with its own output.
	if broken := run("del _release\nprint('gone')"); broken.Stdout != "gone\n" || broken.Status != StatusOK {
		t.Errorf("cell whose barrier raises: got %q, status %q", broken.Stdout, broken.Status)
	}
}
