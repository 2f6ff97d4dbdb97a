package jupyter

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/testenv"
)

// python is Debian's interpreter, which has python3-ipykernel; the python3
// first on PATH may be another one without it.
const python = "/usr/bin/python3"

// kernel is a real ipykernel process started for one test.
type kernel struct {
	info     ConnInfo
	connPath string // conn.json, as ipykernel rewrote it after binding
	cmd      *exec.Cmd
	exited   chan struct{}   // closed when the process has been reaped
	output   *testenv.Buffer // the kernel's own stdout and stderr, for failures
}

// requireIPyKernel stops the test when Debian's ipykernel is not installed.
func requireIPyKernel(t testing.TB) {
	t.Helper()
	if err := exec.Command(python, "-c", "import ipykernel, jupyter_client").Run(); err != nil {
		testenv.Missing(t, "Debian's python3-ipykernel ("+python+" -m ipykernel)")
	}
}

// startKernel launches ipykernel on ipc sockets in a fresh short directory
// and returns it with a client that is ready. The client dials through a
// symlink to that directory, so the prefix it dials differs from the ip in
// the connection file exactly as a bind mount makes it differ for
// sandbox/docker. Dial starts before the kernel has bound its sockets, which
// is the normal case there too.
func startKernel(t testing.TB, opts Options) (*kernel, *Client) {
	t.Helper()
	return startKernelWith(t, func(string) Options { return opts })
}

// startKernelWith is startKernel with options made once the host prefix
// the client dials is known.
func startKernelWith(t testing.TB, options func(hostPrefix string) Options) (*kernel, *Client) {
	t.Helper()
	requireIPyKernel(t)
	// Short paths: unix socket paths are capped at 107 bytes.
	dir, err := os.MkdirTemp("", "jk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hostDir := dir + "-h"
	if err := os.Symlink(dir, hostDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostDir) })
	if err := os.Mkdir(filepath.Join(dir, "home"), 0o700); err != nil {
		t.Fatal(err)
	}

	info := NewConnInfo(filepath.Join(dir, "k"))
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	k := &kernel{info: info, connPath: filepath.Join(dir, "conn.json"), exited: make(chan struct{}), output: &testenv.Buffer{}}
	if err := os.WriteFile(k.connPath, b, 0o600); err != nil {
		t.Fatal(err)
	}

	k.cmd = exec.Command(python, "-m", "ipykernel_launcher", "-f", k.connPath)
	k.cmd.Dir = dir
	home := filepath.Join(dir, "home")
	k.cmd.Env = []string{
		"PATH=/usr/bin:/bin",
		"HOME=" + home,
		"MPLCONFIGDIR=" + home,
		"IPYTHONDIR=" + filepath.Join(home, ".ipython"),
		"JUPYTER_RUNTIME_DIR=" + home,
		"LANG=C.UTF-8",
	}
	// Its own process group: ipykernel answers interrupt_request with
	// killpg(SIGINT) when it leads its group, which must not reach go test.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	k.cmd.Stdout = k.output
	k.cmd.Stderr = k.output
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start ipykernel: %v", err)
	}
	go func() {
		_ = k.cmd.Wait()
		close(k.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
		if t.Failed() {
			t.Logf("kernel output:\n%s", k.output.String())
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, info, filepath.Join(hostDir, "k"), options(filepath.Join(hostDir, "k")))
	if err != nil {
		t.Fatalf("Dial: %v\nkernel output:\n%s", err, k.output.String())
	}
	t.Cleanup(func() { c.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v\nkernel output:\n%s", err, k.output.String())
	}
	return k, c
}

// run executes code and waits for it, failing the test on any client error.
func run(t testing.TB, c *Client, code string) Output {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ex, err := c.Execute(ctx, code, ExecOptions{})
	if err != nil {
		t.Fatalf("Execute(%q): %v", code, err)
	}
	out, err := ex.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait(%q): %v", code, err)
	}
	return out
}

// logBuffer is a slog handler target that tests can read.
type logBuffer struct{ testenv.Buffer }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
