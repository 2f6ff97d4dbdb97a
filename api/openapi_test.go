package api_test

import (
	"context"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/gorilla/mux"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
)

// Every route the router serves, mounted surfaces and /metrics included, is
// an operation of GET /openapi.json; the document is valid OpenAPI 3.1;
// its error body lists every error kind.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	orch := orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t)})
	m := metrics.New()
	c := apiServer(t, api.Config{Orchestrator: orch, Metrics: m, MetricsHandler: m.Handler()})
	srv := mcp.New(mcp.Config{Orchestrator: orch})
	t.Cleanup(func() { srv.Close() })
	c.h.Mount("/mcp", "MCP", srv.Handler())
	doc := c.document()
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi: got %q, want 3.1.0", doc.OpenAPI)
	}
	n := 0
	c.h.Router().Walk(func(r *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tmpl, err := r.GetPathTemplate()
		if err != nil {
			t.Errorf("a route without a path template: %v", err)
			return nil
		}
		methods, err := r.GetMethods()
		if err != nil {
			t.Errorf("%s matches any method: every route must name its methods", tmpl)
			return nil
		}
		item := doc.Paths.Value(api.DocPath(tmpl))
		for _, method := range methods {
			n++
			if item == nil || item.GetOperation(method) == nil {
				t.Errorf("%s %s is served but not documented in /openapi.json", method, tmpl)
			}
		}
		return nil
	})
	if n < 30 {
		t.Errorf("walked only %d operations", n)
	}
	if doc.Paths.Value("/mcp") == nil || doc.Paths.Value("/metrics") == nil {
		t.Error("/mcp or /metrics is not documented")
	}
	kind := doc.Components.Schemas["ErrorDetail"].Value.Properties["kind"].Value
	for _, k := range fault.Kinds {
		if !slices.Contains(kind.Enum, any(string(k))) {
			t.Errorf("error kind %s is not in the document", k)
		}
	}
	// The document validates as OpenAPI 3.1 once more, from a fresh load.
	b, _ := doc.MarshalJSON()
	again, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Validate(context.Background(), openapi3.EnableSchemaFormatValidation()); err != nil {
		t.Fatalf("the document is not valid: %v", err)
	}
}
