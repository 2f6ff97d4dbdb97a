package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/sandbox/template/templatetest"
	"github.com/triadhq/triad/wire"
)

// TestTemplateRunAndReplay: a run of a template with an extra Debian
// package, a wheel from a wheelhouse and a placed file has all three in its
// kernel; its setup, its view and its journal's header name the template
// and its image digest; a replay runs on the same template and reproduces
// the run's files.
func TestTemplateRunAndReplay(t *testing.T) {
	for _, backend := range []string{"docker", "kube"} {
		t.Run(backend, func(t *testing.T) { testTemplateRunAndReplay(t, backend) })
	}
}

func testTemplateRunAndReplay(t *testing.T, backend string) {
	set, err := template.Load(templatetest.Dir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	tag := templatetest.Image(t, set, templatetest.Tiny)
	if backend == "kube" {
		templatetest.KubeImage(t, set, templatetest.Tiny)
	}
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: backend, Warm: 1, Templates: set})
	ctx := s.Ctx(t)
	run := runid.New()
	st, err := s.Orch.SetRunSetup(ctx, run, wire.RunSetup{Template: templatetest.Tiny})
	if err != nil {
		t.Fatal(err)
	}
	// Docker reports its image's digest; on Kubernetes the tag, a hash
	// of the template's inputs, is what names the image.
	if st.Template != templatetest.Tiny || st.Image != tag || (backend == "docker") != strings.HasPrefix(st.ImageDigest, "sha256:") {
		t.Fatalf("setup: template %q image %q digest %q, want tiny, %s and a digest on Docker", st.Template, st.Image, st.ImageDigest, tag)
	}
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: `import subprocess, triad_tiny
jq = subprocess.run(["jq", "-n", "6*7"], capture_output=True, text=True).stdout.strip()
placed = open("/etc/triad-tiny.txt").read()
open("result.txt", "w").write(f"{triad_tiny.HELLO} {jq} {placed}")
print(open("result.txt").read())`})
	if err != nil || !out.OK {
		t.Fatalf("exec: %+v %v", out, err)
	}
	if want := "tiny 42 " + templatetest.TinyFile; !strings.Contains(out.Stdout, want) {
		t.Errorf("in the template's kernel: %q, want %q", out.Stdout, want)
	}
	view, err := s.Orch.Status(ctx, run)
	if err != nil || view.Template != templatetest.Tiny || view.ImageDigest != st.ImageDigest {
		t.Errorf("GET /runs/{id}: template %q digest %q (%v), want tiny and %s", view.Template, view.ImageDigest, err, st.ImageDigest)
	}
	cel, err := s.Orch.Journal(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	want := "template `tiny`, image `" + tag + "`"
	if st.ImageDigest != "" {
		want += " (`" + st.ImageDigest + "`)"
	}
	if !strings.Contains(string(cel), want) {
		t.Errorf("CEL.md's header does not name the template and its digest:\n%s", cel[:min(len(cel), 800)])
	}
	rep, err := replay.Run(ctx, s.Orch, run, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Setup.Replay.Template != templatetest.Tiny || rep.Setup.Replay.ImageDigest != st.ImageDigest {
		t.Errorf("the replay ran on template %q digest %q, want tiny and %s", rep.Setup.Replay.Template, rep.Setup.Replay.ImageDigest, st.ImageDigest)
	}
	if !rep.Identical || rep.Same == 0 {
		t.Errorf("the replay's files differ: %+v", rep.Files)
	}
}
