package kube_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
)

// started is a command running in the background of a test, with its
// control.
type started struct {
	ctl  *sandbox.CommandControl
	out  chan string // every piece of stdout (and a terminal's output)
	done chan ended
}

type ended struct {
	res    *sandbox.CommandResult
	err    error
	stdout string
}

// startCommand runs cmd with a control in the background and waits for its
// pid.
func startCommand(t *testing.T, ctx context.Context, cm sandbox.Commander, cmd sandbox.Command) (*started, int) {
	t.Helper()
	s := &started{ctl: sandbox.NewCommandControl(), out: make(chan string, 1024), done: make(chan ended, 1)}
	cmd.Control = s.ctl
	go func() {
		var stdout strings.Builder
		cmd.Output = func(e sandbox.Event) {
			if e.Kind == sandbox.EventStdout {
				stdout.WriteString(e.Text)
				s.out <- e.Text
			}
		}
		res, err := cm.Command(ctx, cmd)
		s.done <- ended{res, err, stdout.String()}
	}()
	pid, ok := s.ctl.Pid(ctx)
	if !ok {
		e := <-s.done
		t.Fatalf("%q did not start: %+v, %v, stdout %q", cmd.Args, e.res, e.err, e.stdout)
	}
	return s, pid
}

// until reads the command's output until it holds want.
func (s *started) until(t *testing.T, want string) string {
	t.Helper()
	var seen strings.Builder
	for !strings.Contains(seen.String(), want) {
		select {
		case o := <-s.out:
			seen.WriteString(o)
		case e := <-s.done:
			s.done <- e
			t.Fatalf("the command ended before printing %q: %+v, %v, output %q", want, e.res, e.err, seen.String())
		}
	}
	return seen.String()
}

func (s *started) send(t *testing.T, op sandbox.ControlOp) {
	t.Helper()
	if err := s.ctl.Send(op); err != nil {
		t.Fatalf("Send(%+v): %v", op, err)
	}
}

