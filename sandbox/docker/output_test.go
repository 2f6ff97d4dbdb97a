package docker

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// TestDisplayBookkeeping: output arrives message by message, yet a sink
// that applies EventClear ends with the displays a notebook shows: an
// update of a display this cell showed replaces it in place (EventClear,
// then the cell's displays again), clear_output erases the displays,
// clear_output(wait=True) waits for the next output, and an update of an
// earlier cell's display shows as a new display. Streams are never taken
// back, so stdout is whole.
func TestDisplayBookkeeping(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-displays"})
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
		{"clear_output wait", "from IPython.display import clear_output\nfor i in range(3):\n    clear_output(wait=True)\n    display(i)",
			"", []string{"2"}, nil},
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
			if tc.events != nil && !slices.Equal(events, tc.events) {
				t.Errorf("events: got %v, want %v", events, tc.events)
			}
		})
	}
}
