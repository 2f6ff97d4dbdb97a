package docker

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/triadhq/triad/sandbox"
)

var updateSeccomp = flag.Bool("update-seccomp", false, "rewrite seccomp.json from the Docker default in testdata")

// seccompDenied are the syscalls Triad's profile refuses with EPERM, on top
// of what Docker's default refuses (docs/DECISIONS.md, "Triad's seccomp
// profile"). Docker 20.10's default allows the first four to every
// container; the others it allows only with a capability a kernel never
// has (CapDrop ALL), or not at all, and they are listed so that the
// refusal does not hang on the capability set.
var seccompDenied = []string{
	// The kernel's asynchronous I/O ring: the syscall family behind most
	// recent container escapes. Plain read/write and epoll do the same
	// work for Python.
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// Tracing and reading other processes' memory: a debugger's tools, not
	// an analysis cell's; and ptrace was once a way around seccomp itself.
	"ptrace", "process_vm_readv", "process_vm_writev",
	// Page-fault handling in user space, which makes kernel races easy to
	// win.
	"userfaultfd",
	// The kernel keyring, which is not namespaced.
	"keyctl", "add_key", "request_key",
	// eBPF programs and performance counters: kernel attack surface and
	// side channels.
	"bpf", "perf_event_open",
	// Loading a new kernel.
	"kexec_load", "kexec_file_load",
	// Opening files by handle bypasses the mount namespace's view of the
	// filesystem (the "shocker" escape).
	"open_by_handle_at",
}

// seccompNumbers are the syscall numbers of seccompDenied per GOARCH (Linux
// arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h
// for arm64).
var seccompNumbers = map[string]map[string]int{
	"amd64": {
		"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
		"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
		"userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
		"bpf": 321, "perf_event_open": 298, "kexec_load": 246, "kexec_file_load": 320,
		"open_by_handle_at": 304,
	},
	"arm64": {
		"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
		"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
		"userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
		"bpf": 280, "perf_event_open": 241, "kexec_load": 104, "kexec_file_load": 294,
		"open_by_handle_at": 265,
	},
}

// seccompProfile is the profile format moby reads (profiles/seccomp,
// Seccomp); fields Triad does not change stay raw.
type seccompProfile struct {
	DefaultAction   string          `json:"defaultAction"`
	DefaultErrnoRet *uint           `json:"defaultErrnoRet,omitempty"`
	ArchMap         json.RawMessage `json:"archMap"`
	Syscalls        []seccompRule   `json:"syscalls"`
}

type seccompRule struct {
	Names    []string        `json:"names"`
	Action   string          `json:"action"`
	ErrnoRet *uint           `json:"errnoRet,omitempty"`
	Args     json.RawMessage `json:"args"`
	Comment  string          `json:"comment"`
	Includes json.RawMessage `json:"includes"`
	Excludes json.RawMessage `json:"excludes"`
}

// deriveSeccomp makes Triad's profile from Docker's default: denied names
// leave every allow rule (rules left empty go), one rule refuses them with
// EPERM, and the default action's errno is EPERM explicitly (engines before
// 23.0 ignore defaultErrnoRet, and runc's default for SCMP_ACT_ERRNO is
// EPERM already).
func deriveSeccomp(base seccompProfile, denied []string) seccompProfile {
	eperm := uint(1)
	p := base
	p.DefaultErrnoRet = &eperm
	p.Syscalls = nil
	for _, r := range base.Syscalls {
		if r.Action == "SCMP_ACT_ALLOW" {
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return slices.Contains(denied, n) })
			if len(r.Names) == 0 {
				continue
			}
		}
		p.Syscalls = append(p.Syscalls, r)
	}
	return p.withRule(seccompRule{
		Names:    denied,
		Action:   "SCMP_ACT_ERRNO",
		ErrnoRet: &eperm,
		Args:     json.RawMessage("[]"),
		Comment:  "Triad: refused to analysis kernels; see docs/DECISIONS.md",
		Includes: json.RawMessage("{}"),
		Excludes: json.RawMessage("{}"),
	})
}

func (p seccompProfile) withRule(r seccompRule) seccompProfile {
	p.Syscalls = append(slices.Clone(p.Syscalls), r)
	return p
}

// TestSeccompProfile checks that the embedded profile is Docker 20.10's
// default with exactly the documented deltas, and that no allow rule
// names a denied syscall under any condition.
func TestSeccompProfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/moby-seccomp-default-20.10.24.json")
	if err != nil {
		t.Fatal(err)
	}
	var base seccompProfile
	if err := json.Unmarshal(data, &base); err != nil {
		t.Fatal(err)
	}
	want, err := json.MarshalIndent(deriveSeccomp(base, seccompDenied), "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *updateSeccomp {
		if err := os.WriteFile("seccomp.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(seccompJSON, want) {
		t.Fatalf("seccomp.json is not the Docker default minus seccompDenied; regenerate it with go test ./sandbox/docker -run TestSeccompProfile -args -update-seccomp")
	}
	var ours seccompProfile
	if err := json.Unmarshal(seccompJSON, &ours); err != nil {
		t.Fatal(err)
	}
	for _, r := range ours.Syscalls {
		for _, n := range r.Names {
			if r.Action != "SCMP_ACT_ERRNO" && slices.Contains(seccompDenied, n) {
				t.Errorf("%s is still allowed by a rule (%s, includes %s)", n, r.Action, r.Includes)
			}
		}
	}
	// The ones Docker allowed to every container are the point.
	for _, n := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace"} {
		allowed := false
		for _, r := range base.Syscalls {
			allowed = allowed || (r.Action == "SCMP_ACT_ALLOW" && slices.Contains(r.Names, n) && (string(r.Includes) == "{}" || strings.Contains(string(r.Includes), "minKernel")))
		}
		if !allowed {
			t.Errorf("%s: Docker's default does not allow it to every container, so the delta note in DECISIONS.md is wrong", n)
		}
	}
	if !strings.HasPrefix(seccompOpt, "seccomp={") || strings.Contains(seccompOpt, "\n") {
		t.Errorf("seccompOpt is %.40q…, want seccomp= and the compact profile", seccompOpt)
	}
}

