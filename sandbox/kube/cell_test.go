package kube_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
)

// TestCellRunner: kube runs cells through the same runner as Docker
// (sandbox/internal/jupytercell), so what Docker's tests hold holds here
// too. Output arrives message by message, each message its own event, and
// a sink that applies EventClear ends with what a notebook shows; a setup
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

	plain := func(t *testing.T, bs []sandbox.Bundle) []string {
		t.Helper()
		var out []string
		for _, b := range bs {
			var s string
			if err := json.Unmarshal(b.Data["text/plain"], &s); err != nil {
				t.Fatalf("text/plain of %v: %v", b.Data, err)
			}
			out = append(out, s)
		}
		return out
	}
	for _, tc := range []struct {
		name, code string
		stdout     string
		displays   []string
		events     []sandbox.EventKind
	}{
		{"update in place", "h = display('one', display_id=True)\ndisplay('other')\nprint('p', flush=True)\nh.update('two')",
			"p\n", []string{"'two'", "'other'"},
			[]sandbox.EventKind{sandbox.EventDisplay, sandbox.EventDisplay, sandbox.EventStdout, sandbox.EventClear, sandbox.EventDisplay, sandbox.EventDisplay}},
		{"update of an earlier cell's display", "h.update('three')",
			"", []string{"'three'"}, []sandbox.EventKind{sandbox.EventDisplay}},
		{"clear_output", "from IPython.display import clear_output\nprint('a', flush=True)\ndisplay('d')\nclear_output()\nprint('b')",
			"a\nb\n", nil, []sandbox.EventKind{sandbox.EventStdout, sandbox.EventDisplay, sandbox.EventClear, sandbox.EventStdout}},
		// Each flushed print is its own event; ipykernel's own flush timer
		// may also split a print from its newline, so there can be more.
		{"every print its own event", "for i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
			"0\n1\n2\n", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []sandbox.EventKind
			var col sandbox.Collector
			res, err := k.Execute(t.Context(), sandbox.Cell{Code: tc.code, Timeout: time.Minute, Output: func(e sandbox.Event) {
				events = append(events, e.Kind)
				col.Add(e)
			}})
			if err != nil || !res.OK {
				t.Fatalf("got %+v, %v", res, err)
			}
			if got := col.Stdout.String(); got != tc.stdout {
				t.Errorf("stdout: got %q, want %q", got, tc.stdout)
			}
			if got := plain(t, col.Display); !slices.Equal(got, tc.displays) {
				t.Errorf("displays: got %q, want %q", got, tc.displays)
			}
			if tc.events == nil {
				// Streams only, at least one event per print.
				if len(events) < 3 || slices.ContainsFunc(events, func(k sandbox.EventKind) bool { return k != sandbox.EventStdout }) {
					t.Errorf("events: got %v, want three or more stdout events", events)
				}
			} else if !slices.Equal(events, tc.events) {
				t.Errorf("events: got %v, want %v", events, tc.events)
			}
		})
	}

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
