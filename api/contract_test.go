package api_test

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
)

var update = flag.Bool("update", false, "rewrite the golden contract files in testdata/")

// The OpenAPI document is a reviewed contract: testdata/openapi.json is the
// document of a server with every surface mounted (/mcp, /metrics), so a
// change to a route, a wire type, a description or a constraint shows in
// its diff, and CI fails until the file is updated with it:
// go test ./api -run '^TestOpenAPIGolden$' -update.
func TestOpenAPIGolden(t *testing.T) {
	orch := orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t)})
	m := metrics.New()
	c := apiServer(t, api.Config{Orchestrator: orch, Metrics: m, MetricsHandler: m.Handler()})
	srv := mcp.New(mcp.Config{Orchestrator: orch})
	t.Cleanup(func() { srv.Close() })
	c.h.Mount("/mcp", "MCP over streamable HTTP", srv.Handler())
	doc, err := c.h.Document()
	if err != nil {
		t.Fatal(err)
	}
	// What GET /openapi.json serves is that document.
	var served, built any
	c.do("GET", "/openapi.json", "", nil).json(t, &served)
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &built); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(built, served); diff != "" {
		t.Errorf("GET /openapi.json is not Document() (-built +served):\n%s", diff)
	}
	doc.Info.Version = "GOLDEN" // the build's version changes with every commit
	got, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, filepath.Join("testdata", "openapi.json"), append(got, '\n'), *update)
}
