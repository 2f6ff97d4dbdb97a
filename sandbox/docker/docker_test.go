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
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/loopfs"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestConformance runs the sandbox conformance suite against real jailed
// kernels, one backend per test.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, sandboxtest.Options{
		New: func(t *testing.T) sandbox.Backend {
			// A generous grace: an interrupted cell ends within
			// milliseconds on a quiet machine, but the suite runs beside
			// other kernels on two shared cores.
			return newBackend(t, Config{InterruptGrace: 10 * time.Second})
		},
		Interrupts: true, // ipykernel turns SIGINT into KeyboardInterrupt
		HostDir:    func(k sandbox.Kernel) string { return k.(*Kernel).wd.path },
		Contexts:   true, // a second ipykernel in the container (docker exec)
		Commands:   true, // docker exec in the container
		Egress:     true, // the forwarder on the socket directory
	})
}

// TestFiguresAndLibraries: figures show inline, the image's libraries
// import in the jail, and the cell's directory is /work.
func TestFiguresAndLibraries(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-state"})

	// Figures show inline without any magic, and with %matplotlib inline.
	for _, code := range []string{
		"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()",
		"%matplotlib inline\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])",
	} {
		res := run1(t, k, code, 60*time.Second)
		if !res.OK {
			t.Fatalf("plot: %s", describe(res))
		}
		if res.Stderr.Len() != 0 {
			t.Errorf("plot wrote to stderr (a matplotlib config warning?): %q", res.Stderr.String())
		}
		png := pngOf(t, res)
		if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 1000 {
			t.Errorf("image/png: got %d bytes starting %q, want a PNG", len(png), png[:min(8, len(png))])
		}
	}

	// Libraries from packages.txt import in the jail.
	mustOK(t, k, "import pandas, numpy, scipy, statsmodels.api, seaborn, sklearn, jinja2, openpyxl, xlsxwriter, docx, reportlab, weasyprint, markdown, bs4, lxml, tabulate, plotly")

	// The working directory is /work (the suite checks files through
	// Files()), and a module there imports.
	mustOK(t, k, "import os\nassert os.getcwd() == '/home/user', os.getcwd()")
	if _, err := k.Files().Put(t.Context(), "helper.py", strings.NewReader("def f():\n    return 5\n")); err != nil {
		t.Fatal(err)
	}
	if got, want := value(t, run1(t, k, "import helper\nhelper.f()", 30*time.Second)), "5"; got != want {
		t.Errorf("a module in /work: got %s, want %s", got, want)
	}
	// image.KernelLauncher bounded ipykernel's output buffers.
	if got, want := value(t, run1(t, k, "import ipykernel.iostream as io\nio.OutStream.write.__name__", 30*time.Second)), "'bounded_write'"; got != want {
		t.Errorf("OutStream.write: got %s, want %s (image.KernelLauncher's patch)", got, want)
	}
}

// TestStartDefersImports: the kernel starts without debugpy and jedi
// (image.KernelLauncher keeps them out of a start), yet a cell can still
// import both, and the removed block leaves nothing behind in sys.meta_path.
func TestStartDefersImports(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-imports"})
	code := "import sys\nsorted(m for m in ('debugpy', 'jedi', '_pydevd_bundle') if m in sys.modules)"
	if got, want := value(t, run1(t, k, code, 30*time.Second)), "[]"; got != want {
		t.Errorf("modules loaded at start: got %s, want %s", got, want)
	}
	if got, want := value(t, run1(t, k, "import sys\n[type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_Deferred']", 30*time.Second)), "[]"; got != want {
		t.Errorf("the start's import block after start: got %s, want %s", got, want)
	}
	if got, want := value(t, run1(t, k, "import jedi, debugpy\nbool(jedi.__version__ and debugpy.__version__)", 60*time.Second)), "True"; got != want {
		t.Errorf("import jedi, debugpy in a cell: got %s, want %s", got, want)
	}
}