// TestCommandControl: a command in a kernel pod, run through pods/exec
// under the shared supervisor, takes stdin and a terminal, is signalled
// and killed through its control, and reports its real pid in the pod:
// another command finds it in /proc. Its jail is the kernel's: the same
// uid and the same process limit.
func TestCommandControl(t *testing.T) {
	c := needCluster(t)
	// A grace far past the test's waits: a command is stopped by the
	// end of its session's stdin (the supervisor then kills it), never by
	// the host cutting the session after the grace. Were the stdin's end
	// lost on the way through the API server and the kubelet, Kill below
	// would wait out these ten minutes instead of answering.
	b := c.newBackend(t, kube.Config{InterruptGrace: 10 * time.Minute})
	const pids = 300
	k := startKernel(t, b, sandbox.Spec{Owner: "command-control", Limits: sandbox.Limits{Pids: pids}})
	cm, ok := k.(sandbox.Commander)
	if !ok {
		t.Fatal("the kube kernel does not implement sandbox.Commander")
	}
	ctx := t.Context()
	// quick runs a short command and returns its stdout.
	quick := func(t *testing.T, args ...string) (string, int) {
		t.Helper()
		var out strings.Builder
		res, err := cm.Command(ctx, sandbox.Command{Args: args, Output: func(e sandbox.Event) {
			if e.Kind == sandbox.EventStdout {
				out.WriteString(e.Text)
			}
		}})
		if err != nil {
			t.Fatalf("Command(%q): %v", args, err)
		}
		return out.String(), res.ExitCode
	}

	// alive reports whether pid runs in the pod; a zombie (the
	// background sleep, reparented to the pod's pause process, between
	// its death and its reaping) does not.
	alive := func(pid int) bool {
		out, _ := quick(t, "/bin/sh", "-c", fmt.Sprintf("cut -d' ' -f3 /proc/%d/stat 2>/dev/null", pid))
		return out != "" && out != "Z\n"
	}

	t.Run("Jail", func(t *testing.T) {
		uid := value(t, k, "import os\nos.getuid()")
		out, code := quick(t, "/bin/sh", "-c", "id -u; ulimit -p")
		if want := uid + "\n" + strconv.Itoa(pids) + "\n"; code != 0 || out != want {
			t.Errorf("uid and process limit of a command: got %q (exit %d), want %q (the kernel's uid, the kernel's limit)", out, code, want)
		}
	})

	t.Run("StdinAndPid", func(t *testing.T) {
		s, pid := startCommand(t, ctx, cm, sandbox.Command{Args: []string{"cat"}, Stdin: true})
		s.send(t, sandbox.ControlOp{Data: []byte("hello\n")})
		s.until(t, "hello\n")
		// The pid is the command's own in the pod (cat, which answered):
		// another command sees it.
		if out, code := quick(t, "/bin/sh", "-c", fmt.Sprintf(`tr '\0' ' ' < /proc/%d/cmdline`, pid)); code != 0 || out != "cat " {
			t.Errorf("/proc/%d/cmdline: got %q (exit %d), want \"cat \"", pid, out, code)
		}
		s.send(t, sandbox.ControlOp{Data: []byte("world")})
		s.send(t, sandbox.ControlOp{Close: true})
		e := <-s.done
		if e.err != nil || e.res.ExitCode != 0 || e.res.Stopped != "" || e.stdout != "hello\nworld" {
			t.Fatalf("cat: got %+v, %v, stdout %q; want exit 0 and hello\\nworld", e.res, e.err, e.stdout)
		}
		if err := s.ctl.Send(sandbox.ControlOp{Data: []byte("late")}); !errors.Is(err, sandbox.ErrCommandEnded) {
			t.Errorf("Send after the end: got %v, want ErrCommandEnded", err)
		}
		if st := s.ctl.Stats(); st.Writes != 2 || st.Bytes != 11 || !st.Closed {
			t.Errorf("input stats: got %+v, want 2 writes of 11 bytes and closed", st)
		}
	})

	t.Run("Pty", func(t *testing.T) {
		s, _ := startCommand(t, ctx, cm, sandbox.Command{Args: []string{"/bin/sh", "-c", `tty; stty size; read line; stty size; echo "got $line"`},
			Pty: &sandbox.TermSize{Rows: 24, Cols: 80}})
		if out := s.until(t, "24 80"); !strings.Contains(out, "/dev/pts/") {
			t.Errorf("tty: got %q, want a /dev/pts/ terminal", out)
		}
		s.send(t, sandbox.ControlOp{Size: &sandbox.TermSize{Rows: 30, Cols: 100}})
		s.send(t, sandbox.ControlOp{Data: []byte("typed\n")})
		e := <-s.done
		if e.err != nil || e.res.ExitCode != 0 || !strings.Contains(e.stdout, "30 100") || !strings.Contains(e.stdout, "got typed") {
			t.Fatalf("the terminal: got %+v, %v, output %q; want exit 0, 30 100 after the resize and got typed", e.res, e.err, e.stdout)
		}
	})

	t.Run("Signal", func(t *testing.T) {
		s, _ := startCommand(t, ctx, cm, sandbox.Command{Args: []string{"/bin/sh", "-c", `trap "echo term; exit 7" TERM; echo ready; while :; do sleep 0.05; done`}})
		s.until(t, "ready\n")
		s.send(t, sandbox.ControlOp{Signal: 15})
		e := <-s.done
		if e.err != nil || e.res.ExitCode != 7 || e.res.Stopped != "" || e.stdout != "ready\nterm\n" {
			t.Fatalf("after SIGTERM: got %+v, %v, stdout %q; want exit 7 and term", e.res, e.err, e.stdout)
		}
		s, pid := startCommand(t, ctx, cm, sandbox.Command{Args: []string{"sleep", "600"}})
		s.send(t, sandbox.ControlOp{Signal: 9})
		if e := <-s.done; e.err != nil || e.res.ExitCode != 128+9 || e.res.Stopped != "" {
			t.Fatalf("after SIGKILL: got %+v, %v; want exit 137, not stopped by the host", e.res, e.err)
		}
		if alive(pid) {
			t.Errorf("pid %d: the killed command is still there", pid)
		}
	})

	t.Run("Kill", func(t *testing.T) {
		// Cancelled: the session's stdin ends, and the supervisor kills
		// the command and what it started in the background.
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, pid := startCommand(t, cctx, cm, sandbox.Command{Args: []string{"/bin/sh", "-c", `sleep 600 & echo "bg $!"; wait`}})
		out := s.until(t, "\n")
		var bg int
		if _, err := fmt.Sscanf(out, "bg %d", &bg); err != nil {
			t.Fatalf("the background pid: %q: %v", out, err)
		}
		cancel()
		e := <-s.done
		if e.err != nil || e.res.Stopped != sandbox.KindInterrupted || e.res.ExitCode != 128+9 {
			t.Fatalf("cancelled: got %+v, %v; want Stopped interrupted, exit 137", e.res, e.err)
		}
		for _, p := range []int{pid, bg} {
			if alive(p) {
				t.Errorf("pid %d: still there after the kill", p)
			}
		}
		if err := s.ctl.Send(sandbox.ControlOp{Data: []byte("x")}); !errors.Is(err, sandbox.ErrCommandEnded) {
			t.Errorf("Send after the kill: got %v, want ErrCommandEnded", err)
		}
		// The kernel is untouched.
		if got := value(t, k, "6 * 7"); got != "42" {
			t.Errorf("a cell after the kill: got %s, want 42", got)
		}
	})
}
