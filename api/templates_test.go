package api_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/wire"
)

// TestTemplates: GET /templates lists the server's templates, secrets by
// name only; POST /runs picks one (an unknown one is a 400 naming those
// there are) and narrows its egress policy (beyond it, a 403), and the
// run's view names its template and policy.
func TestTemplates(t *testing.T) {
	const secret = "Bearer tok-not-for-callers"
	pol, err := egress.Compile(wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "pypi.org", Ports: []int{443}}, {Host: "api.example.com"}}},
		[]egress.Secret{{Host: "api.example.com", Header: "Authorization", Value: secret}})
	if err != nil {
		t.Fatal(err)
	}
	orch := orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t), Templates: template.NewSet(&template.Template{Name: "net", Egress: pol}),
		Egress: egress.New(egress.Config{})})
	c := apiServer(t, api.Config{Orchestrator: orch})

	a := c.do("GET", "/templates", "", nil)
	var list wire.TemplateList
	a.json(t, &list)
	if a.status != 200 || len(list.Templates) != 2 || list.Templates[0].Name != "default" || list.Templates[1].Name != "net" || strings.Contains(string(a.body), "tok-not") {
		t.Errorf("GET /templates: %d %s", a.status, a.body)
	}
	if a := c.post("/runs", "", map[string]any{"template": "nope"}); a.status != 400 || a.errKind(t) != "bad_input" || !strings.Contains(string(a.body), "default, net") {
		t.Errorf("an unknown template: %d %s, want 400 naming default and net", a.status, a.body)
	}
	beyond := map[string]any{"template": "net", "egress": map[string]any{"allow": []any{map[string]any{"host": "evil.example"}}}}
	if a := c.post("/runs", "", beyond); a.status != 403 || a.errKind(t) != "forbidden" {
		t.Errorf("egress beyond the template: %d %s, want 403", a.status, a.body)
	}
	a = c.post("/runs", "", map[string]any{"template": "net", "egress": map[string]any{"allow": []any{map[string]any{"host": "pypi.org"}}}})
	var nr wire.NewRunResponse
	a.json(t, &nr)
	if a.status != 201 || nr.Template != "net" || nr.Egress == nil || len(nr.Egress.Allow) != 1 || nr.Egress.Allow[0].Host != "pypi.org" || len(nr.Egress.Secrets) != 0 {
		t.Errorf("a narrowed run: %d %s", a.status, a.body)
	}
	a = c.post("/runs", "", map[string]any{"template": "net"})
	a.json(t, &nr)
	if a.status != 201 || nr.Egress == nil || len(nr.Egress.Secrets) != 1 || strings.Contains(string(a.body), "tok-not") {
		t.Errorf("the template's policy: %d %s, want the secret named, not shown", a.status, a.body)
	}
}
