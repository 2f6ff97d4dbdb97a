package sandboxtest

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// RunDisplays checks a Jupyter kernel's output bookkeeping on k, a kernel
// whose earlier cells this test may not depend on: output arrives message
// by message, each flushed print its own event, yet a sink that applies
// EventClear ends with the displays a notebook shows. An update of a
// display this cell showed replaces it in place (EventClear, then the
// cell's displays again), clear_output erases the displays,
// clear_output(wait=True) waits for the next output, and an update of an
// earlier cell's display shows as a new display. Streams are never taken
// back, so stdout is whole. The IPython backends (Docker, Kubernetes) call
// it; they share one cell runner, and this holds them to it.
func RunDisplays(t *testing.T, k sandbox.Kernel) {
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
		events     []sandbox.EventKind // the events in order, if set
		prints     int                 // else, if set: stdout events only, at least this many
	}{
		{"update in place", "h = display('one', display_id=True)\ndisplay('other')\nprint('p', flush=True)\nh.update('two')",
			"p\n", []string{"'two'", "'other'"},
			[]sandbox.EventKind{sandbox.EventDisplay, sandbox.EventDisplay, sandbox.EventStdout, sandbox.EventClear, sandbox.EventDisplay, sandbox.EventDisplay}, 0},
		{"update of an earlier cell's display", "h.update('three')",
			"", []string{"'three'"}, []sandbox.EventKind{sandbox.EventDisplay}, 0},
		{"clear_output", "from IPython.display import clear_output\nprint('a', flush=True)\ndisplay('d')\nclear_output()\nprint('b')",
			"a\nb\n", nil, []sandbox.EventKind{sandbox.EventStdout, sandbox.EventDisplay, sandbox.EventClear, sandbox.EventStdout}, 0},
		{"clear_output wait", "from IPython.display import clear_output\nfor i in range(3):\n    clear_output(wait=True)\n    display(i)",
			"", []string{"2"}, nil, 0},
		// ipykernel's own flush timer may also split a print from its
		// newline, so there can be more events than prints.
		{"every print its own event", "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
			"0\n1\n2\n", nil, nil, 3},
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
			switch {
			case tc.events != nil:
				if !slices.Equal(events, tc.events) {
					t.Errorf("events: got %v, want %v", events, tc.events)
				}
			case tc.prints > 0:
				if len(events) < tc.prints || slices.ContainsFunc(events, func(k sandbox.EventKind) bool { return k != sandbox.EventStdout }) {
					t.Errorf("events: got %v, want %d or more stdout events", events, tc.prints)
				}
			}
		})
	}
}