func pngOf(t *testing.T, res *result) []byte {
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
		pidsLimit(b.Runtime()),
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := mustOK(t, k, tc.code)
			if !strings.HasPrefix(strings.TrimSpace(out), tc.want) {
				t.Errorf("got %q, want it to start with %q", out, tc.want)
			}
		})
	}
}

// pidsLimit is TestJail's case for the process limit as the cell sees it:
// under runc the pids cgroup (the host's), under gVisor RLIMIT_NPROC, which
// gVisor's kernel counts per sandbox (the host's cgroup is only its
// backstop; see RunscHostPids). TestForkBomb checks that either stops a
// bomb with EAGAIN.
func pidsLimit(runtime string) struct{ name, code, want string } {
	if runtime == RuntimeRunsc {
		return struct{ name, code, want string }{"process limit (gVisor RLIMIT_NPROC)", `
import resource
print(resource.getrlimit(resource.RLIMIT_NPROC))`, "(256, 256)"}
	}
	return struct{ name, code, want string }{"process limit (pids cgroup)", `
import os
def r(p):
    try: return open(p).read().strip()
    except OSError: return "?"
print(r("/sys/fs/cgroup/pids/pids.max") if os.path.exists("/sys/fs/cgroup/pids") else r("/sys/fs/cgroup/pids.max"))`, "256"}
}

// TestForkBomb: fork and thread bombs hit the process limit inside their
// container; the host, other kernels and (after the timeout) their own
// kernel keep working. Under both runtimes a process or thread past the
// limit fails with EAGAIN and the kernel carries on (TestJail says which
// mechanism counts). One outcome differs, and is asserted per runtime: a
// Python that forks itself (os.fork) copies far more memory under gVisor,
// which breaks copy-on-write in 2 MiB units (a forked ipykernel child
// costs about 27 MiB against about 1.5 under runc), so there the memory
// limit may end a fork bomb before the process limit does, as
// kernel_died OOMKilled with a fresh kernel (docs/DECISIONS.md, "gVisor:
// limits").
func TestForkBomb(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{InterruptGrace: 2 * time.Second})
	bomb := startKernel(t, b, sandbox.Spec{Owner: "run-bomb"})
	other := startKernel(t, b, sandbox.Spec{Owner: "run-bystander"})
	mustOK(t, other, "y = 7")
	gvisor := b.Runtime() == RuntimeRunsc

	// Polite bombs first: each stops at the limit with EAGAIN, and the
	// kernel carries on once its children are gone.
	for _, tc := range []struct{ name, code string }{
		{"processes", `
import subprocess
kids, err = [], None
for _ in range(100000):
    try:
        kids.append(subprocess.Popen(["sleep", "5"]))
    except OSError as e:
        err = e.errno; break
for p in kids:
    p.wait()
print(len(kids), err)`},
		{"threads", `
import threading, time, errno
stop = threading.Event()
ts, err = [], None
for _ in range(100000):
    try:
        t = threading.Thread(target=stop.wait); t.start(); ts.append(t)
    except RuntimeError as e:
        err = errno.EAGAIN; break
stop.set()
for t in ts:
    t.join()
print(len(ts), err)`},
	} {
		t.Run("polite "+tc.name, func(t *testing.T) {
			out := mustOK(t, bomb, "z = 1\n"+tc.code)
			var n, errno int
			if _, err := fmt.Sscan(out, &n, &errno); err != nil || n >= 256 || n < 64 || errno != int(syscall.EAGAIN) {
				t.Errorf("got %q, want 64 to 255 %s and errno %d (EAGAIN)", out, tc.name, syscall.EAGAIN)
			}
			if got, want := value(t, run1(t, bomb, "z + 1", 30*time.Second)), "2"; got != want {
				t.Errorf("the kernel after the bomb: got %q, want %q (state kept)", got, want)
			}
		})
	}
	// Under gVisor each fork of the kernel (a multi-threaded process of
	// some 100 MiB) copies its address space in the sentry: 255 of them
	// took 96 s at load 12 and ran past a 2-minute cell timeout in CI. The
	// cell's timeout is therefore no deadline on speed, only a backstop
	// within go test's own.
	t.Run("polite os.fork", func(t *testing.T) {
		res := run1(t, bomb, `
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
print(len(kids), err)`, 10*time.Minute)
		if gvisor && !res.OK && res.Error != nil && res.Error.Kind == sandbox.KindKernelDied && res.Error.Reason == "OOMKilled" && res.Restarted {
			t.Logf("under gVisor the memory limit ended the os.fork bomb first: %s", res.Error.Evalue)
			return
		}
		if !res.OK {
			t.Fatalf("cell failed: %s", describe(res))
		}
		var n, errno int
		if _, err := fmt.Sscan(res.Stdout.String(), &n, &errno); err != nil || n >= 256 || errno != int(syscall.EAGAIN) {
			t.Errorf("got %q, want fewer than 256 forks and errno %d (EAGAIN)", res.Stdout.String(), syscall.EAGAIN)
		}
	})

	// The real thing: every process forks forever. It must not take the
	// host or the bystander down; the cell times out and, if the interrupt
	// cannot stop it, the kernel restarts (under gVisor the memory limit
	// may end it first: kernel_died OOMKilled).
	done := make(chan *result, 1)
	go func() {
		res, err := bomb.Execute(context.Background(), sandbox.Cell{Code: "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", Timeout: 5 * time.Second})
		if err != nil {
			t.Errorf("bomb Execute: %v", err)
			done <- nil
			return
		}
		done <- &result{Result: res}
	}()
	time.Sleep(2 * time.Second)
	if got, want := value(t, run1(t, other, "y * 6", 30*time.Second)), "42"; got != want {
		t.Errorf("bystander during the bomb: got %q, want %q", got, want)
	}
	res := <-done
	if res == nil {
		t.FailNow()
	}
	oom := gvisor && res.Error != nil && res.Error.Kind == sandbox.KindKernelDied && res.Error.Reason == "OOMKilled" && res.Restarted
	if res.OK || res.Error == nil || (res.Error.Kind != sandbox.KindTimeout && !oom) {
		t.Fatalf("bomb: got %s, want kind timeout", describe(res))
	}
	t.Logf("bomb: %s restarted=%v: %s", res.Error.Kind, res.Restarted, res.Error.Evalue)
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
	// A generous timeout: on a loaded machine, filling 2 GiB under a
	// one-CPU limit can take minutes; what is asserted is how it ends.
	res := run1(t, k, "import numpy as np\na = np.ones(8 << 30, dtype=np.uint8)", 300*time.Second)
	if res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || res.Error.Reason != "OOMKilled" {
		t.Fatalf("8 GiB under the default limit: got %s, want kernel_died OOMKilled", describe(res))
	}
}

