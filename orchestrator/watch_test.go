package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// WorkingFiles shows the run's files from the store and, once a kernel is
// live, from its directory; it is no call, and it is the caller's run only.
func TestWorkingFiles(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := s.Ctx(t)
	run := runid.New()
	if err := s.Orch.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	text := "one"
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "d/a.txt", Text: &text}); err != nil {
		t.Fatal(err)
	}
	files, err := s.Orch.WorkingFiles(ctx, run, "d")
	if err != nil {
		t.Fatal(err)
	}
	a, ok := files["d/a.txt"]
	if len(files) != 1 || !ok || a.File.SHA256.IsZero() || a.Size != 3 || a.Stamp != "" {
		t.Fatalf("no kernel yet: got %+v, want d/a.txt from the store only", files)
	}
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "open('d/b.txt', 'w').write('bee')"})
	if err != nil || !out.OK {
		t.Fatalf("exec: %v %+v", err, out.Error)
	}
	steps := func() int {
		t.Helper()
		// A call waits for the previous one's recording: this read sees
		// every step before it, not its own.
		cel, err := s.Orch.Read(ctx, run, "CEL.md")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(*cel.Text, "\n## Step ")
	}
	before := steps()
	for range 3 {
		files, err = s.Orch.WorkingFiles(ctx, run, "")
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"d/a.txt", "d/b.txt", "CEL.md"} {
		if f, ok := files[p]; !ok || f.Stamp == "" {
			t.Errorf("%s with a live kernel: got %+v, want it with the kernel's stamp", p, f)
		}
	}
	if after := steps(); after != before+1 {
		t.Errorf("steps: got %d, want %d (the first read's only: WorkingFiles is no call)", after, before+1)
	}

	other := auth.With(ctx, auth.Principal{KeyID: "k2", Name: "other", Tenant: "other", Scopes: []auth.Scope{auth.Runs}})
	if _, err := s.Orch.WorkingFiles(other, run, ""); kindOf(err) != fault.NotFound {
		t.Errorf("another tenant: got %v, want not_found", err)
	}
	if _, err := s.Orch.WorkingFiles(ctx, run, "../x"); kindOf(err) != fault.BadInput {
		t.Errorf("a bad prefix: got %v, want bad_input", err)
	}
}

func kindOf(err error) fault.Kind {
	if fe := fault.As(err); fe != nil {
		return fe.Kind
	}
	return ""
}
