package docker

import (
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/jupyter/jupytertest"
)

// kernelSockets are the sockets a cell can reach the host's connections
// to, with their paths inside the container (jupyter.NewConnInfo's ports).
var kernelSockets = []struct{ name, path string }{
	{"shell", ctrSockets + "/k-1"},
	{"iopub", ctrSockets + "/k-2"},
	{"control", ctrSockets + "/k-4"},
	{"hb", ctrSockets + "/k-5"},
}

// attackFrame is the frame size of the many-frame attack: 8 frames of it
// are 512 MiB, the message that raised the server's RSS by 533 MiB.
const attackFrame = 64 << 20

// wantReason is what kernel_died's reason must say for attack a on socket
// sock under the default limits (an 80 MiB message bound; 1 KiB on hb).
func wantReason(a jupytertest.Attack, sock string) string {
	prefix := "protocol violation on the " + sock + " socket: "
	switch {
	case a == jupytertest.HugeFrame:
		return prefix + "frame of 4611686018427387904 bytes over the"
	case a == jupytertest.Garbage:
		return prefix + "frame flags 0xde have reserved bits set"
	case a == jupytertest.Truncated:
		return prefix + "nothing received for 10s inside a message"
	case sock == "hb":
		return prefix + "frame of 67108864 bytes over the 1024-byte limit"
	default:
		return prefix + "message over the 83886080-byte limit: frame 2 of 67108864 bytes"
	}
}

// attack runs one hostile cell on victim and checks the outcome a run must
// see: kernel_died with the reason, a fresh kernel for its next cell, and
// the bystander's state untouched.
func attack(t *testing.T, victim, bystander sandbox.Kernel, a jupytertest.Attack, sock, path string) {
	t.Helper()
	mustOK(t, victim, "x = 5")
	res := run1(t, victim, jupytertest.Cell(a, path, attackFrame), 120*time.Second)
	if res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || !res.Restarted {
		t.Fatalf("got %s, want kernel_died and a restart", errSummary(res))
	}
	if want := wantReason(a, sock); !strings.HasPrefix(res.Error.Reason, want) {
		t.Errorf("reason: got %q, want it to start with %q", res.Error.Reason, want)
	}
	if !strings.Contains(res.Error.Evalue, res.Error.Reason) {
		t.Errorf("evalue %q does not give the reason %q", res.Error.Evalue, res.Error.Reason)
	}
	if r := run1(t, victim, "x", 30*time.Second); r.Error == nil || r.Error.Ename != "NameError" {
		t.Errorf("x after the attack: got %s, want NameError (a fresh kernel)", describe(r))
	}
	if got, want := value(t, run1(t, victim, "1 + 1", 30*time.Second)), "2"; got != want {
		t.Errorf("next cell: got %q, want %q", got, want)
	}
	if got, want := value(t, run1(t, bystander, "y", 30*time.Second)), "7"; got != want {
		t.Errorf("the other run's kernel: got y = %q, want %q", got, want)
	}
}

// TestHostileFrames: a cell writes a 2^62-byte frame header, garbage, or a
// truncated frame to the host's end of each kernel socket it can reach.
// The server (this process) stays up, the cell gets kernel_died with the
// reason, its run's next cell runs on a fresh kernel, and another run's
// kernel keeps its variables.
func TestHostileFrames(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	bystander := startKernel(t, b, sandbox.Spec{Owner: "run-bystander"})
	mustOK(t, bystander, "y = 7")
	for _, a := range []jupytertest.Attack{jupytertest.HugeFrame, jupytertest.Garbage, jupytertest.Truncated} {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			victim := startKernel(t, b, sandbox.Spec{Owner: "run-hostile"})
			for _, s := range kernelSockets {
				t.Run(s.name, func(t *testing.T) { attack(t, victim, bystander, a, s.name, s.path) })
			}
		})
	}
}

// TestHostileManyFrames: one message of 8 frames of 64 MiB (views of one
// buffer in the cell) on each kernel socket is refused at the frame that
// would take it past the 80 MiB message bound, before that frame is read,
// and the test process's peak RSS grows by less than that bound. Not
// parallel, so that no other test's memory is counted.
func TestHostileManyFrames(t *testing.T) {
	b := newBackend(t, Config{})
	bound := kernelLimits(b.cfg.Defaults.OutputBytes).MaxMessage
	bystander := startKernel(t, b, sandbox.Spec{Owner: "run-bystander"})
	mustOK(t, bystander, "y = 7")
	victim := startKernel(t, b, sandbox.Spec{Owner: "run-hostile"})
	for _, s := range kernelSockets {
		t.Run(s.name, func(t *testing.T) {
			runtime.GC()
			debug.FreeOSMemory()
			resetPeakRSS(t)
			before := procStatus(t, "VmRSS")
			attack(t, victim, bystander, jupytertest.ManyFrames, s.name, s.path)
			grew := procStatus(t, "VmHWM") - before
			t.Logf("peak RSS grew by %d MiB (bound %d MiB)", grew>>20, bound>>20)
			if grew > bound {
				t.Errorf("peak RSS grew by %d bytes, want at most the %d-byte message bound", grew, bound)
			}
		})
	}
}

// resetPeakRSS resets this process's VmHWM to its current RSS
// (proc(5), /proc/pid/clear_refs, value 5).
func resetPeakRSS(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset peak RSS: %v", err)
	}
}

// procStatus returns a memory field of /proc/self/status, in bytes.
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	f, err := procmem.Status(0)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := f[field]
	if !ok {
		t.Fatalf("no %s in /proc/self/status", field)
	}
	return v
}
