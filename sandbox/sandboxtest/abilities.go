package sandboxtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/cmdfs"
)

// newContext starts a context of k, closed when the test ends.
func newContext(t *testing.T, cs sandbox.Contexts, cwd string) sandbox.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cs.NewContext(ctx, cwd)
	if err != nil {
		t.Fatalf("NewContext(%q): %v", cwd, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testContexts(t *testing.T, o Options) {
	k := start(t, o.New(t), sandbox.Spec{Owner: "contexts"})
	cs, is := k.(sandbox.Contexts)
	if is != o.Contexts {
		t.Fatalf("the kernel implements sandbox.Contexts: got %v, the backend claims %v", is, o.Contexts)
	}
	if !is {
		return
	}
	a := newContext(t, cs, "")
	b := newContext(t, cs, "sub/dir")

	// Each interpreter has its own variables.
	ok(t, k, "v = 'kernel'")
	ok(t, a, "v = 'a'")
	ok(t, b, "v = 'b'")
	for _, c := range []struct {
		name string
		k    sandbox.Kernel
		want string
	}{{"kernel", k, "'kernel'"}, {"a", a, "'a'"}, {"b", b, "'b'"}} {
		if got := value(t, ok(t, c.k, "v")); got != c.want {
			t.Errorf("v in %s: got %s, want %s", c.name, got, c.want)
		}
	}

	// b starts in its own directory, made for it, inside the working
	// directory they all share.
	ok(t, b, "open('made-by-b.txt', 'w').write('b')")
	if got := value(t, ok(t, a, "import os\nos.path.exists('sub/dir/made-by-b.txt')")); got != "True" {
		t.Errorf("a sees b's file at sub/dir/made-by-b.txt: got %s, want True", got)
	}
	if _, err := a.Files().Put(t.Context(), "from-host.txt", strings.NewReader("host")); err != nil {
		t.Fatal(err)
	}
	if got := value(t, ok(t, k, "open('from-host.txt').read()")); got != "'host'" {
		t.Errorf("the kernel reads a file put through a context's Files: got %s, want 'host'", got)
	}
	l, err := k.Files().Scan(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(l.Files, func(e sandbox.Entry) bool { return e.Path == "sub/dir/made-by-b.txt" }) {
		t.Errorf("the kernel's Files do not list sub/dir/made-by-b.txt: %+v", l.Files)
	}

	// A context runs cells while the kernel runs one: the kernel's cell
	// waits for a file that a's cell makes.
	done := make(chan outcome, 1)
	go func() {
		o := outcome{col: &sandbox.Collector{}}
		res, err := k.Execute(t.Context(), sandbox.Cell{Code: "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n'went'",
			Timeout: 2 * time.Minute, Output: o.col.Add})
		if err != nil {
			t.Errorf("the kernel's waiting cell: %v", err)
		}
		o.res = res
		done <- o
	}()
	ok(t, a, "open('go', 'w').close()")
	if w := <-done; w.res == nil || !w.res.OK || value(t, w) != "'went'" {
		t.Errorf("the kernel's cell waiting for a's file: got %v, want it to finish", w)
	}

	// Restarting a context drops its variables and keeps everyone else's.
	if err := a.Restart(t.Context()); err != nil {
		t.Fatalf("restart a: %v", err)
	}
	if got := value(t, ok(t, a, "str(globals().get('v'))")); got != "'None'" {
		t.Errorf("v in a after its restart: got %s, want 'None'", got)
	}
	if got := value(t, ok(t, b, "v")); got != "'b'" {
		t.Errorf("v in b after a's restart: got %s, want 'b'", got)
	}
	if got := value(t, ok(t, k, "v")); got != "'kernel'" {
		t.Errorf("v in the kernel after a's restart: got %s, want 'kernel'", got)
	}

	// Closing a context ends it alone.
	if err := b.Close(); err != nil {
		t.Fatalf("close b: %v", err)
	}
	if _, err := b.Execute(t.Context(), sandbox.Cell{Code: "1"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute on a closed context: got %v, want ErrClosed", err)
	}
	ok(t, a, "v = 'a2'")
	if got := value(t, ok(t, k, "v")); got != "'kernel'" {
		t.Errorf("v in the kernel after b closed: got %s, want 'kernel'", got)
	}

	// Restarting the kernel may end its contexts; a context that ended
	// says so (a death, never silent) and then works again.
	if err := k.Restart(t.Context()); err != nil {
		t.Fatalf("restart the kernel: %v", err)
	}
	after := execute(t, a, "str(globals().get('v'))", time.Minute)
	switch {
	case after.res.OK && value(t, after) == "'a2'":
	case !after.res.OK && after.res.Error != nil && after.res.Error.Kind == sandbox.KindKernelDied && after.res.Restarted:
		if got := value(t, ok(t, a, "str(globals().get('v'))")); got != "'None'" {
			t.Errorf("v in a after it came back: got %s, want 'None'", got)
		}
	default:
		t.Errorf("a's cell after the kernel restarted: got %s, want its state kept, or kernel_died with Restarted", after)
	}

	// Closing the kernel closes its contexts.
	if err := k.Close(); err != nil {
		t.Fatalf("close the kernel: %v", err)
	}
	if _, err := a.Execute(t.Context(), sandbox.Cell{Code: "1"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute on a context of a closed kernel: got %v, want ErrClosed", err)
	}
}

// ran is one Command: its result and what it printed.
type ran struct {
	res            *sandbox.CommandResult
	stdout, stderr strings.Builder
	events         int
}

func (r *ran) String() string {
	return fmt.Sprintf("%+v stdout=%.200q stderr=%.200q", r.res, r.stdout.String(), r.stderr.String())
}

// command runs cmd with ctx and fails the test if the call itself errs.
func command(t *testing.T, ctx context.Context, c sandbox.Commander, cmd sandbox.Command) *ran {
	t.Helper()
	r := &ran{}
	out := cmd.Output
	cmd.Output = func(e sandbox.Event) {
		r.events++
		switch e.Kind {
		case sandbox.EventStdout:
			r.stdout.WriteString(e.Text)
		case sandbox.EventStderr:
			r.stderr.WriteString(e.Text)
		}
		if out != nil {
			out(e)
		}
	}
	res, err := c.Command(ctx, cmd)
	if err != nil {
		t.Fatalf("Command(%q): %v", cmd.Args, err)
	}
	r.res = res
	return r
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

func testCommands(t *testing.T, o Options) {
	b := o.New(t)
	k := start(t, b, sandbox.Spec{Owner: "commands"})
	cm, is := k.(sandbox.Commander)
	if is != o.Commands {
		t.Fatalf("the kernel implements sandbox.Commander: got %v, the backend claims %v", is, o.Commands)
	}
	if !is {
		return
	}
	ctx := t.Context()
	ok(t, k, "x = 21")

	t.Run("ExitCodeAndOutput", func(t *testing.T) {
		r := command(t, ctx, cm, sandbox.Command{Args: sh("echo hi && echo oops >&2 && exit 3")})
		if r.res.ExitCode != 3 || r.res.Stopped != "" || r.stdout.String() != "hi\n" || r.stderr.String() != "oops\n" {
			t.Errorf("got %s, want exit code 3, stdout hi, stderr oops", r)
		}
		r = command(t, ctx, cm, sandbox.Command{Args: []string{"no-such-program"}})
		if r.res.ExitCode != 127 || !strings.Contains(r.stderr.String(), "no-such-program") {
			t.Errorf("a missing program: got %s, want exit code 127 and its name on stderr", r)
		}
	})

	t.Run("EnvDirAndFiles", func(t *testing.T) {
		if _, err := k.Files().Put(ctx, "sub/keep", strings.NewReader("")); err != nil {
			t.Fatal(err)
		}
		r := command(t, ctx, cm, sandbox.Command{Args: sh(`echo "$GREETING" > greeting.txt; pwd`), Env: map[string]string{"GREETING": "hello"}, Dir: "sub"})
		if r.res.ExitCode != 0 || !strings.HasSuffix(r.stdout.String(), "/sub\n") {
			t.Errorf("got %s, want exit code 0 and a working directory ending in /sub", r)
		}
		if got := value(t, ok(t, k, "open('sub/greeting.txt').read()")); got != `'hello\n'` {
			t.Errorf("the cell reads the command's file: got %s, want 'hello\\n'", got)
		}
		for _, bad := range []sandbox.Command{{}, {Args: []string{"true"}, Dir: "../x"}, {Args: []string{"true"}, Env: map[string]string{"A=B": "c"}}} {
			if _, err := cm.Command(ctx, bad); err == nil {
				t.Errorf("Command(%+v): got no error, want one", bad)
			}
		}
	})

	t.Run("Streaming", func(t *testing.T) {
		// Each line is printed only once the host has seen the one before
		// (as in Streaming for cells): without streaming the command would
		// wait until the test's deadline.
		acks := make(chan int, 3)
		go func() {
			for i := range acks {
				if _, err := k.Files().Put(context.Background(), fmt.Sprintf("cmdack%d", i), strings.NewReader("")); err != nil {
					t.Errorf("put cmdack%d: %v", i, err)
				}
			}
		}()
		defer close(acks)
		var seen strings.Builder
		var lines []string
		next := 0
		r := command(t, ctx, cm, sandbox.Command{Args: sh(`for i in 0 1 2; do echo $i; while [ ! -e cmdack$i ]; do sleep 0.05; done; done`),
			Output: func(e sandbox.Event) {
				if e.Kind != sandbox.EventStdout {
					return
				}
				lines = append(lines, e.Text)
				seen.WriteString(e.Text)
				for next < 3 && strings.Contains(seen.String(), fmt.Sprintf("%d\n", next)) {
					acks <- next
					next++
				}
			}})
		if r.res.ExitCode != 0 {
			t.Fatalf("got %s after %d acknowledged lines, want exit code 0", r, next)
		}
		if want := []string{"0\n", "1\n", "2\n"}; !slices.Equal(lines, want) {
			t.Errorf("stdout events: got %q, want one per line %q", lines, want)
		}
	})

	t.Run("RunsBesideACell", func(t *testing.T) {
		done := make(chan outcome, 1)
		go func() {
			o := outcome{col: &sandbox.Collector{}}
			res, err := k.Execute(ctx, sandbox.Cell{Code: "import os, time\nwhile not os.path.exists('cmd-went'):\n    time.sleep(0.05)\nx",
				Timeout: 2 * time.Minute, Output: o.col.Add})
			if err != nil {
				t.Errorf("the waiting cell: %v", err)
			}
			o.res = res
			done <- o
		}()
		// The cell is running (or about to): the command does not wait
		// for it.
		r := command(t, ctx, cm, sandbox.Command{Args: sh("touch cmd-went")})
		if r.res.ExitCode != 0 {
			t.Errorf("touch: got %s", r)
		}
		if w := <-done; w.res == nil || !w.res.OK || value(t, w) != "21" {
			t.Errorf("the cell waiting for the command's file: got %v, want x = 21", w)
		}
	})

	t.Run("Kill", func(t *testing.T) {
		// Cancelled once it has printed: the command and the process it
		// left in the background are killed, and the call returns.
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		r := command(t, cctx, cm, sandbox.Command{Args: sh("sleep 600 & echo started; wait"), Output: func(e sandbox.Event) {
			if e.Kind == sandbox.EventStdout {
				cancel()
			}
		}})
		if r.res.Stopped != sandbox.KindInterrupted || r.res.ExitCode == 0 {
			t.Errorf("got %s, want Stopped interrupted and a non-zero exit code", r)
		}
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		defer dcancel()
		r = command(t, dctx, cm, sandbox.Command{Args: sh("sleep 600")})
		if r.res.Stopped != sandbox.KindTimeout {
			t.Errorf("past its deadline: got %s, want Stopped timeout", r)
		}
		// A process the command leaves behind when it ends is killed too,
		// or this call would wait for it.
		r = command(t, ctx, cm, sandbox.Command{Args: sh("sleep 600 & echo bye")})
		if r.res.ExitCode != 0 || r.stdout.String() != "bye\n" {
			t.Errorf("got %s, want exit code 0 and bye", r)
		}
		if got := value(t, ok(t, k, "x")); got != "21" {
			t.Errorf("x after the commands: got %s, want 21 (commands leave the kernel alone)", got)
		}
	})

	t.Run("NoNetwork", func(t *testing.T) {
		r := command(t, ctx, cm, sandbox.Command{Args: []string{"python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=5)"}})
		if r.res.ExitCode == 0 {
			t.Errorf("a connection from a command: got %s, want it refused (the jail has no network)", r)
		}
	})

	t.Run("FilesOutsideWorkdir", func(t *testing.T) { testCommandFS(t, ctx, cm) })

	t.Run("OutputLimit", func(t *testing.T) {
		const limit = 1 << 20
		small := start(t, b, sandbox.Spec{Owner: "commands-limit", Limits: sandbox.Limits{OutputBytes: limit}})
		var n int64
		r := command(t, ctx, small.(sandbox.Commander), sandbox.Command{Args: []string{"yes"}, Output: func(e sandbox.Event) { n += e.Size() }})
		if r.res.Stopped != sandbox.KindOutputLimit || n > limit || n == 0 {
			t.Errorf("yes: got %+v after %d bytes, want Stopped output_limit within %d bytes", r.res, n, limit)
		}
	})
}

// testCommandFS checks cmdfs, the sandbox's own filesystem outside the
// run's files, on a backend's commands: bytes round-trip, a command sees
// what it wrote, and the errors a caller maps (missing, read-only root,
// the working directory itself and a symlink into it).
func testCommandFS(t *testing.T, ctx context.Context, cm sandbox.Commander) {
	wd := strings.TrimSpace(command(t, ctx, cm, sandbox.Command{Args: []string{"pwd"}}).stdout.String())
	if !strings.HasPrefix(wd, "/") {
		t.Fatalf("pwd: got %q, want an absolute working directory", wd)
	}
	f := cmdfs.FS{K: cm, Workdir: wd}
	dir := fmt.Sprintf("/tmp/cmdfs-%d", time.Now().UnixNano())
	data := make([]byte, 200<<10) // more than one stdin chunk and one base64 line
	for i := range data {
		data[i] = byte(i * 7)
	}
	e, err := f.Write(ctx, dir+"/a/b.bin", bytes.NewReader(data))
	if err != nil || e.Type != cmdfs.File || e.Size != int64(len(data)) || e.Path != dir+"/a/b.bin" {
		t.Fatalf("Write: got %+v, %v; want a file of %d bytes", e, err, len(data))
	}
	got, err := f.Read(ctx, dir+"/a/b.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("Read: got %d bytes (equal %v), %v; want the %d bytes written", len(got), bytes.Equal(got, data), err, len(data))
	}
	sum := sha256.Sum256(data)
	r := command(t, ctx, cm, sandbox.Command{Args: []string{"sha256sum", dir + "/a/b.bin"}})
	if !strings.HasPrefix(r.stdout.String(), hex.EncodeToString(sum[:])) {
		t.Errorf("a command's sha256sum of the written file: got %s, want %x", r, sum)
	}
	if e, err := f.Stat(ctx, dir+"/a"); err != nil || e.Type != cmdfs.Dir {
		t.Errorf("Stat(dir): got %+v, %v; want a directory", e, err)
	}
	if e, err := f.MakeDir(ctx, dir+"/a"); err != nil || e.Made {
		t.Errorf("MakeDir(existing): got %+v, %v; want it there, not made", e, err)
	}
	if e, err := f.MakeDir(ctx, dir+"/c/d"); err != nil || !e.Made || e.Type != cmdfs.Dir {
		t.Errorf("MakeDir(new): got %+v, %v; want it made", e, err)
	}
	es, err := f.List(ctx, dir, 2)
	var names []string
	for _, e := range es {
		names = append(names, strings.TrimPrefix(e.Path, dir+"/")+":"+string(e.Type))
	}
	if want := []string{"a:dir", "a/b.bin:file", "c:dir", "c/d:dir"}; err != nil || !slices.Equal(names, want) {
		t.Errorf("List(depth 2): got %v, %v; want %v", names, err, want)
	}
	if e, err := f.Rename(ctx, dir+"/a/b.bin", dir+"/c/b.bin"); err != nil || e.Size != int64(len(data)) {
		t.Errorf("Rename: got %+v, %v", e, err)
	}
	if _, err := f.Read(ctx, dir+"/a/b.bin"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read(renamed away): got %v, want fs.ErrNotExist", err)
	}
	command(t, ctx, cm, sandbox.Command{Args: []string{"ln", "-s", wd, dir + "/work"}})
	for _, p := range []string{wd + "/x.txt", dir + "/work/x.txt", "/etc/triad-cmdfs.txt"} {
		if _, err := f.Write(ctx, p, strings.NewReader("x")); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("Write(%s): got %v, want fs.ErrPermission (the run's files, or the read-only root)", p, err)
		}
	}
	if err := f.Remove(ctx, dir); err != nil {
		t.Errorf("Remove(tree): %v", err)
	}
	if _, err := f.Stat(ctx, dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(removed): got %v, want fs.ErrNotExist", err)
	}
	if err := f.Remove(ctx, dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Remove(missing): got %v, want fs.ErrNotExist", err)
	}
}
