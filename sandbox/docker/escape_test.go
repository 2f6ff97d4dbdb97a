package docker

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/triadhq/triad/sandbox"
)

// An escapeProbe is one thing a cell must not learn or do. needs names the
// runtime that stops it: "runsc" for what only a second kernel hides (the
// host's /proc, /sys, kernel version and modules, which runc shows to every
// container), "runc or runsc" for what Triad's seccomp profile refuses under
// both (and, under gVisor, a kernel that is not the host's serves anyway).
type escapeProbe struct {
	name  string
	needs string
	// held says whether the probe's outcome is the safe one, from what the
	// cell saw and what the host knows; why says what the cell saw.
	held func(t *testing.T, seen cellView, host hostView) (ok bool, why string)
}

// cellView is what escapeCell reports from inside a kernel.
type cellView struct {
	BootID    string            `json:"boot_id"`
	Release   string            `json:"release"`
	Version   string            `json:"version"`
	Kallsyms  int               `json:"kallsyms"`
	Cmdline   string            `json:"cmdline"`
	SysBlock  []string          `json:"sys_block"`
	SysKernel []string          `json:"sys_kernel"`
	SysModule []string          `json:"sys_module"`
	Modules   string            `json:"modules"`
	Calls     map[string]string `json:"calls"`
}

// hostView is the same facts read on the host, by the test.
type hostView struct {
	bootID, release, cmdline string
	sysBlock, sysModule      []string
}

// escapeCalls are the syscalls a cell tries, with arguments a permitted
// call would reject with some other errno, so that EPERM can only come
// from the seccomp profile. The ptrace target is the cell's parent (the
// container's init): another process, as an attacker would pick.
var escapeCalls = []struct{ name, args string }{
	{"keyctl", "0, -3, 0, 0, 0"}, // KEYCTL_GET_KEYRING_ID of the session keyring
	{"add_key", "0, 0, 0, 0, 0"}, //
	{"perf_event_open", "0, 0, -1, -1, 0"},
	{"userfaultfd", "0,"},
	{"bpf", "0, 0, 0"},
	{"ptrace", "16, os.getppid(), 0, 0"}, // PTRACE_ATTACH
}

func escapeCell(t *testing.T) string {
	nums, ok := seccompNumbers[runtime.GOARCH]
	if !ok {
		t.Fatalf("no syscall numbers for %s; add them to seccompNumbers", runtime.GOARCH)
	}
	var calls strings.Builder
	for _, c := range escapeCalls {
		nr, ok := nums[c.name]
		if !ok {
			t.Fatalf("no syscall number for %s on %s", c.name, runtime.GOARCH)
		}
		fmt.Fprintf(&calls, "    (%q, %d, (%s)),\n", c.name, nr, c.args)
	}
	return `import ctypes, json, os
def ls(p):
    try: return sorted(os.listdir(p))
    except OSError: return []
def rd(p):
    try:
        with open(p) as f: return f.read()
    except OSError: return ""
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = {}
for name, nr, args in [
` + calls.String() + `]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    calls[name] = os.strerror(ctypes.get_errno()) if r == -1 else "succeeded"
print(json.dumps({"boot_id": rd("/proc/sys/kernel/random/boot_id").strip(), "release": os.uname().release,
    "version": rd("/proc/version"), "kallsyms": len(rd("/proc/kallsyms")), "cmdline": rd("/proc/cmdline").strip(),
    "sys_block": ls("/sys/block"), "sys_kernel": ls("/sys/kernel"), "sys_module": ls("/sys/module"),
    "modules": rd("/proc/modules"), "calls": calls}))`
}

func readHost(t *testing.T) hostView {
	t.Helper()
	rd := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s on the host: %v", p, err)
		}
		return strings.TrimSpace(string(b))
	}
	ls := func(p string) []string {
		es, _ := os.ReadDir(p)
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var rel []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	return hostView{bootID: rd("/proc/sys/kernel/random/boot_id"), release: string(rel), cmdline: rd("/proc/cmdline"),
		sysBlock: ls("/sys/block"), sysModule: ls("/sys/module")}
}

