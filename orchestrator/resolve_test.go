package orchestrator_test

import (
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// A warm sandbox.exec resolves its run's owner once: the call's resolve
// looks it up, and nothing the tool does looks it up again (issue 23's
// guide: before, a warm exec looked it up four times).
func TestWarmExecResolvesOnce(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := s.Ctx(t)
	run := runid.New()
	if err := s.Orch.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	// The first cell starts the kernel (its quota counts the tenants of
	// the live kernels); the second is warm.
	for i, code := range []string{"x = 1", "x + 1"} {
		before := s.Orch.OwnerLookups()
		out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: code})
		if err != nil {
			t.Fatal(err)
		}
		if !out.OK {
			t.Fatalf("cell %d: %+v", i, out.Error)
		}
		if i == 0 {
			continue
		}
		if got := s.Orch.OwnerLookups() - before; got != 1 {
			t.Errorf("a warm exec looked its owner up %d times, want 1", got)
		}
	}
}
