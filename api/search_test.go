package api_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
)

// browser.search over HTTP: results in the contract's shape, citations_id
// downloads through /blobs and holds the raw response, page text with
// include_page, 400s that name the field, and the key in no file or log.
func TestSearchOverHTTP(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Search: true})
	logs := &testenv.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Logger: log})
	const run = "r-search"
	a := c.post("/browser/search", run, map[string]any{"query": "Acme Analytics pricing", "top_k": 3, "include_page": true})
	if a.status != 200 {
		t.Fatalf("search: %d %s", a.status, a.body)
	}
	var out struct {
		Results []struct {
			URL, Title, Snippet, Content string
			PublishedAt                  string `json:"published_at"`
		} `json:"results"`
		CitationsID string `json:"citations_id"`
	}
	a.json(t, &out)
	if len(out.Results) == 0 || len(out.Results) > 3 || out.Results[0].URL == "" || out.Results[0].Snippet == "" || out.Results[0].Content == "" {
		t.Fatalf("results: %+v", out.Results)
	}
	rec := c.do("GET", "/blobs/"+out.CitationsID, run, nil)
	var record map[string]json.RawMessage
	if rec.status != 200 || json.Unmarshal(rec.body, &record) != nil {
		t.Fatalf("/blobs/<citations_id>: %d %s", rec.status, rec.body)
	}
	for _, k := range []string{"request", "response", "results", "time", "top_domains"} {
		if _, ok := record[k]; !ok {
			t.Errorf("the citations record lacks %q", k)
		}
	}
	if !bytes.Contains(record["response"], []byte("request_id")) {
		t.Errorf("the record's response is not Tavily's raw answer: %s", record["response"])
	}
	files := c.list(run, "citations/")
	if len(files) != 1 || files[0].SHA256.String() != out.CitationsID {
		t.Fatalf("citations/ has %+v, want the record under its sha256 %s", files, out.CitationsID)
	}
	for _, tc := range []struct {
		body  string
		field string
	}{
		{`{"query":""}`, "query"},
		{`{"query":"` + strings.Repeat("q", 401) + `"}`, "query"},
		{`{"query":"x","top_k":21}`, "top_k"},
		{`{"query":"x","top_k":0.5}`, "top_k"},
		{`{"query":"x","date_range":"last week"}`, "date_range"},
		{`{"query":"x","date_range":"2026-13-01..2026-12-01"}`, "date_range"},
		{`{"query":"x","allow_domains":["https://example.com/path"]}`, "allow_domains"},
		{`{"query":`, ""},
	} {
		a := c.do("POST", "/browser/search", run, strings.NewReader(tc.body))
		if a.status != 400 || a.errKind(t) != "bad_input" || !strings.Contains(string(a.body), tc.field) {
			t.Errorf("%s: got %d %s, want 400 naming %q", tc.body, a.status, a.body, tc.field)
		}
	}
	// The key is in no run file and in no log line.
	all, _ := s.Store.List(t.Context(), runid.Must(run), "")
	for _, f := range all {
		b, _, _ := s.Store.ReadAll(t.Context(), runid.Must(run), f.Path)
		if bytes.Contains(b, []byte(s.Tavily.Key)) {
			t.Errorf("%s contains the key", f.Path)
		}
	}
	if strings.Contains(logs.String(), s.Tavily.Key) {
		t.Error("the server log contains the key")
	}
}

// POST /run refuses what it cannot run with a 4xx that names the problem,
// and GET /recipes lists the five standard recipes.
func TestRunRequests(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	rn := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { rn.Close() })
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Runner: rn})
	for _, tc := range []struct {
		body   map[string]any
		status int
		kind   string
		names  string
	}{
		{map[string]any{"recipe": "nope"}, 400, "bad_input", "nope"},
		{map[string]any{"recipe": "market-scan", "params": map[string]any{"colour": "red"}}, 400, "bad_input", "colour"},
		{map[string]any{"recipe": "market-scan", "params": map[string]any{"top_k": "many"}}, 400, "bad_input", "top_k"},
		// The document lists only the recipes this server's sandbox can
		// run, and says why the others are missing.
		{map[string]any{"recipe": "forecast-pack"}, 400, "bad_input", "docker"},
		{map[string]any{"recipe": "market-scan", "run_id": "bad/id"}, 400, "invalid_run_id", ""},
		{map[string]any{"recipe": "market-scan", "speed": "fast"}, 400, "bad_input", "speed"},
	} {
		a := c.post("/run", "", tc.body)
		if a.status != tc.status || a.errKind(t) != tc.kind || !strings.Contains(strings.ToLower(string(a.body)), tc.names) {
			t.Errorf("%v: got %d %s, want %d %s naming %q", tc.body, a.status, a.body, tc.status, tc.kind, tc.names)
		}
	}
	var list struct {
		Recipes []struct{ Name string } `json:"recipes"`
	}
	c.do("GET", "/recipes", "", nil).json(t, &list)
	if len(list.Recipes) != 5 {
		t.Fatalf("GET /recipes: %+v", list)
	}
	if a := c.do("GET", "/recipes/market-scan", "", nil); a.status != 200 || !bytes.Contains(a.body, []byte(`"params"`)) {
		t.Fatalf("GET /recipes/market-scan: %d %s", a.status, a.body)
	}
	if a := c.do("GET", "/recipes/nope", "", nil); a.status != 404 {
		t.Fatalf("GET /recipes/nope: %d", a.status)
	}
	if a := c.do("GET", "/runs/r-never-seen", "", nil); a.status != 404 {
		t.Fatalf("GET /runs of an unknown run: %d %s", a.status, a.body)
	}
}