// shared returns the names both lists hold.
func shared(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func refused(call string) func(*testing.T, cellView, hostView) (bool, string) {
	return func(_ *testing.T, seen cellView, _ hostView) (bool, string) {
		got := seen.Calls[call]
		return got == "Operation not permitted", call + ": " + got
	}
}

var escapeProbes = []escapeProbe{
	{"host proc hidden", "runsc", func(_ *testing.T, seen cellView, host hostView) (bool, string) {
		why := fmt.Sprintf("boot_id %q (host %q), %d bytes of /proc/kallsyms, /proc/cmdline %q", seen.BootID, host.bootID, seen.Kallsyms, seen.Cmdline)
		return seen.BootID != host.bootID && seen.Kallsyms == 0 && seen.Cmdline != host.cmdline, why
	}},
	{"host sys hidden", "runsc", func(_ *testing.T, seen cellView, host hostView) (bool, string) {
		both := shared(seen.SysBlock, host.sysBlock)
		return len(both) == 0 && len(seen.SysKernel) == 0, fmt.Sprintf("/sys/block shows the host's %q; /sys/kernel lists %d entries", both, len(seen.SysKernel))
	}},
	{"host kernel version hidden", "runsc", func(_ *testing.T, seen cellView, host hostView) (bool, string) {
		return seen.Release != host.release && !strings.Contains(seen.Version, host.release), fmt.Sprintf("uname -r %q (host %q), /proc/version %q", seen.Release, host.release, strings.TrimSpace(seen.Version))
	}},
	{"host modules hidden", "runsc", func(_ *testing.T, seen cellView, host hostView) (bool, string) {
		both := shared(seen.SysModule, host.sysModule)
		return len(both) == 0 && strings.TrimSpace(seen.Modules) == "", fmt.Sprintf("/sys/module shows %d of the host's modules, /proc/modules %d bytes", len(both), len(seen.Modules))
	}},
	{"kernel keyrings unavailable", "runc or runsc", func(t *testing.T, seen cellView, host hostView) (bool, string) {
		ok1, why1 := refused("keyctl")(t, seen, host)
		ok2, why2 := refused("add_key")(t, seen, host)
		return ok1 && ok2, why1 + ", " + why2
	}},
	{"perf_event_open unavailable", "runc or runsc", refused("perf_event_open")},
	{"userfaultfd unavailable", "runc or runsc", refused("userfaultfd")},
	{"bpf unavailable", "runc or runsc", refused("bpf")},
	{"ptrace of another process unavailable", "runc or runsc", refused("ptrace")},
}

// TestEscape runs each escape probe in a kernel under runc and under runsc
// (gVisor), the product's configuration either way (Triad's seccomp
// profile included). A probe that needs runsc must hold under runsc; under
// runc its subtest asserts the runc outcome instead (the host's facts are
// visible), so it runs green under both and proves it can fail. A probe
// that either runtime stops must hold under both. Subtests are named
// "<probe> (needs <runtime>)/<runtime>".
func TestEscape(t *testing.T) {
	t.Parallel()
	host := readHost(t)
	code := escapeCell(t)
	views := map[string]cellView{}
	for _, rt := range []string{RuntimeRunc, RuntimeRunsc} {
		b := newBackend(t, Config{Runtime: rt})
		if got := b.Runtime(); got != rt {
			t.Fatalf("backend runtime: got %q, want %q", got, rt)
		}
		k := startKernel(t, b, sandbox.Spec{Owner: "run-escape-" + rt})
		var v cellView
		if out := mustOK(t, k, code); json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("%s: the probe printed %q", rt, out)
		}
		views[rt] = v
	}
	for _, p := range escapeProbes {
		t.Run(fmt.Sprintf("%s (needs %s)", p.name, p.needs), func(t *testing.T) {
			for _, rt := range []string{RuntimeRunc, RuntimeRunsc} {
				t.Run(rt, func(t *testing.T) {
					ok, why := p.held(t, views[rt], host)
					switch {
					case ok && rt == RuntimeRunc && p.needs == RuntimeRunsc:
						t.Errorf("runc outcome: got %s, want the host's facts visible under runc (only a second kernel hides them; if runc hides them now, move the probe to \"runc or runsc\")", why)
					case !ok && (rt == RuntimeRunsc || p.needs != RuntimeRunsc):
						t.Errorf("escape: got %s under %s", why, rt)
					default:
						t.Logf("%s: %s", rt, why)
					}
				})
			}
		})
	}
}

// TestOOMScoreAdj: every host process of a kernel's container runs with
// oom_score_adj 500 (under host memory pressure the sandbox dies before
// Triad does), and a cell cannot lower it. Under runc the kernel refuses a
// cell's write (lowering needs CAP_SYS_RESOURCE); under gVisor the write
// changes gVisor's own emulated value, which never reaches the host, so
// the host-side check is the one that matters under both.
func TestOOMScoreAdj(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-oom-score"})
	out := mustOK(t, k, `
def put(v):
    try:
        with open("/proc/self/oom_score_adj", "w") as f: f.write(str(v))
        return "wrote"
    except OSError as e:
        return e.strerror
print(put(-1000), open("/proc/self/oom_score_adj").read().strip())`)
	t.Logf("%s: a cell writing -1000 to its oom_score_adj: %s", b.Runtime(), strings.TrimSpace(out))
	info, err := b.cli.ContainerInspect(t.Context(), k.(*Kernel).containerID)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := cgroupProcs(info.State.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		if err != nil {
			continue // gone meanwhile
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if got := strings.TrimSpace(string(data)); got != "500" {
			t.Errorf("host process %d (%s): oom_score_adj %s, want 500", pid, strings.TrimSpace(string(cmd)), got)
		}
	}
	t.Logf("%d host processes checked", len(procs))
}
