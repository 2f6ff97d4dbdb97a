package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
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