func TestKernelDeath(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-death"})
	// The suite checks os._exit; a signal is Docker's own.
	for _, tc := range []struct{ name, code, reason string }{
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
	img := filepath.Join(b.cfg.WorkRoot, diskDir, filepath.Base(k.(*Kernel).wd.path)+".ext4")
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
	wd := k.(*Kernel).wd.path
	fi, err := os.Lstat(filepath.Join(wd, "shadow"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("WorkDir/shadow: got mode %v, want a symlink", fi.Mode())
	}
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

// TestCloseIsFinal: Close removes what the kernel had on the host (its
// container, its mounted working directory), and Backend.Close does the
// same for every kernel it started. The suite checks the API side.
func TestCloseIsFinal(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-close"})
	cid := k.(*Kernel).containerID
	wd := k.(*Kernel).wd.path
	mustOK(t, k, "open('f.txt', 'w').write('f')")
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
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

	k2 := startKernel(t, b, sandbox.Spec{Owner: "run-close-2"})
	cid2 := k2.(*Kernel).containerID
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	cli := dockerClient(t)
	if _, err := cli.ContainerInspect(t.Context(), cid2); err == nil {
		t.Errorf("container %s still exists after Backend.Close", cid2[:12])
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	ok, err := loopfs.Mounted(path)
	if err != nil {
		t.Fatal(err)
	}
	return ok
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
	ctx, cancel := context.WithTimeout(t.Context(), testenv.Patience(t, 3*time.Minute))
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
	if _, err := k.Execute(t.Context(), sandbox.Cell{Code: "open('f', 'w').write('x')", Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LEAKED %s %s\n", k.(*Kernel).containerID, k.(*Kernel).wd.path)
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

// TestOutputLimit: a cell printing without end is stopped at its output
// limit, at the scale of a real limit (the suite uses a small one), and the
// kernel keeps its state. The result's kind, output_limit rather than
// timeout, is what shows the limit stopped it long before its deadline.
func TestOutputLimit(t *testing.T) {
	t.Parallel()
	const limit = 8 << 20
	// A generous grace: the point is that the interrupt stops the cell and
	// the state survives, however loaded the machine (or -race) is.
	b := newBackend(t, Config{InterruptGrace: 20 * time.Second})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-flood", Limits: sandbox.Limits{OutputBytes: limit}})
	mustOK(t, k, "x = 21")
	res := run1(t, k, "import time\nwhile True:\n    print('x' * 10000, flush=True)\n    time.sleep(0.0002)", 10*time.Minute)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindOutputLimit || res.Error.Ename != "OutputLimitExceeded" || res.Restarted {
		t.Fatalf("flood: got kind/ename/restarted %v, want output_limit OutputLimitExceeded without a restart", errSummary(res))
	}
	if n := res.delivered; n > limit || n < limit/2 {
		t.Errorf("delivered: got %d bytes, want between %d and %d", n, limit/2, limit)
	}
	if n := int64(res.Stdout.Len()); n != res.delivered {
		t.Errorf("stdout: got %d bytes, want the %d delivered", n, res.delivered)
	}
	if got, want := value(t, run1(t, k, "x*2", 30*time.Second)), "42"; got != want {
		t.Errorf("after the flood: got %q, want %q", got, want)
	}
}

func errSummary(res *result) string {
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
	if !res.OK || res.Stderr.Len() != 0 {
		t.Fatalf("rendering: %s", describe(res))
	}
	for _, f := range []string{"r.pdf", "p.pdf", "rl.pdf", "x.xlsx", "d.docx"} {
		data, err := os.ReadFile(filepath.Join(k.(*Kernel).wd.path, f))
		if err != nil || len(data) < 100 {
			t.Errorf("%s: %d bytes, %v", f, len(data), err)
			continue
		}
		if strings.HasSuffix(f, ".pdf") && !bytes.HasPrefix(data, []byte("%PDF-")) {
			t.Errorf("%s: got %q, want a PDF", f, data[:8])
		}
	}
}

// TestSampleCountsFromStart: Sample reads the container's CPU time and
// memory at once, counted from Since; a restart starts the container
// anew, so its count starts again from a later Since (what a run's
// accounting relies on not to count twice or lose a restart's CPU).
func TestSampleCountsFromStart(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-sample"})
	m, ok := k.(sandbox.Meter)
	if !ok {
		t.Fatal("a Docker kernel is not a sandbox.Meter")
	}
	// A fixed amount of work and 200 MB kept alive.
	mustOK(t, k, "x = 0\nfor i in range(6_000_000):\n    x += i\nkeep = bytearray(200 << 20)\nfor i in range(0, len(keep), 4096):\n    keep[i] = 1")
	first, err := m.Sample(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if first.CPUTime <= 200*time.Millisecond || first.MemoryBytes < 200<<20 || first.Since.IsZero() || first.CPUPercent != -1 {
		t.Fatalf("after the work: got %+v, want CPU time past 0.2 s, 200 MB in use, a Since and no CPU share", first)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := m.Sample(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !after.Since.After(first.Since) || after.MemoryBytes >= first.MemoryBytes {
		t.Errorf("after a restart: got Since %v and %d bytes, want a later Since than %v and less than %d bytes", after.Since, after.MemoryBytes, first.Since, first.MemoryBytes)
	}
	t.Logf("CPU before the restart %v, after %v", first.CPUTime, after.CPUTime)
}