// TestSeccompJail: in a kernel container every denied syscall fails with
// EPERM (io_uring and ptrace reach the kernel under Docker's own default),
// while what analysis needs (threads, subprocesses, multiprocessing, mmap,
// numpy) still works.
func TestSeccompJail(t *testing.T) {
	t.Parallel()
	nums, ok := seccompNumbers[runtime.GOARCH]
	if !ok {
		t.Fatalf("no syscall numbers for %s; add them to seccompNumbers", runtime.GOARCH)
	}
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-seccomp"})
	var calls strings.Builder
	for _, n := range seccompDenied {
		// Arguments a permitted call would reject with another errno (an
		// unknown ptrace request, null pointers), so EPERM can only come
		// from the filter or a missing capability.
		args := "0, 0, 0, 0, 0"
		if n == "ptrace" {
			args = "0xffff, 0, 0, 0"
		}
		fmt.Fprintf(&calls, "    (%q, %d, (%s)),\n", n, nums[n], args)
	}
	out := mustOK(t, k, `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, nr, args in [
`+calls.String()+`]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, r, os.strerror(ctypes.get_errno()) if r == -1 else "succeeded")
print("Seccomp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, n := range seccompDenied {
		if want := n + " -1 Operation not permitted"; i >= len(lines) || lines[i] != want {
			got := "nothing"
			if i < len(lines) {
				got = lines[i]
			}
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if got := lines[len(lines)-1]; got != "Seccomp 2" {
		t.Errorf("got %q, want Seccomp 2 (a filter is on)", got)
	}

	// What cells do all the time still works under the profile.
	if got, want := strings.TrimSpace(mustOK(t, k, `import subprocess, threading, multiprocessing, mmap, numpy as np
print(subprocess.run(["sh", "-c", "echo sub"], capture_output=True, text=True).stdout.strip())
t = threading.Thread(target=lambda: None); t.start(); t.join()
with multiprocessing.get_context("fork").Pool(2) as p:
    print(sum(p.map(abs, [-1, -2, 3])))
m = mmap.mmap(-1, 1 << 20); m[:5] = b"hello"; print(m[:5].decode())
print(int(np.arange(10).sum()))`)), "sub\n6\nhello\n45"; got != want {
		t.Errorf("everyday calls: got %q, want %q", got, want)
	}

}

// TestSeccompOCI: the profile as a Kubernetes node installs it (OCI form,
// resolved for a pod with no capabilities) allows nothing a capability
// gates (unshare, mount, setns; clone only without namespace flags),
// answers clone3 with ENOSYS and refuses Triad's denied calls with EPERM.
func TestSeccompOCI(t *testing.T) {
	t.Parallel()
	b, err := SeccompOCI("amd64")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultAction string   `json:"defaultAction"`
		Architectures []string `json:"architectures"`
		Syscalls      []struct {
			Names    []string          `json:"names"`
			Action   string            `json:"action"`
			ErrnoRet *uint             `json:"errnoRet"`
			Args     []json.RawMessage `json:"args"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" || !slices.Equal(p.Architectures, []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}) {
		t.Errorf("default %s, architectures %v", p.DefaultAction, p.Architectures)
	}
	rules := func(name string) (allow, allowIf int, errno []uint) {
		for _, r := range p.Syscalls {
			if !slices.Contains(r.Names, name) {
				continue
			}
			switch {
			case r.Action == "SCMP_ACT_ALLOW" && len(r.Args) == 0:
				allow++
			case r.Action == "SCMP_ACT_ALLOW":
				allowIf++
			case r.Action == "SCMP_ACT_ERRNO" && r.ErrnoRet != nil:
				errno = append(errno, *r.ErrnoRet)
			}
		}
		return
	}
	for _, n := range []string{"unshare", "mount", "setns", "sethostname", "chroot", "reboot", "syslog"} {
		if a, ai, _ := rules(n); a+ai > 0 {
			t.Errorf("%s is allowed (%d rules, %d with arguments); no capability is held", n, a, ai)
		}
	}
	if a, ai, _ := rules("clone"); a != 0 || ai != 1 {
		t.Errorf("clone: %d unconditional and %d argument rules, want only the one without namespace flags", a, ai)
	}
	if _, _, e := rules("clone3"); !slices.Equal(e, []uint{38}) {
		t.Errorf("clone3: errnos %v, want ENOSYS (38), so that glibc falls back to clone", e)
	}
	for _, n := range seccompDenied {
		if a, ai, e := rules(n); a+ai > 0 || !slices.Equal(e, []uint{1}) {
			t.Errorf("%s: allowed by %d rules, errnos %v; want EPERM only", n, a+ai, e)
		}
	}
	if a, _, _ := rules("arch_prctl"); a != 1 {
		t.Errorf("arch_prctl (amd64 only): %d allow rules, want 1", a)
	}
}
