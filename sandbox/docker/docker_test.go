package docker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
)

func TestStateAndOutputs(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-state"})

	if res := run1(t, k, "x = 21", 30*time.Second); !res.OK || res.Value != nil {
		t.Fatalf("x = 21: %s", describe(res))
	}
	res := run1(t, k, "x*2", 30*time.Second)
	if got, want := value(t, res), "42"; got != want {
		t.Errorf("x*2: got %q, want %q", got, want)
	}
	if got, want := res.ExecutionCount, 2; got != want {
		t.Errorf("execution count: got %d, want %d", got, want)
	}

	res = run1(t, k, "print('hello'); import sys; print('oops', file=sys.stderr)", 30*time.Second)
	if !res.OK || res.Stdout != "hello\n" || res.Stderr != "oops\n" {
		t.Errorf("print: got ok=%v stdout=%q stderr=%q, want ok stdout %q stderr %q", res.OK, res.Stdout, res.Stderr, "hello\n", "oops\n")
	}

	res = run1(t, k, "1/0", 30*time.Second)
	if res.OK || res.Error == nil {
		t.Fatalf("1/0: got %s, want an execution error", describe(res))
	}
	if res.Error.Kind != sandbox.KindExecution || res.Error.Ename != "ZeroDivisionError" || len(res.Error.Traceback) == 0 {
		t.Errorf("1/0: got error %+v, want kind %s, ZeroDivisionError with a traceback", res.Error, sandbox.KindExecution)
	}
	if tb := strings.Join(res.Error.Traceback, "\n"); strings.Contains(tb, "\x1b[") {
		t.Errorf("traceback carries ANSI colour codes: %q", tb)
	}
	// The cell after an exception runs (no "aborted" from stop_on_error).
	if got, want := value(t, run1(t, k, "x", 30*time.Second)), "21"; got != want {
		t.Errorf("x after an error: got %q, want %q", got, want)
	}

	// Figures show inline without any magic, and with %matplotlib inline.
	for _, code := range []string{
		"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()",
		"%matplotlib inline\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])",
	} {
		res := run1(t, k, code, 60*time.Second)
		if !res.OK {
			t.Fatalf("plot: %s", describe(res))
		}
		if res.Stderr != "" {
			t.Errorf("plot wrote to stderr (a matplotlib config warning?): %q", res.Stderr)
		}
		png := pngOf(t, res)
		if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 1000 {
			t.Errorf("image/png: got %d bytes starting %q, want a PNG", len(png), png[:min(8, len(png))])
		}
	}

	// Libraries from packages.txt import in the jail.
	mustOK(t, k, "import pandas, numpy, scipy, statsmodels.api, seaborn, sklearn, jinja2, openpyxl, xlsxwriter, docx, reportlab, weasyprint, markdown, bs4, lxml, tabulate, plotly")

	// The working directory is /work, on the host at WorkDir.
	mustOK(t, k, "import os\nassert os.getcwd() == '/work', os.getcwd()\nopen('out.csv', 'w').write('a,b\\n1,2\\n')")
	data, err := os.ReadFile(filepath.Join(k.WorkDir(), "out.csv"))
	if err != nil || string(data) != "a,b\n1,2\n" {
		t.Errorf("out.csv on the host: got %q, %v; want the cell's file", data, err)
	}
	// And a file put there by the host opens in the next cell.
	if err := os.WriteFile(filepath.Join(k.WorkDir(), "in.txt"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := value(t, run1(t, k, "open('in.txt').read()", 30*time.Second)), "'from the host'"; got != want {
		t.Errorf("host file in the kernel: got %s, want %s", got, want)
	}
}

func pngOf(t *testing.T, res *sandbox.Result) []byte {
	t.Helper()
	for _, d := range res.Display {
		if raw, ok := d.Data["image/png"]; ok {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			png, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
			if err != nil {
				t.Fatal(err)
			}
			return png
		}
	}
	t.Fatalf("no image/png display bundle: %s", describe(res))
	return nil
}

// TestJail runs escape attempts inside a kernel; each must fail.
func TestJail(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{TmpSize: 32 << 20})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-jail"})
	for _, tc := range []struct{ name, code, want string }{
		{"no route to 1.1.1.1:53", `
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("1.1.1.1", 53)); print("CONNECTED")
except OSError as e:
    print("blocked", type(e).__name__)`, "blocked"},
		{"no route to the metadata service", `
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("169.254.169.254", 80)); print("CONNECTED")
except OSError as e:
    print("blocked", type(e).__name__)`, "blocked"},
		{"only loopback", `
import socket
print(sorted(n for _, n in socket.if_nameindex()))`, "['lo']"},
		{"non-root uid", `import os; print(os.getuid() != 0 and os.geteuid() != 0, os.getuid())`, "True 1000"},
		{"etc is read-only", `
try:
    open("/etc/evil", "w").write("x"); print("WROTE")
except OSError as e:
    print("denied", e.errno)`, "denied"},
		{"root filesystem is read-only", `
import os
try:
    os.makedirs("/usr/lib/evil"); print("WROTE")
except OSError as e:
    print("denied", e.strerror)`, "denied"},
		{"no capabilities", `
caps = {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")}
print(caps["CapEff"], caps["CapPrm"], caps["CapBnd"])`, "0000000000000000 0000000000000000 0000000000000000"},
		{"no new privileges", `print([l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0])`, "1"},
		{"shadow unreadable", `
try:
    open("/etc/shadow").read(); print("READ")
except OSError as e:
    print("denied", e.errno)`, "denied"},
		{"tmp is capped", `
try:
    with open("/tmp/big", "wb") as f:
        for _ in range(64): f.write(b"\0" * (1 << 20))
    print("WROTE 64 MiB")
except OSError as e:
    print("full", e.errno)
finally:
    import os; os.remove("/tmp/big")`, "full 28"},
		{"orphans are reaped", `
import os, subprocess, time
subprocess.run(["sh", "-c", "for i in 1 2 3 4 5; do (sleep 0.2 &); done"])
time.sleep(1.5)
def state(p):
    try: return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError: return "?"
print(sum(state(p) == "Z" for p in os.listdir("/proc") if p.isdigit()), "zombies")`, "0 zombies"},
		{"socket dir is capped", `
try:
    with open("/run/kernel/junk", "wb") as f:
        for _ in range(8): f.write(b"\0" * (1 << 20))
    print("WROTE 8 MiB")
except OSError as e:
    print("full", e.errno)
finally:
    import os; os.remove("/run/kernel/junk")`, "full 28"},
		{"work is writable", `open("/work/ok.txt", "w").write("ok"); print(open("/work/ok.txt").read())`, "ok"},
		{"cgroup limits", `
import os
def r(p):
    try: return open(p).read().strip()
    except OSError: return "?"
print(r("/sys/fs/cgroup/pids/pids.max") if os.path.exists("/sys/fs/cgroup/pids") else r("/sys/fs/cgroup/pids.max"))`, "256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := mustOK(t, k, tc.code)
			if !strings.HasPrefix(strings.TrimSpace(out), tc.want) {
				t.Errorf("got %q, want it to start with %q", out, tc.want)
			}
		})
	}
}

