package supervisor

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// collect returns a Meter that keeps stdout and stderr apart.
func collect(out, errs *bytes.Buffer) *emit.Meter {
	return emit.New(0, func(e sandbox.Event) {
		if e.Kind == sandbox.EventStdout {
			out.WriteString(e.Text)
		} else {
			errs.WriteString(e.Text)
		}
	})
}

// A command's stream as docker sends it when the supervisor's pid line and
// the command's first stderr share a frame and stdout comes after: every
// byte of both streams reaches the events. (sandbox/docker's stderr writer
// once answered a short write for that frame, and stdcopy dropped the
// rest: a quick command's stdout was lost, 4 of 300 at four at once.)
func TestWriterTakesWholeFrames(t *testing.T) {
	var stream bytes.Buffer
	errw := stdcopy.NewStdWriter(&stream, stdcopy.Stderr)
	outw := stdcopy.NewStdWriter(&stream, stdcopy.Stdout)
	for _, f := range []struct {
		w io.Writer
		s string
	}{{errw, PidMarker + "536\noops\n"}, {outw, "hi\n"}, {errw, "more\n"}} {
		if _, err := f.w.Write([]byte(f.s)); err != nil {
			t.Fatal(err)
		}
	}
	var out, errs bytes.Buffer
	pid := -1
	m := collect(&out, &errs)
	stdout := NewStdout(m, func() {})
	stderr := NewStderr(m, func() {}, func(p int) { pid = p })
	if _, err := stdcopy.StdCopy(stdout, stderr, &stream); err != nil {
		t.Fatalf("StdCopy: %v", err)
	}
	stdout.Flush()
	stderr.Flush()
	if pid != 536 || out.String() != "hi\n" || errs.String() != "oops\nmore\n" {
		t.Errorf("got pid %d, stdout %q, stderr %q; want 536, \"hi\\n\", \"oops\\nmore\\n\"", pid, out.String(), errs.String())
	}
}

// However the stream is cut into chunks (a pods/exec session delivers
// whatever its frames hold), the pid is reported once and every other
// byte arrives, in whole characters.
func TestWriterChunks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		pid    int
		stderr string
	}{
		{"one chunk", []string{PidMarker + "7\nerr é\n"}, 7, "err é\n"},
		{"byte by byte", strings.Split(PidMarker+"4242\nerr é\n", ""), 4242, "err é\n"},
		{"split character", []string{PidMarker + "9\n\xc3", "\xa9!"}, 9, "é!"},
		{"no marker", []string{"plain stderr that is longer than sixty-four bytes, so not a pid line\n"}, 0, "plain stderr that is longer than sixty-four bytes, so not a pid line\n"},
		{"ends before the line", []string{PidMarker + "12"}, 0, ""},
		{"nothing", nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errs bytes.Buffer
			var pids []int
			w := NewStderr(collect(&out, &errs), func() {}, func(p int) { pids = append(pids, p) })
			for _, c := range tc.chunks {
				if n, err := w.Write([]byte(c)); n != len(c) || err != nil {
					t.Fatalf("Write(%q): got %d, %v; want %d, nil", c, n, err, len(c))
				}
			}
			w.Flush()
			if len(pids) != 1 || pids[0] != tc.pid || errs.String() != tc.stderr {
				t.Errorf("got pids %v, stderr %q; want [%d], %q", pids, errs.String(), tc.pid, tc.stderr)
			}
		})
	}
}

// Past the meter's limit the writer calls over and delivers nothing more.
func TestWriterOverLimit(t *testing.T) {
	var n int64
	overs := 0
	w := NewStdout(emit.New(10, func(e sandbox.Event) { n += e.Size() }), func() { overs++ })
	for range 3 {
		if _, err := w.Write([]byte("0123456")); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if n != 10 || overs != 1 {
		t.Errorf("got %d bytes delivered and %d overs, want 10 and 1", n, overs)
	}
}

func TestPrepare(t *testing.T) {
	p, err := Prepare("/w", sandbox.Command{Args: []string{"ls"}, Dir: "a/b", Env: map[string]string{"B": "2", "A": "1"}, Pty: &sandbox.TermSize{Rows: 0, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Dir != "/w/a/b" || strings.Join(p.Env, " ") != "A=1 B=2" || p.Mode != "p1x80" {
		t.Errorf("got %+v, want dir /w/a/b, env A=1 B=2, mode p1x80", p)
	}
	if p, _ := Prepare("/w", sandbox.Command{Args: []string{"ls"}, Stdin: true}); p.Dir != "/w" || p.Mode != "i" {
		t.Errorf("got %+v, want dir /w, mode i", p)
	}
	for _, bad := range []sandbox.Command{{}, {Args: []string{""}}, {Args: []string{"ls"}, Dir: "../x"}, {Args: []string{"ls"}, Env: map[string]string{"A=B": "c"}},
		{Args: []string{"ls"}, Env: map[string]string{"": "c"}}, {Args: []string{"ls"}, Env: map[string]string{"A": "c\x00"}}} {
		if _, err := Prepare("/w", bad); err == nil {
			t.Errorf("Prepare(%+v): got no error, want one", bad)
		}
	}
}

// supervise runs the supervisor on this host as a backend runs it in a
// sandbox: the test writes its stdin and reads its stdout; its stderr
// goes through the stderr Writer.
type supervised struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	pid    chan int
	errs   bytes.Buffer
}

func supervise(t *testing.T, p Prepared, args ...string) *supervised {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3")
	}
	argv := p.Argv(args)
	s := &supervised{cmd: exec.Command(argv[0], argv[1:]...), pid: make(chan int, 1)}
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.stdout = bufio.NewReader(out)
	var discard bytes.Buffer
	w := NewStderr(collect(&discard, &s.errs), func() {}, func(pid int) { s.pid <- pid })
	s.cmd.Stderr = w
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.stdin.Close()
		_ = s.cmd.Wait()
	})
	return s
}

