package orchestrator_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// A cell printing without end gets its own error kind, output_limit, with a
// message and a suggestion; the stdout kept as a run file is no larger than
// the limit; and the run's kernel keeps working.
func TestExecOutputLimit(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	run := runid.New()
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "x = 21"}); err != nil {
		t.Fatal(err)
	}
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "while True:\n    print('x' * 10000)", TimeoutS: ptr(300.0)})
	if err != nil {
		t.Fatal(err)
	}
	if out.OK || out.Error == nil || out.Error.Kind != sandbox.KindOutputLimit {
		t.Fatalf("got ok=%v error %+v, want kind %s", out.OK, out.Error, sandbox.KindOutputLimit)
	}
	if out.Error.Message == "" || !strings.Contains(out.Error.Suggestion, "file") {
		t.Errorf("error: got message %q suggestion %q, want both, the suggestion pointing to files", out.Error.Message, out.Error.Suggestion)
	}
	if out.StdoutFile == nil || out.StdoutFile.Size > sandbox.DefaultOutputBytes || out.StdoutFile.Size < sandbox.DefaultOutputBytes/2 {
		t.Errorf("stdout file: got %+v, want at most the %d-byte limit", out.StdoutFile, sandbox.DefaultOutputBytes)
	}
	again, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "x * 2"})
	if err != nil || !again.OK || again.Result == nil || again.Result.Data["text/plain"] != "42" {
		t.Errorf("after the flood: got %+v, %v, want 42 (the kernel kept its state)", again.Result, err)
	}
}
func ptr[T any](v T) *T { return &v }

// ExecStream hands the caller every piece of output as it arrives, and the
// events add up to the answer; a stream over the cap is kept whole as a run
// file (spooled, not held), its answer cut at the cap.
func TestExecStream(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	run := runid.New()
	var events []orchestrator.ExecEvent
	code := "import sys\nfor i in range(3):\n    print(i)\nprint('oops', file=sys.stderr)\nprint('x' * 200000)\n6 * 7"
	out, err := s.Orch.ExecStream(ctx, run, wire.ExecRequest{Code: code}, func(e orchestrator.ExecEvent) { events = append(events, e) })
	if err != nil || !out.OK {
		t.Fatalf("exec: %+v %v", out, err)
	}
	var stdout, stderr strings.Builder
	var result *wire.Bundle
	for _, e := range events {
		switch e.Type {
		case wire.EventStdout:
			stdout.WriteString(e.Text)
		case wire.EventStderr:
			stderr.WriteString(e.Text)
		case wire.EventResult:
			result = e.Bundle
		}
	}
	full := "0\n1\n2\n" + strings.Repeat("x", 200000) + "\n"
	if stdout.String() != full || stderr.String() != "oops\n" {
		t.Errorf("events: got stdout of %d bytes, stderr %q; want %d bytes and oops", stdout.Len(), stderr.String(), len(full))
	}
	if result == nil || result.Data["text/plain"] != "42" || out.Result == nil || out.Result.Data["text/plain"] != "42" {
		t.Errorf("result: event %+v, answer %+v; want 42", result, out.Result)
	}
	if !out.Truncated || out.Stdout != full[:64<<10] || out.StdoutFile == nil || out.StdoutFile.Size != int64(len(full)) {
		t.Fatalf("answer: truncated=%v stdout %d bytes, file %+v; want the first 64 KiB and a file of %d", out.Truncated, len(out.Stdout), out.StdoutFile, len(full))
	}
	b, f, err := s.Store.ReadAll(ctx, run, out.StdoutFile.Path)
	if err != nil || string(b) != full || f.SHA256 != out.StdoutFile.SHA256 {
		t.Errorf("stdout file: %d bytes, %v; want the full stream", len(b), err)
	}
}

// A run's calls say when a cell ran in a new interpreter: its first cell,
// and the first after its kernel was replaced (here: stopped, as an idle
// kernel or a server restart leaves it), so the timeline can show that
// earlier variables are gone.
func TestCallsMarkAReplacedKernel(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	run := runid.New()
	for _, code := range []string{"x = 1", "x + 1"} {
		if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: code}); err != nil {
			t.Fatal(err)
		}
	}
	s.Kernels.Drop(run)
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "y = 2"}); err != nil {
		t.Fatal(err)
	}
	calls := runCalls(t, s, run)
	var fresh []bool
	for _, c := range calls {
		fresh = append(fresh, c.FreshKernel)
	}
	if want := []bool{true, false, true}; !slices.Equal(fresh, want) {
		t.Errorf("fresh_kernel of the calls: got %v, want %v", fresh, want)
	}
}