// TestForkBomb: a fork bomb hits the pids limit inside its container; the
// host, other kernels and (after the timeout) its own kernel keep working.
func TestForkBomb(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{InterruptGrace: 2 * time.Second})
	bomb := startKernel(t, b, sandbox.Spec{Owner: "run-bomb"})
	other := startKernel(t, b, sandbox.Spec{Owner: "run-bystander"})
	mustOK(t, other, "y = 7")

	// A polite bomb first: forking fails at the pids limit, and the kernel
	// carries on once its children are gone.
	out := mustOK(t, bomb, `
import os, time
kids = []
err = None
for _ in range(100000):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno; break
    if pid == 0:
        time.sleep(5); os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print(len(kids), err)`)
	var n, errno int
	if _, err := fmt.Sscan(out, &n, &errno); err != nil || n >= 256 || errno != int(syscall.EAGAIN) {
		t.Errorf("polite bomb: got %q, want fewer than 256 forks and errno %d (EAGAIN)", out, syscall.EAGAIN)
	}
	mustOK(t, bomb, "z = 1")

	// The real thing: every process forks forever. It must not take the
	// host or the bystander down; the cell times out and, if the interrupt
	// cannot stop it, the kernel restarts.
	done := make(chan *sandbox.Result, 1)
	go func() {
		res, err := bomb.Execute(context.Background(), "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", 5*time.Second)
		if err != nil {
			t.Errorf("bomb Execute: %v", err)
		}
		done <- res
	}()
	time.Sleep(2 * time.Second)
	if got, want := value(t, run1(t, other, "y * 6", 30*time.Second)), "42"; got != want {
		t.Errorf("bystander during the bomb: got %q, want %q", got, want)
	}
	res := <-done
	if res == nil {
		t.FailNow()
	}
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindTimeout {
		t.Fatalf("bomb: got %s, want kind timeout", describe(res))
	}
	t.Logf("bomb: restarted=%v: %s", res.Restarted, res.Error.Evalue)
	if got, want := value(t, run1(t, bomb, "1 + 1", 30*time.Second)), "2"; got != want {
		t.Errorf("bomb kernel after the bomb: got %q, want %q", got, want)
	}
	if got, want := value(t, run1(t, other, "y", 30*time.Second)), "7"; got != want {
		t.Errorf("bystander after the bomb: got %q, want %q", got, want)
	}
}

