package docker

import (
	"bytes"
	"testing"

	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// A command's stream as docker sends it when the supervisor's pid line and
// the command's first stderr share a frame and stdout comes after: every
// byte of both streams reaches the events. (The stderr writer once
// answered a short write for that frame, and stdcopy dropped the rest: a
// quick command's stdout was lost, 4 of 300 at four at once.)
func TestEventWriterTakesWholeFrames(t *testing.T) {
	var stream bytes.Buffer
	errw := stdcopy.NewStdWriter(&stream, stdcopy.Stderr)
	outw := stdcopy.NewStdWriter(&stream, stdcopy.Stdout)
	for _, f := range []struct {
		w interface{ Write([]byte) (int, error) }
		s string
	}{{errw, pidMarker + "536\noops\n"}, {outw, "hi\n"}, {errw, "more\n"}} {
		if _, err := f.w.Write([]byte(f.s)); err != nil {
			t.Fatal(err)
		}
	}
	var out, errs bytes.Buffer
	pid := -1
	m := emit.New(0, func(e sandbox.Event) {
		if e.Kind == sandbox.EventStdout {
			out.WriteString(e.Text)
		} else {
			errs.WriteString(e.Text)
		}
	})
	stdout := &eventWriter{kind: sandbox.EventStdout, m: m, over: func() {}}
	stderr := &eventWriter{kind: sandbox.EventStderr, m: m, over: func() {}, marker: func(p int) { pid = p }}
	if _, err := stdcopy.StdCopy(stdout, stderr, &stream); err != nil {
		t.Fatalf("StdCopy: %v", err)
	}
	stdout.flush()
	stderr.flush()
	if pid != 536 || out.String() != "hi\n" || errs.String() != "oops\nmore\n" {
		t.Errorf("got pid %d, stdout %q, stderr %q; want 536, \"hi\\n\", \"oops\\nmore\\n\"", pid, out.String(), errs.String())
	}
}
