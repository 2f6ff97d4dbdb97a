package sandboxtest

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// Escape-class probes: what only a second kernel (gVisor) hides, and what
// Triad's seccomp profile refuses under either runtime. Docker
// (sandbox/docker) and Kubernetes (sandbox/kube) run the same probes under
// runc and under runsc through RunEscape.

// Runtimes the probes name: runc (the host's kernel behind Triad's seccomp
// profile) and runsc (gVisor).
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
)

// An EscapeProbe is one thing a cell must not learn or do. Needs names the
// runtime that stops it: "runsc" for what only a second kernel hides (the
// host's /proc, /sys, kernel version and modules, which runc shows to every
// container), "runc or runsc" for what Triad's seccomp profile refuses under
// both (and, under gVisor, a kernel that is not the host's serves anyway).
type EscapeProbe struct {
	Name  string
	Needs string
	// Held says whether the probe's outcome is the safe one, from what the
	// cell saw and what the host knows; why says what the cell saw.
	Held func(seen CellView, host HostView) (ok bool, why string)
}

// CellView is what EscapeCell prints from inside a kernel.
type CellView struct {
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

// HostView is the same facts read on the host (the node), by the test.
type HostView struct {
	BootID, Release, Cmdline string
	SysBlock, SysModule      []string
}

// escapeCalls are the syscalls a cell tries, with arguments a permitted
// call would reject with some other errno, so that EPERM can only come
// from the seccomp profile. The ptrace target is the cell's parent: another
// process, as an attacker would pick.
var escapeCalls = []struct{ name, args string }{
	{"keyctl", "0, -3, 0, 0, 0"}, // KEYCTL_GET_KEYRING_ID of the session keyring
	{"add_key", "0, 0, 0, 0, 0"}, //
	{"perf_event_open", "0, 0, -1, -1, 0"},
	{"userfaultfd", "0,"},
	{"bpf", "0, 0, 0"},
	{"ptrace", "16, os.getppid(), 0, 0"}, // PTRACE_ATTACH
}

// escapeNumbers are their syscall numbers per GOARCH (Linux
// arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h
// for arm64).
var escapeNumbers = map[string]map[string]int{
	"amd64": {"keyctl": 250, "add_key": 248, "perf_event_open": 298, "userfaultfd": 323, "bpf": 321, "ptrace": 101},
	"arm64": {"keyctl": 219, "add_key": 217, "perf_event_open": 241, "userfaultfd": 282, "bpf": 280, "ptrace": 117},
}

// EscapeCell is the Python cell that gathers a CellView and prints it as
// one JSON line.
func EscapeCell(t testing.TB) string {
	t.Helper()
	nums, ok := escapeNumbers[runtime.GOARCH]
	if !ok {
		t.Fatalf("no syscall numbers for %s; add them to escapeNumbers", runtime.GOARCH)
	}
	var calls strings.Builder
	for _, c := range escapeCalls {
		fmt.Fprintf(&calls, "    (%q, %d, (%s)),\n", c.name, nums[c.name], c.args)
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

// ParseCellView reads what EscapeCell printed.
func ParseCellView(t testing.TB, out string) CellView {
	t.Helper()
	var v CellView
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &v); err != nil {
		t.Fatalf("the escape probe printed %q: %v", out, err)
	}
	return v
}

// ReadHost reads the HostView of this machine, which must be the node the
// kernels run on.
func ReadHost(t testing.TB) HostView {
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
	return HostView{BootID: rd("/proc/sys/kernel/random/boot_id"), Release: string(rel), Cmdline: rd("/proc/cmdline"),
		SysBlock: ls("/sys/block"), SysModule: ls("/sys/module")}
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

func refused(calls ...string) func(CellView, HostView) (bool, string) {
	return func(seen CellView, _ HostView) (bool, string) {
		ok := true
		var why []string
		for _, c := range calls {
			got := seen.Calls[c]
			ok = ok && got == "Operation not permitted"
			why = append(why, c+": "+got)
		}
		return ok, strings.Join(why, ", ")
	}
}

// EscapeProbes are the escape-class probes.
var EscapeProbes = []EscapeProbe{
	{"host proc hidden", RuntimeRunsc, func(seen CellView, host HostView) (bool, string) {
		why := fmt.Sprintf("boot_id %q (host %q), %d bytes of /proc/kallsyms, /proc/cmdline %q", seen.BootID, host.BootID, seen.Kallsyms, seen.Cmdline)
		return seen.BootID != host.BootID && seen.Kallsyms == 0 && seen.Cmdline != host.Cmdline, why
	}},
	{"host sys hidden", RuntimeRunsc, func(seen CellView, host HostView) (bool, string) {
		both := shared(seen.SysBlock, host.SysBlock)
		return len(both) == 0 && len(seen.SysKernel) == 0, fmt.Sprintf("/sys/block shows the host's %q; /sys/kernel lists %d entries", both, len(seen.SysKernel))
	}},
	{"host kernel version hidden", RuntimeRunsc, func(seen CellView, host HostView) (bool, string) {
		return seen.Release != host.Release && !strings.Contains(seen.Version, host.Release), fmt.Sprintf("uname -r %q (host %q), /proc/version %q", seen.Release, host.Release, strings.TrimSpace(seen.Version))
	}},
	{"host modules hidden", RuntimeRunsc, func(seen CellView, host HostView) (bool, string) {
		both := shared(seen.SysModule, host.SysModule)
		return len(both) == 0 && strings.TrimSpace(seen.Modules) == "", fmt.Sprintf("/sys/module shows %d of the host's modules, /proc/modules %d bytes", len(both), len(seen.Modules))
	}},
	{"kernel keyrings unavailable", "runc or runsc", refused("keyctl", "add_key")},
	{"perf_event_open unavailable", "runc or runsc", refused("perf_event_open")},
	{"userfaultfd unavailable", "runc or runsc", refused("userfaultfd")},
	{"bpf unavailable", "runc or runsc", refused("bpf")},
	{"ptrace of another process unavailable", "runc or runsc", refused("ptrace")},
}

// RunEscape checks every probe against the views a kernel under each
// runtime printed (views is keyed by RuntimeRunc and RuntimeRunsc; both
// must be there). A probe that needs runsc must hold under runsc; under
// runc its subtest asserts the runc outcome instead (the host's facts are
// visible), so it runs green under both and proves it can fail. A probe
// that either runtime stops must hold under both. Subtests are named
// "<probe> (needs <runtime>)/<runtime>".
func RunEscape(t *testing.T, views map[string]CellView, host HostView) {
	t.Helper()
	for _, p := range EscapeProbes {
		t.Run(fmt.Sprintf("%s (needs %s)", p.Name, p.Needs), func(t *testing.T) {
			for _, rt := range []string{RuntimeRunc, RuntimeRunsc} {
				t.Run(rt, func(t *testing.T) {
					seen, ok := views[rt]
					if !ok {
						t.Fatalf("no view from a kernel under %s", rt)
					}
					held, why := p.Held(seen, host)
					switch {
					case held && rt == RuntimeRunc && p.Needs == RuntimeRunsc:
						t.Errorf("runc outcome: got %s, want the host's facts visible under runc (only a second kernel hides them; if runc hides them now, move the probe to \"runc or runsc\")", why)
					case !held && (rt == RuntimeRunsc || p.Needs != RuntimeRunsc):
						t.Errorf("escape: got %s under %s", why, rt)
					default:
						t.Logf("%s: %s", rt, why)
					}
				})
			}
		})
	}
}