// TestOOM: allocating 8 GiB kills the kernel (OOMKilled), the next cell gets
// a fresh kernel, and another kernel is unaffected.
func TestOOM(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-oom", Limits: sandbox.Limits{MemoryBytes: 512 << 20}})
	other := startKernel(t, b, sandbox.Spec{Owner: "run-other"})
	mustOK(t, k, "x = 1")
	mustOK(t, other, "y = 2")

	res := run1(t, k, "b = b'x' * (8 << 30)", 120*time.Second)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindKernelDied {
		t.Fatalf("8 GiB: got %s, want kind kernel_died", describe(res))
	}
	if got, want := res.Error.Reason, "OOMKilled"; got != want {
		t.Errorf("reason: got %q, want %q", got, want)
	}
	if !res.Restarted {
		t.Errorf("Restarted: got false, want true (a fresh kernel for the next cell)")
	}
	// State is gone, the kernel works.
	res = run1(t, k, "x", 30*time.Second)
	if res.OK || res.Error == nil || res.Error.Ename != "NameError" {
		t.Errorf("x after the OOM: got %s, want NameError", describe(res))
	}
	if got, want := value(t, run1(t, k, "1+1", 30*time.Second)), "2"; got != want {
		t.Errorf("after the OOM: got %q, want %q", got, want)
	}
	if got, want := value(t, run1(t, other, "y", 30*time.Second)), "2"; got != want {
		t.Errorf("other kernel: got %q, want %q", got, want)
	}
}

// TestDefaultMemoryLimit: the default 2 GiB limit (swap included) holds
// against 8 GiB.
func TestDefaultMemoryLimit(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-oom-default"})
	res := run1(t, k, "import numpy as np\na = np.ones(8 << 30, dtype=np.uint8)", 120*time.Second)
	if res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || res.Error.Reason != "OOMKilled" {
		t.Fatalf("8 GiB under the default limit: got %s, want kernel_died OOMKilled", describe(res))
	}
}

func TestKernelDeath(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-death"})
	for _, tc := range []struct{ name, code, reason string }{
		{"os._exit", "import os; os._exit(3)", "exited with code 3"},
		{"segfault", "import ctypes; ctypes.string_at(0)", "killed by signal 11 (exit code 139)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustOK(t, k, "x = 5")
			res := run1(t, k, tc.code, 30*time.Second)
			if res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || res.Error.Reason != tc.reason || !res.Restarted {
				t.Fatalf("got %s, want kernel_died (%s), restarted", describe(res), tc.reason)
			}
			if r := run1(t, k, "x", 30*time.Second); r.Error == nil || r.Error.Ename != "NameError" {
				t.Errorf("x after death: got %s, want NameError (fresh kernel)", describe(r))
			}
		})
	}
}

