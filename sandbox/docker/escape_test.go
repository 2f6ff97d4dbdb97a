package docker

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestEscape runs each escape probe (sandboxtest.EscapeProbes) in a kernel
// under runc and under runsc (gVisor), the product's configuration either
// way (Triad's seccomp profile included); sandboxtest.RunEscape says what
// each runtime must show. sandbox/kube runs the same probes in pods.
func TestEscape(t *testing.T) {
	t.Parallel()
	host := sandboxtest.ReadHost(t)
	code := sandboxtest.EscapeCell(t)
	views := map[string]sandboxtest.CellView{}
	for _, rt := range []string{RuntimeRunc, RuntimeRunsc} {
		b := newBackend(t, Config{Runtime: rt})
		if got := b.Runtime(); got != rt {
			t.Fatalf("backend runtime: got %q, want %q", got, rt)
		}
		k := startKernel(t, b, sandbox.Spec{Owner: "run-escape-" + rt})
		views[rt] = sandboxtest.ParseCellView(t, mustOK(t, k, code))
	}
	sandboxtest.RunEscape(t, views, host)
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
