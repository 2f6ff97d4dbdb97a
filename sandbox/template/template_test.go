package template

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "data.yaml", `
description: Data work, with PyPI.
debian: [jq]
wheelhouse: wheels
wheels: [triad_tiny==1.0]
files:
  - src: files/pip.conf
    dst: /etc/pip.conf
limits:
  memory: 4GiB
  cpus: 2
egress:
  allow:
    - host: pypi.org
      ports: [443]
    - host: "*.pythonhosted.org"
  max_bytes: 100MiB
  secrets:
    - host: api.example.com
      header: authorization
      prefix: "Bearer "
      value_env: TRIAD_TEST_TOKEN
`)
	write(t, dir, "wheels/triad_tiny-1.0-py3-none-any.whl", "not really a wheel, but hashed")
	write(t, dir, "files/pip.conf", "[global]\nindex-url = https://pypi.org/simple\n")
	write(t, dir, "README.md", "not a template")
	set, err := Load(dir, func(k string) string {
		if k == "TRIAD_TEST_TOKEN" {
			return "tok-123"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Names(); !cmp.Equal(got, []string{"default", "data"}) {
		t.Errorf("Names() = %v, want [default data]", got)
	}
	d, err := set.Get("")
	if err != nil || d.Name != Default || d.Variant != nil || !d.Egress.Empty() {
		t.Errorf("Get(\"\") = %+v, %v; want the builtin default: no variant, no egress", d, err)
	}
	tm, err := set.Get("data")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Limits != (sandbox.Limits{MemoryBytes: 4 << 30, CPUs: 2}) {
		t.Errorf("limits %+v", tm.Limits)
	}
	if tm.Variant == nil || tm.Variant.Wheelhouse != filepath.Join(dir, "wheels") || tm.Variant.Files[0].Src != filepath.Join(dir, "files/pip.conf") {
		t.Errorf("variant %+v, want paths resolved against the templates directory", tm.Variant)
	}
	want := wire.Template{Name: "data", Description: "Data work, with PyPI.", Debian: []string{"jq"}, Wheels: []string{"triad_tiny==1.0"}, Files: []string{"/etc/pip.conf"},
		Egress: wire.EgressPolicy{
			Allow:    []wire.EgressRule{{Host: "pypi.org", Ports: []int{443}}, {Host: "*.pythonhosted.org", Ports: []int{80, 443}}},
			MaxBytes: 100 << 20,
			Secrets:  []wire.EgressSecret{{Host: "api.example.com", Header: "Authorization"}},
		}}
	if diff := cmp.Diff(want, tm.Wire()); diff != "" {
		t.Errorf("Wire() (-want +got):\n%s", diff)
	}
	if b, _ := json.Marshal(tm.Wire()); strings.Contains(string(b), "tok-123") {
		t.Errorf("a template's wire form holds its secret: %s", b)
	}
	if s := tm.Egress.Wire(); len(s.Secrets) != 1 {
		t.Errorf("secrets %+v", s.Secrets)
	}
	_, err = set.Get("nope")
	if !errors.Is(err, ErrUnknown) || fault.From(err).Kind != fault.BadInput || !strings.Contains(fault.From(err).Suggestion, "default, data") {
		t.Errorf("Get(nope) = %v (%+v), want a bad-input error naming default and data", err, fault.From(err))
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"unknown field":      "debain: [jq]\n",
		"another base":       "base: ubuntu\n",
		"secret in the file": "egress:\n  secrets:\n    - host: a.com\n      header: X\n      value: s3cret\n",
		"unset secret env":   "egress:\n  secrets:\n    - host: a.com\n      header: X\n      value_env: TRIAD_UNSET_FOR_TEST\n",
		"ip rule":            "egress:\n  allow:\n    - host: 198.51.100.7\n",
		"hidden file":        "files:\n  - src: x\n    dst: /work/x\n",
		"bad package":        "debian: [\"jq; rm -rf /\"]\n",
		"wheels, no house":   "wheels: [x]\n",
		"bad limit":          "limits:\n  memory: lots\n",
	} {
		dir := t.TempDir()
		write(t, dir, "x", "x")
		write(t, dir, "t.yaml", body)
		if _, err := Load(dir, func(string) string { return "" }); err == nil {
			t.Errorf("%s: Load succeeded, want an error", name)
		}
	}
}

// TestDefaultOverride: a template file named default.yaml is the default.
func TestDefaultOverride(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "default.yaml", "egress:\n  allow:\n    - host: pypi.org\n")
	set, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := set.Get("")
	if d.Egress.Empty() {
		t.Errorf("the default template has no egress; want default.yaml's")
	}
}
