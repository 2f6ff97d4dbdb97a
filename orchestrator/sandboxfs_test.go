package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// sandbox.fs reaches the sandbox's own filesystem outside the run's
// files: a command and a cell see what it wrote, each call is a Step
// Block, a read with no kernel finds nothing without starting one, and the
// run's files, the read-only root and a symlink into the run's files are
// refused with a fault a caller can act on.
func TestSandboxFS(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Warm: 1})
	ctx := t.Context()
	run := runid.New()

	if _, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSRead, Path: "/tmp/x/README.md"}); fault.From(err).Kind != fault.NotFound {
		t.Fatalf("a read before any kernel: got %v, want not_found", err)
	}
	if _, live, err := s.Orch.Usage(ctx, run); err != nil || live {
		t.Fatalf("a read with no kernel started one (live %v, %v)", live, err)
	}
	res, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "/tmp/x/README.md", Body: strings.NewReader("hello\n")})
	if err != nil || res.Entry.Size != 6 {
		t.Fatalf("write: got %+v, %v; want a 6-byte file", res.Entry, err)
	}
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Language: "bash", Code: "cat /tmp/x/README.md && git -C /tmp/x init -q && git -C /tmp/x add README.md && git -C /tmp/x status --short"})
	if err != nil || !out.OK || out.Stdout != "hello\nA  README.md\n" {
		t.Fatalf("a command reads it and git stages it: got %+v, %v", out, err)
	}
	out, err = s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "print(open('/tmp/x/README.md').read(), end='')"})
	if err != nil || out.Stdout != "hello\n" {
		t.Fatalf("a cell reads it: got %+v, %v", out, err)
	}
	if res, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSStat, Path: "/tmp/x/.git"}); err != nil || res.Entry.Type != "dir" {
		t.Errorf("stat of the repository git made: got %+v, %v", res.Entry, err)
	}
	if res, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSRead, Path: "/tmp/x/README.md"}); err != nil || string(res.Data) != "hello\n" {
		t.Errorf("read: got %q, %v", res.Data, err)
	}
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Language: "bash", Code: "ln -s /home/user /tmp/x/home"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  orchestrator.FSRequest
		kind fault.Kind
	}{
		{orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "/home/user/a.txt"}, fault.PermissionDenied},
		{orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "/tmp/x/home/a.txt"}, fault.PermissionDenied},
		{orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "/etc/a.txt"}, fault.PermissionDenied},
		{orchestrator.FSRequest{Op: orchestrator.FSRead, Path: "/tmp/x/missing"}, fault.NotFound},
		{orchestrator.FSRequest{Op: orchestrator.FSRead, Path: "/tmp/x"}, fault.BadInput},
		{orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "tmp/a.txt"}, fault.BadInput},
		{orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: "/tmp/../etc/a"}, fault.BadInput},
		{orchestrator.FSRequest{Op: "chmod", Path: "/tmp/a"}, fault.BadInput},
	} {
		if _, err := s.Orch.SandboxFS(ctx, run, c.req); fault.From(err).Kind != c.kind {
			t.Errorf("%s %s: got %v, want %s", c.req.Op, c.req.Path, err, c.kind)
		}
	}
	if _, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSRemove, Path: "/tmp/x"}); err != nil {
		t.Errorf("remove: %v", err)
	}
	if _, err := s.Orch.SandboxFS(ctx, run, orchestrator.FSRequest{Op: orchestrator.FSRemove, Path: "/tmp/x"}); err != nil {
		t.Errorf("remove of a missing path (removed already, as envd answers): %v", err)
	}
	cel := string(journal(t, s, run))
	for _, want := range []string{"sandbox.fs", "Wrote /tmp/x/README.md (6 bytes)", "has no kernel running"} {
		if !strings.Contains(cel, want) {
			t.Errorf("the journal lacks %q:\n%s", want, cel)
		}
	}
}
