package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	kubeletexec "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/supervisor"
)

// hostExec is the kubelet's side of an exec session with the container
// replaced by this host: it runs the command as a process here, its stdin,
// stdout and stderr the session's streams, as a container runtime does.
type hostExec struct{}

func (hostExec) ExecInContainer(ctx context.Context, _ string, _ types.UID, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	c.Stdout, c.Stderr = out, errw
	// As a runtime does, stdin is copied until the stream ends but not
	// waited for: the exec ends when its process does.
	stdin, err := c.StdinPipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(stdin, in)
		_ = stdin.Close()
	}()
	err = c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

// sessionServer serves exec sessions with the kubelet's own streaming
// code (SPDY, the protocol the kubelet speaks to the API server) over
// hostExec, and returns an executor that runs argv through it.
func sessionServer(t *testing.T) func(argv []string) remotecommand.Executor {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts, err := kubeletexec.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		kubeletexec.ServeExec(w, r, hostExec{}, "pod", "", kernelContainer, r.URL.Query()[corev1.ExecCommandParam], opts,
			time.Hour, time.Minute, remotecommandconsts.SupportedStreamingProtocols)
	}))
	t.Cleanup(srv.Close)
	return func(argv []string) remotecommand.Executor {
		u, err := url.Parse(srv.URL + "/exec")
		if err != nil {
			t.Fatal(err)
		}
		q := url.Values{corev1.ExecStdinParam: {"1"}, corev1.ExecStdoutParam: {"1"}, corev1.ExecStderrParam: {"1"}, corev1.ExecCommandParam: argv}
		u.RawQuery = q.Encode()
		ex, err := remotecommand.NewSPDYExecutor(&rest.Config{Host: srv.URL}, "POST", u)
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
}

