package docker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// TestPidGate feeds the writers as the engine may on a loaded machine: the
// command's first stdout before the supervisor's pid line on stderr. The
// pid is told before any output is handed on, and nothing is lost or
// reordered within a stream (the CI deadlock of stop 34: commands.run with
// stdin waited for the pid while the command's output waited for it).
func TestPidGate(t *testing.T) {
	var log []string
	m := emit.New(0, func(e sandbox.Event) { log = append(log, fmt.Sprintf("%s %q", e.Kind, e.Text)) })
	gate := &pidGate{limit: 1 << 10}
	stdout := &eventWriter{kind: sandbox.EventStdout, m: m, over: func() { t.Error("over the limit") }, gate: gate}
	stderr := &eventWriter{kind: sandbox.EventStderr, m: m, over: func() { t.Error("over the limit") }, marker: func(pid int) {
		log = append(log, fmt.Sprintf("pid %d", pid))
		gate.release(stdout)
	}}
	for _, w := range []struct {
		to   *eventWriter
		text string
	}{{stdout, "motd\n"}, {stdout, "more "}, {stderr, pidMarker + "42\nwarn\n"}, {stdout, "after\n"}} {
		if _, err := w.to.Write([]byte(w.text)); err != nil {
			t.Fatal(err)
		}
	}
	stderr.flush()
	stdout.flush()
	want := []string{"pid 42", `stdout "motd\nmore "`, `stderr "warn\n"`, `stdout "after\n"`}
	if !slices.Equal(log, want) {
		t.Errorf("got %q, want %q", log, want)
	}

	// A stream that ends without a pid line still releases what it held,
	// after the pid 0 that says the command never ran.
	log = nil
	gate = &pidGate{limit: 1 << 10}
	stdout = &eventWriter{kind: sandbox.EventStdout, m: m, over: func() {}, gate: gate}
	stderr = &eventWriter{kind: sandbox.EventStderr, m: m, over: func() {}, marker: func(pid int) {
		log = append(log, fmt.Sprintf("pid %d", pid))
		gate.release(stdout)
	}}
	stdout.Write([]byte("orphan\n"))
	stderr.flush()
	stdout.flush()
	if want := []string{"pid 0", `stdout "orphan\n"`}; !slices.Equal(log, want) {
		t.Errorf("no pid line: got %q, want %q", log, want)
	}

	// Held output past the kernel's limit stops the command.
	stopped := false
	gate = &pidGate{limit: 8}
	stdout = &eventWriter{kind: sandbox.EventStdout, m: m, over: func() { stopped = true }, gate: gate}
	stdout.Write([]byte("0123456789"))
	if !stopped || len(gate.held) != 0 {
		t.Errorf("10 bytes held at a limit of 8: stopped %v, held %q", stopped, gate.held)
	}
}