// TestDiskQuota: writing past the quota fails inside the cell with ENOSPC
// and the host's disk only sees the quota's worth of blocks.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	if !b.Quota() {
		if os.Geteuid() == 0 {
			t.Fatal("running as root, yet loop-mounted quotas are unavailable")
		}
		testenv.Missing(t, "root, for loop-mounted disk quotas (the backend fell back to plain directories)")
	}
	const quota = 64 << 20
	k := startKernel(t, b, sandbox.Spec{Owner: "run-quota", Limits: sandbox.Limits{DiskBytes: quota}})
	var before syscall.Statfs_t
	if err := syscall.Statfs(b.cfg.WorkRoot, &before); err != nil {
		t.Fatal(err)
	}
	out := mustOK(t, k, `
import errno
n = 0
try:
    with open("/work/fill", "wb") as f:
        for _ in range(256):
            f.write(b"\1" * (1 << 20)); f.flush(); n += 1
    print("WROTE", n)
except OSError as e:
    print("ENOSPC" if e.errno == errno.ENOSPC else e, n)`)
	var tag string
	var mib int
	if _, err := fmt.Sscan(out, &tag, &mib); err != nil || tag != "ENOSPC" || mib > 64 || mib < 32 {
		t.Fatalf("filling a 64 MiB quota: got %q, want ENOSPC after 32–64 MiB", out)
	}
	// The host file system lost at most the quota (plus metadata).
	var after syscall.Statfs_t
	if err := syscall.Statfs(b.cfg.WorkRoot, &after); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(b.cfg.WorkRoot, diskDir, filepath.Base(k.WorkDir())+".ext4")
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > quota {
		t.Errorf("disk image uses %d bytes on the host, want at most the %d quota", used, quota)
	}
	t.Logf("cell wrote %d MiB before ENOSPC; image holds %d MiB on the host; host free space changed by %d MiB (other processes share the disk)",
		mib, st.Blocks*512>>20, (int64(before.Bavail)-int64(after.Bavail))*before.Bsize>>20)
	// The kernel survives a full disk, and deleting frees the space.
	mustOK(t, k, "import os; os.remove('/work/fill'); open('/work/small', 'wb').write(b'1' * (1 << 20))")
}

// TestSymlinkNotFollowed: a symlink to /etc/shadow made by a cell stays a
// symlink on the host; nothing in the backend reads through it, and Close
// removes it without touching its target.
func TestSymlinkNotFollowed(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-symlink"})
	shadowBefore := fileSum(t, "/etc/shadow")
	mustOK(t, k, "import os; os.symlink('/etc/shadow', '/work/shadow'); os.symlink('/', '/work/root')")
	// Inside the jail, the link leads to the image's shadow, which the
	// kernel's uid cannot read either.
	if res := run1(t, k, "open('/work/shadow').read()", 30*time.Second); res.OK || res.Error == nil || res.Error.Ename != "PermissionError" {
		t.Errorf("reading the link in the kernel: got %s, want PermissionError", describe(res))
	}
	fi, err := os.Lstat(filepath.Join(k.WorkDir(), "shadow"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("WorkDir/shadow: got mode %v, want a symlink", fi.Mode())
	}
	wd := k.WorkDir()
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wd); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WorkDir after Close: got %v, want it gone", err)
	}
	if got := fileSum(t, "/etc/shadow"); got != shadowBefore {
		t.Errorf("the host's /etc/shadow changed")
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Errorf("Close followed the link to / : %v", err)
	}
}

// fileSum fingerprints a host file without needing to read it (a non-root
// test cannot read /etc/shadow): size, mode and modification time.
func fileSum(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat %s on the host: %v", path, err)
	}
	return fmt.Sprintf("%d %v %v", fi.Size(), fi.Mode(), fi.ModTime().UnixNano())
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	// The grace covers a loaded machine; an interrupted `while True: pass`
	// ends within milliseconds when it is quiet.
	b := newBackend(t, Config{InterruptGrace: 5 * time.Second})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-timeout"})
	mustOK(t, k, "x = 21")

	// An interruptible loop: the state survives.
	t0 := time.Now()
	res := run1(t, k, "print('spinning')\nwhile True: pass", 2*time.Second)
	t.Logf("while True: pass with a 2 s timeout returned after %s", time.Since(t0).Round(time.Millisecond))
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindTimeout || res.Restarted {
		t.Fatalf("while True: got %s, want kind timeout without a restart", describe(res))
	}
	if res.Stdout != "spinning\n" {
		t.Errorf("partial stdout: got %q, want %q", res.Stdout, "spinning\n")
	}
	if got, want := value(t, run1(t, k, "x*2", 30*time.Second)), "42"; got != want {
		t.Errorf("after the timeout: got %q, want %q", got, want)
	}

	// A cell that ignores SIGINT: the kernel is restarted and says so.
	res = run1(t, k, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)", 2*time.Second)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindTimeout || !res.Restarted {
		t.Fatalf("SIGINT ignored: got %s, want kind timeout with a restart", describe(res))
	}
	if r := run1(t, k, "x", 30*time.Second); r.Error == nil || r.Error.Ename != "NameError" {
		t.Errorf("x after the restart: got %s, want NameError", describe(r))
	}
}