// runSession over a real exec stream (client-go's executor against the
// kubelet's streaming server, with this host for the container): output
// kept apart and whole, the pid, control ops, exit statuses from the
// session's status stream, and a stop that reaches the supervisor as the
// end of its stdin, which kills the command and what it started. The
// grace is far past the test's waits, so a stop that only the cut ended
// would show as a hang here, not pass.
func TestSessionOverExecStream(t *testing.T) {
	executor := sessionServer(t)
	dir := t.TempDir()
	set := sessionSettings{Grace: 10 * time.Minute, Closing: make(chan struct{})}
	type got struct {
		res    *sandbox.CommandResult
		err    error
		stdout string
		stderr string
	}
	start := func(ctx context.Context, cmd sandbox.Command) (<-chan got, chan string) {
		p, err := supervisor.Prepare(dir, cmd)
		if err != nil {
			t.Fatal(err)
		}
		ex := executor(p.Argv(cmd.Args))
		out := make(chan string, 1024)
		done := make(chan got, 1)
		go func() {
			var g got
			var stdout, stderr strings.Builder
			cmd.Output = func(e sandbox.Event) {
				if e.Kind == sandbox.EventStdout {
					stdout.WriteString(e.Text)
					out <- e.Text
				} else {
					stderr.WriteString(e.Text)
				}
			}
			g.res, g.err = runSession(ctx, ex, cmd, set)
			if ctl := cmd.Control; ctl != nil {
				ctl.Ended()
			}
			g.stdout, g.stderr = stdout.String(), stderr.String()
			done <- g
		}()
		return done, out
	}
	until := func(t *testing.T, done <-chan got, out chan string, want string) string {
		t.Helper()
		var seen strings.Builder
		for !strings.Contains(seen.String(), want) {
			select {
			case o := <-out:
				seen.WriteString(o)
			case g := <-done:
				t.Fatalf("the command ended before printing %q: %+v, %v, stdout %q, stderr %q", want, g.res, g.err, g.stdout, g.stderr)
			}
		}
		return seen.String()
	}

	t.Run("ExitCodeAndOutput", func(t *testing.T) {
		done, _ := start(t.Context(), sandbox.Command{Args: []string{"/bin/sh", "-c", "echo hi; echo oops >&2; exit 3"}})
		g := <-done
		if g.err != nil || g.res.ExitCode != 3 || g.res.Stopped != "" || g.stdout != "hi\n" || g.stderr != "oops\n" {
			t.Errorf("got %+v, %v, stdout %q, stderr %q; want exit 3, hi, oops", g.res, g.err, g.stdout, g.stderr)
		}
		done, _ = start(t.Context(), sandbox.Command{Args: []string{"true"}})
		if g := <-done; g.err != nil || g.res.ExitCode != 0 {
			t.Errorf("true: got %+v, %v; want exit 0", g.res, g.err)
		}
	})

	t.Run("Control", func(t *testing.T) {
		ctl := sandbox.NewCommandControl()
		done, out := start(t.Context(), sandbox.Command{Args: []string{"/bin/sh", "-c", "echo $$; cat"}, Stdin: true, Control: ctl})
		pid, ok := ctl.Pid(t.Context())
		if !ok {
			t.Fatalf("no pid: %+v", <-done)
		}
		if got := until(t, done, out, "\n"); got != fmt.Sprintf("%d\n", pid) {
			t.Errorf("the command's $$: got %q, want the reported pid %d", got, pid)
		}
		for _, op := range []sandbox.ControlOp{{Data: []byte("hello ")}, {Data: []byte("world\n")}, {Close: true}} {
			if err := ctl.Send(op); err != nil {
				t.Fatalf("Send(%+v): %v", op, err)
			}
		}
		g := <-done
		if g.err != nil || g.res.ExitCode != 0 || g.stdout != fmt.Sprintf("%d\nhello world\n", pid) {
			t.Errorf("got %+v, %v, stdout %q; want exit 0 and hello world", g.res, g.err, g.stdout)
		}
		if err := ctl.Send(sandbox.ControlOp{Data: []byte("late")}); !errors.Is(err, sandbox.ErrCommandEnded) {
			t.Errorf("Send after the end: got %v, want ErrCommandEnded", err)
		}
	})

	t.Run("Kill", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done, out := start(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", `sleep 600 & echo "bg $!"; wait`}})
		var bg int
		if line := until(t, done, out, "\n"); func() error { _, err := fmt.Sscanf(line, "bg %d", &bg); return err }() != nil {
			t.Fatalf("the background pid: got %q", line)
		}
		cancel()
		g := <-done
		if g.err != nil || g.res.Stopped != sandbox.KindInterrupted || g.res.ExitCode != 128+9 {
			t.Fatalf("cancelled: got %+v, %v; want Stopped interrupted and exit 137 from the session's status", g.res, g.err)
		}
		// The background sleep was in the command's session: killed
		// with it (a zombie until this host's init reaps it). The
		// SIGKILL is sent before the answer; the kernel finishes it
		// asynchronously (state R with the signal pending), so wait for
		// it to land, bounded far beyond any load.
		var st []byte
		for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			var err error
			if st, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", bg)); err != nil || strings.Contains(string(st), ") Z ") {
				break
			}
			if time.Now().After(end) {
				t.Errorf("the background sleep %d is still running: %s", bg, st)
				break
			}
		}
	})

	t.Run("OutputLimit", func(t *testing.T) {
		s := set
		s.OutputBytes = 1 << 16
		p, err := supervisor.Prepare(dir, sandbox.Command{Args: []string{"yes"}})
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		res, err := runSession(t.Context(), executor(p.Argv([]string{"yes"})), sandbox.Command{Args: []string{"yes"}, Output: func(e sandbox.Event) { n += e.Size() }}, s)
		if err != nil || res.Stopped != sandbox.KindOutputLimit || n == 0 || n > s.OutputBytes {
			t.Errorf("yes: got %+v, %v after %d bytes; want Stopped output_limit within %d bytes", res, err, n, s.OutputBytes)
		}
	})
}
