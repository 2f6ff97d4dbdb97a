package kube_test

import (
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestCellRunner: kube runs cells through the same runner as Docker
// (sandbox/internal/jupytercell), so what Docker's tests hold holds here
// too. Output arrives message by message, each message its own event, and
// a sink that applies EventClear ends with what a notebook shows
// (sandboxtest.RunDisplays, as for Docker); a setup
// cell leaves the execution counter alone; threads a cell left running are
// reported, after a cell that raised (a probe asks) and after one stopped
// at its timeout.
func TestCellRunner(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{InterruptGrace: 10 * time.Second})
	k := startKernel(t, b, sandbox.Spec{Owner: "cellrunner"})

	res, err := k.Execute(t.Context(), sandbox.Cell{Code: "import os, threading, time\nseeded = 1", Timeout: time.Minute, Setup: true})
	if err != nil || !res.OK {
		t.Fatalf("setup cell: got %+v, %v", res, err)
	}
	res, _ = run(t, k, "seeded", time.Minute)
	if !res.OK || res.ExecutionCount != 1 {
		t.Errorf("first cell after a setup cell: got ok=%v count %d, want ok and 1", res.OK, res.ExecutionCount)
	}

	t.Run("displays", func(t *testing.T) { sandboxtest.RunDisplays(t, k) })

	res, _ = run(t, k, "threading.Thread(target=lambda: [time.sleep(0.02) for _ in iter(lambda: os.path.exists('stop'), True)], name='sleeper', daemon=True).start()\n1/0", time.Minute)
	if res.Error == nil || res.Error.Kind != sandbox.KindExecution || !slices.Equal(res.Threads, []string{"sleeper"}) {
		t.Errorf("raising cell: got %+v threads %q, want execution_error and [sleeper]", res.Error, res.Threads)
	}
	res, _ = run(t, k, "time.sleep(600)", 2*time.Second)
	if res.Error == nil || res.Error.Kind != sandbox.KindTimeout || res.Restarted || !slices.Equal(res.Threads, []string{"sleeper"}) {
		t.Errorf("timed-out cell: got %+v restarted=%v threads %q, want a timeout without a restart, and [sleeper]", res.Error, res.Restarted, res.Threads)
	}
	res, _ = run(t, k, "open('stop', 'w').close()\n[t.join() for t in threading.enumerate() if t.name == 'sleeper']", time.Minute)
	if !res.OK || res.Threads != nil {
		t.Errorf("after stopping it: got %+v threads %q, want ok and none", res.Error, res.Threads)
	}
}