func TestParallelKernelsIsolated(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	var ks [2]sandbox.Kernel
	var wg sync.WaitGroup
	for i := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks[i] = startKernel(t, b, sandbox.Spec{Owner: fmt.Sprintf("run-par-%d", i)})
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if ks[0].WorkDir() == ks[1].WorkDir() {
		t.Fatalf("both kernels got WorkDir %s", ks[0].WorkDir())
	}
	for i, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mustOK(t, k, fmt.Sprintf("x = %d\nopen('mine.txt', 'w').write('%d')", i, i))
		}()
	}
	wg.Wait()
	for i, k := range ks {
		if got, want := value(t, run1(t, k, "x", 30*time.Second)), fmt.Sprint(i); got != want {
			t.Errorf("kernel %d: x = %s, want %s", i, got, want)
		}
		code := "import os; open('mine.txt').read(), sorted(os.listdir('.'))"
		if got, want := value(t, run1(t, k, code, 30*time.Second)), fmt.Sprintf("('%d', ['mine.txt'])", i); got != want {
			t.Errorf("kernel %d files: got %s, want %s", i, got, want)
		}
	}
}

func TestRestartKeepsFiles(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-restart"})
	mustOK(t, k, "x = 1\nopen('keep.txt', 'w').write('kept')\nopen('/tmp/scratch', 'w').write('gone')")
	id := k.ID()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if r := run1(t, k, "x", 30*time.Second); r.Error == nil || r.Error.Ename != "NameError" {
		t.Errorf("x after Restart: got %s, want NameError", describe(r))
	}
	if got, want := value(t, run1(t, k, "import os; open('keep.txt').read(), os.path.exists('/tmp/scratch')", 30*time.Second)), "('kept', False)"; got != want {
		t.Errorf("after Restart: got %s, want %s (workdir kept, /tmp fresh)", got, want)
	}
	if k.ID() != id {
		t.Logf("kernel id changed across Restart: %s → %s", id, k.ID())
	}
}