func (s *supervised) line(t *testing.T) string {
	t.Helper()
	l, err := s.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("read stdout: %v (stderr %q)", err, s.errs.String())
	}
	return l
}

func (s *supervised) send(t *testing.T, op sandbox.ControlOp) {
	t.Helper()
	b, err := EncodeOp(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.stdin.Write(b); err != nil {
		t.Fatal(err)
	}
}

// The supervisor on a real process: the pid it reports is the command's
// own, its ops reach the command's stdin and process group, and the end of
// its stdin kills the command with what it left in the background.
func TestScript(t *testing.T) {
	dir := t.TempDir()
	p, err := Prepare(dir, sandbox.Command{Args: []string{"x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("stdin", func(t *testing.T) {
		s := supervise(t, p, "/bin/sh", "-c", `echo $$; pwd; cat; echo done`)
		if got, want := s.line(t), strconv.Itoa(<-s.pid)+"\n"; got != want {
			t.Errorf("the command's $$: got %q, want the reported pid %q", got, want)
		}
		if got := s.line(t); got != dir+"\n" {
			t.Errorf("pwd: got %q, want %s", got, dir)
		}
		s.send(t, sandbox.ControlOp{Data: []byte("hello\n")})
		if got := s.line(t); got != "hello\n" {
			t.Errorf("cat: got %q, want hello", got)
		}
		s.send(t, sandbox.ControlOp{Close: true})
		if got := s.line(t); got != "done\n" {
			t.Errorf("after close: got %q, want done", got)
		}
		if err := s.cmd.Wait(); err != nil {
			t.Errorf("exit: got %v, want 0", err)
		}
	})

	t.Run("signal", func(t *testing.T) {
		s := supervise(t, p, "/bin/sh", "-c", `trap "echo term; exit 7" TERM; echo ready; while :; do sleep 0.05; done`)
		<-s.pid
		s.line(t)
		s.send(t, sandbox.ControlOp{Signal: 15})
		if got := s.line(t); got != "term\n" {
			t.Errorf("after SIGTERM: got %q, want term", got)
		}
		var ee *exec.ExitError
		if err := s.cmd.Wait(); err == nil || !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Errorf("exit: got %v, want code 7", err)
		}
	})

	t.Run("stdin EOF kills the session", func(t *testing.T) {
		s := supervise(t, p, "/bin/sh", "-c", `sleep 600 & echo started; wait`)
		<-s.pid
		s.line(t)
		_ = s.stdin.Close()
		// The background sleep holds the stdout pipe open: the stream
		// ends only if it was killed too.
		if rest, err := io.ReadAll(s.stdout); err != nil || len(rest) != 0 {
			t.Errorf("stdout after the kill: got %q, %v; want it ended", rest, err)
		}
		var ee *exec.ExitError
		if err := s.cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 128+9 {
			t.Errorf("exit: got %v, want code 137 (SIGKILL)", err)
		}
	})

	t.Run("missing program and directory", func(t *testing.T) {
		s := supervise(t, p, "no-such-program-here")
		if pid := <-s.pid; pid <= 0 {
			t.Errorf("pid: got %d, want the wrapper's", pid)
		}
		var ee *exec.ExitError
		if err := s.cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 127 {
			t.Errorf("exit: got %v, want 127", err)
		}
		q := p
		q.Dir = dir + "/missing"
		s = supervise(t, q, "true")
		if pid := <-s.pid; pid != 0 {
			t.Errorf("pid: got %d, want 0 (never started)", pid)
		}
		if err := s.cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(s.errs.String(), "cannot enter") {
			t.Errorf("exit: got %v, stderr %q; want 1 and cannot enter", err, s.errs.String())
		}
	})
}
