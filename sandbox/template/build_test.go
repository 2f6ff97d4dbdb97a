package template_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/image/imagetest"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/sandbox/template/templatetest"
)

// TestBuildAndRun: a template with an extra Debian package, a wheel from a
// wheelhouse and a placed file builds offline, and a kernel started from
// its image has all three, with the template's provenance inside.
func TestBuildAndRun(t *testing.T) {
	set, err := template.Load(templatetest.Dir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	tag := templatetest.Image(t, set, templatetest.Tiny)
	if !strings.HasPrefix(tag, "triad-sandbox-tiny:") {
		t.Errorf("tag %s, want triad-sandbox-tiny:<hash>", tag)
	}
	b, err := docker.New(context.Background(), docker.Config{Image: imagetest.Tag(t), WorkRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, sandbox.Spec{Owner: "template-test", Image: tag})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	var out sandbox.Collector
	res, err := k.Execute(ctx, sandbox.Cell{Code: `import json, subprocess, triad_tiny
print(json.dumps({"wheel": triad_tiny.HELLO,
  "jq": subprocess.run(["jq", "-n", "1+1"], capture_output=True, text=True).stdout.strip(),
  "file": open("/etc/triad-tiny.txt").read(),
  "provenance": json.load(open("/opt/triad/template.json"))}))`, Timeout: time.Minute, Output: out.Add})
	if err != nil || !res.OK {
		t.Fatalf("cell: %v %+v stderr=%s", err, res, out.Stderr.String())
	}
	var got struct {
		Wheel, JQ, File string
		Provenance      struct {
			Template   string            `json:"template"`
			Base       string            `json:"base"`
			Debian     []string          `json:"debian"`
			Wheelhouse map[string]string `json:"wheelhouse"`
		}
	}
	if err := json.Unmarshal([]byte(out.Stdout.String()), &got); err != nil {
		t.Fatalf("%v: %s", err, out.Stdout.String())
	}
	if got.Wheel != "tiny" || got.JQ != "2" || got.File != templatetest.TinyFile || got.Provenance.Template != "tiny" ||
		got.Provenance.Base != imagetest.Tag(t) || len(got.Provenance.Wheelhouse) != 1 {
		t.Errorf("in the template's kernel: %+v", got)
	}
}