func TestCloseIsFinal(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-close"})
	cid := k.(*Kernel).containerID
	wd := k.WorkDir()

	// Close during a running cell ends it with ErrClosed, promptly.
	errc := make(chan error, 1)
	go func() {
		_, err := k.Execute(context.Background(), "import time; time.sleep(60)", time.Minute)
		errc <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute during Close: got %v, want ErrClosed", err)
	}
	if err := k.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := k.Execute(t.Context(), "1", time.Second); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute after Close: got %v, want ErrClosed", err)
	}
	if err := k.Restart(t.Context()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Restart after Close: got %v, want ErrClosed", err)
	}
	if _, err := b.cli.ContainerInspect(t.Context(), cid); err == nil {
		t.Errorf("container %s still exists after Close", cid[:12])
	}
	if _, err := os.Stat(wd); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workdir after Close: got %v, want it gone", err)
	}
	if mounted(t, wd) {
		t.Errorf("workdir still mounted after Close")
	}

	// Backend.Close closes the kernels it started.
	k2 := startKernel(t, b, sandbox.Spec{Owner: "run-close-2"})
	cid2 := k2.(*Kernel).containerID
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Backend.Close: %v", err)
	}
	if _, err := k2.Execute(t.Context(), "1", time.Second); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Execute after Backend.Close: got %v, want ErrClosed", err)
	}
	if _, err := b.Start(t.Context(), sandbox.Spec{}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Start after Backend.Close: got %v, want ErrClosed", err)
	}
	cli := dockerClient(t)
	if _, err := cli.ContainerInspect(t.Context(), cid2); err == nil {
		t.Errorf("container %s still exists after Backend.Close", cid2[:12])
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && unescapeMount(f[1]) == path {
			return true
		}
	}
	return false
}

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestLeftoversRemovedAfterKill9 starts a kernel in a child process, kills
// that process with SIGKILL (so nothing is closed), and checks that a new
// Backend on the same WorkRoot removes the container, the mount and the
// directories it left.
func TestLeftoversRemovedAfterKill9(t *testing.T) {
	t.Parallel()
	img := sandboxImage(t)
	root := t.TempDir()
	// Whatever happens below, leave no kernel of the child behind: a Backend
	// on the same root removes it (this cleanup runs before TempDir's).
	t.Cleanup(func() {
		if b, err := New(context.Background(), Config{Image: img, WorkRoot: root}); err == nil {
			_ = b.Close()
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperLeakKernel$", "-test.v")
	cmd.Env = append(os.Environ(), "TRIAD_LEAK_ROOT="+root, "TRIAD_LEAK_IMAGE="+img)
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var cid, wd string
	for cid == "" {
		if ctx.Err() != nil {
			t.Fatalf("helper never reported its kernel:\n%s", out.String())
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "LEAKED "); ok {
				cid, wd, _ = strings.Cut(rest, " ")
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	cli := dockerClient(t)
	if _, err := cli.ContainerInspect(ctx, cid); err != nil {
		t.Fatalf("the killed process's container should still exist before the new Backend: %v", err)
	}
	if !mounted(t, wd) {
		t.Fatalf("the killed process's workdir %s should still be mounted", wd)
	}
	sockRoot := Config{Image: img, WorkRoot: root}
	if sockRoot, err := sockRoot.withDefaults(); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(filepath.Join(sockRoot.SocketRoot, filepath.Base(wd), "conn.json")); err != nil {
		t.Fatalf("the killed process's socket dir should still exist: %v", err)
	}

	b := newBackend(t, Config{WorkRoot: root})
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelRoot+"="+b.rootTag))})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("containers of the killed process left: %d (%s)", len(list), list[0].ID[:12])
	}
	if _, err := cli.ContainerInspect(ctx, cid); err == nil {
		t.Errorf("container %s survived", cid[:12])
	}
	if mounted(t, wd) {
		t.Errorf("workdir %s is still mounted", wd)
	}
	if _, err := os.Stat(wd); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workdir %s: got %v, want removed", wd, err)
	}
	if _, err := os.Stat(filepath.Join(b.cfg.SocketRoot, filepath.Base(wd))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed process's socket dir: got %v, want removed", err)
	}
	// And the new backend works on that root.
	k := startKernel(t, b, sandbox.Spec{Owner: "run-after-crash"})
	if got, want := value(t, run1(t, k, "6*7", 30*time.Second)), "42"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestHelperLeakKernel is the child process of TestLeftoversRemovedAfterKill9.
func TestHelperLeakKernel(t *testing.T) {
	root := os.Getenv("TRIAD_LEAK_ROOT")
	if root == "" {
		return // only runs as the child of TestLeftoversRemovedAfterKill9
	}
	b, err := New(t.Context(), Config{Image: os.Getenv("TRIAD_LEAK_IMAGE"), WorkRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	k, err := b.Start(t.Context(), sandbox.Spec{Owner: "run-leaked"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Execute(t.Context(), "open('f', 'w').write('x')", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LEAKED %s %s\n", k.(*Kernel).containerID, k.WorkDir())
	time.Sleep(time.Hour) // until SIGKILL
}

func TestErrors(t *testing.T) {
	t.Run("no engine", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "nothing.sock"))
		_, err := New(t.Context(), Config{Image: "triad-sandbox:none", WorkRoot: t.TempDir()})
		if !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("got %v, want ErrUnavailable", err)
		}
	})
	t.Run("no image", func(t *testing.T) {
		sandboxImage(t) // an engine must answer
		_, err := New(t.Context(), Config{Image: "triad-sandbox:000000000000", WorkRoot: t.TempDir()})
		if !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("got %v, want ErrUnavailable", err)
		}
	})
	t.Run("one backend per root", func(t *testing.T) {
		root := t.TempDir()
		newBackend(t, Config{WorkRoot: root})
		if _, err := New(t.Context(), Config{Image: sandboxImage(t), WorkRoot: root}); err == nil {
			t.Errorf("a second live Backend on one WorkRoot: got nil error, want one")
		}
	})
	t.Run("negative limits", func(t *testing.T) {
		b := newBackend(t, Config{})
		_, err := b.Start(t.Context(), sandbox.Spec{Limits: sandbox.Limits{Pids: -1}})
		if f := fault.As(err); f == nil || f.Kind != fault.BadInput {
			t.Errorf("got %v, want a bad_input fault", err)
		}
	})
	t.Run("socket root too long", func(t *testing.T) {
		_, err := New(t.Context(), Config{Image: "x", WorkRoot: t.TempDir(), SocketRoot: "/tmp/" + strings.Repeat("s", 100)})
		if err == nil || !strings.Contains(err.Error(), "too long") {
			t.Errorf("got %v, want a too-long error", err)
		}
	})
}

// TestOutputLimit: a cell printing without end is stopped at MaxOutput,
// long before its deadline, and the kernel keeps its state.
func TestOutputLimit(t *testing.T) {
	t.Parallel()
	const limit = 8 << 20
	// A generous grace: the point is that the interrupt stops the cell and
	// the state survives, however loaded the machine (or -race) is while
	// the client drains what the kernel already sent.
	b := newBackend(t, Config{MaxOutput: limit, InterruptGrace: 20 * time.Second})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-flood"})
	mustOK(t, k, "x = 21")
	res := run1(t, k, "import time\nwhile True:\n    print('x' * 10000, flush=True)\n    time.sleep(0.0002)", 60*time.Second)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindExecution || res.Error.Ename != "OutputLimitExceeded" || res.Restarted {
		t.Fatalf("flood: got kind/ename/restarted %v, want execution_error OutputLimitExceeded without a restart", errSummary(res))
	}
	if n := len(res.Stdout); n > limit || n < limit/2 {
		t.Errorf("stdout: got %d bytes, want between %d and %d", n, limit/2, limit)
	}
	if res.Duration > 30*time.Second {
		t.Errorf("the flood ran %s: the limit did not stop it before the deadline", res.Duration)
	}
	if got, want := value(t, run1(t, k, "x*2", 30*time.Second)), "42"; got != want {
		t.Errorf("after the flood: got %q, want %q", got, want)
	}
}

func errSummary(res *sandbox.Result) string {
	if res.Error == nil {
		return fmt.Sprintf("ok=%v no error", res.OK)
	}
	return fmt.Sprintf("%s/%s/%v: %s", res.Error.Kind, res.Error.Ename, res.Restarted, res.Error.Evalue)
}

// TestDocumentsRender: the image's document libraries produce their files
// in the jail (fonts present, nothing written outside /work and /tmp).
func TestDocumentsRender(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-docs"})
	res := run1(t, k, `
import weasyprint
weasyprint.HTML(string="<h1>Report</h1><p>Total: 42 €</p>").write_pdf("r.pdf")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(); ax.plot([1, 2]); fig.savefig("p.pdf"); plt.close(fig)
from reportlab.pdfgen import canvas
c = canvas.Canvas("rl.pdf"); c.drawString(100, 750, "hello"); c.save()
import pandas as pd
pd.DataFrame({"a": [1]}).to_excel("x.xlsx")
import docx
d = docx.Document(); d.add_paragraph("x"); d.save("d.docx")`, 120*time.Second)
	if !res.OK || res.Stderr != "" {
		t.Fatalf("rendering: %s", describe(res))
	}
	for _, f := range []string{"r.pdf", "p.pdf", "rl.pdf", "x.xlsx", "d.docx"} {
		data, err := os.ReadFile(filepath.Join(k.WorkDir(), f))
		if err != nil || len(data) < 100 {
			t.Errorf("%s: %d bytes, %v", f, len(data), err)
			continue
		}
		if strings.HasSuffix(f, ".pdf") && !bytes.HasPrefix(data, []byte("%PDF-")) {
			t.Errorf("%s: got %q, want a PDF", f, data[:8])
		}
	}
}
