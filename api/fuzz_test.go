package api_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/apifuzz"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
)

// The API against its own OpenAPI document, by a property-based tester
// (internal/apifuzz): for every operation, requests the document allows
// and requests it refuses, then chains of calls along the document's links
// (create a run, then exec, write, read, share, revoke). Zero 5xx, zero
// answers that break the document, zero valid requests refused and zero
// invalid ones accepted (issue 28). TRIAD_FUZZ_SEED picks another seed;
// TRIAD_FUZZ_CASES more cases per operation.
func TestContractFuzz(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true})
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	rn := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { rn.Close() })
	m := metrics.New()
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Runner: rn, Metrics: m, MetricsHandler: m.Handler()})
	admin := c.newKey("fuzz", auth.Admin)
	doc := c.document()

	seed := uint64(1)
	if v := os.Getenv("TRIAD_FUZZ_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	cases := 20
	if v := os.Getenv("TRIAD_FUZZ_CASES"); v != "" {
		cases, _ = strconv.Atoi(v)
	}
	// A few runs, so calls meet again in the same run (its kernel, its
	// files); and now and then a fresh one.
	pool := []string{"r-fuzz-1", "r-fuzz-2", "r-fuzz-3"}
	rep := apifuzz.Run(t.Context(), apifuzz.Config{
		Doc: doc, BaseURL: c.url, Client: &http.Client{Transport: bearerKey{admin}, Timeout: 5 * time.Minute},
		Seed: seed, Cases: cases, Chains: 8 * cases, Depth: 4,
		// A recipe run that starts goes on in the background: a few are
		// enough to cover the operation.
		PerOp:    map[string]int{"post_run": max(cases/4, 3)},
		Formats:  triadFormats(pool),
		Skip:     map[string]string{"get_mcp": "MCP's own protocol (tested in api/mcp)", "post_mcp": "MCP's own protocol", "delete_mcp": "MCP's own protocol"},
		Accepted: []int{http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusTooManyRequests},
		// Each answer is checked against the document by the fuzzer.
		Observe: func(apifuzz.Call) { validated.Add(1) },
	})
	var ops []string
	for op, byStatus := range rep.ByOp {
		var parts []string
		for _, st := range slices.Sorted(maps.Keys(byStatus)) {
			parts = append(parts, fmt.Sprintf("%d×%d", st, byStatus[st]))
		}
		ops = append(ops, op+" "+strings.Join(parts, " "))
	}
	slices.Sort(ops)
	t.Logf("contract fuzz (seed %d, %d cases per operation): %d requests, %d operations (%d skipped), %d links followed; by class %v\n%s",
		seed, cases, rep.Requests, rep.Operations, len(rep.Skipped), rep.Links, rep.ByClass, strings.Join(ops, "\n"))
	if dir := os.Getenv("TRIAD_ARTIFACTS"); dir != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "contract-fuzz.json"), b, 0o644)
	}
	if rep.Requests < rep.Operations*cases {
		t.Errorf("only %d requests for %d operations", rep.Requests, rep.Operations)
	}
	for i, f := range rep.Failures {
		if i == 40 {
			t.Errorf("... and %d more", len(rep.Failures)-40)
			break
		}
		t.Error(f)
	}
}

// bearerKey sends a key with every request.
type bearerKey struct{ key string }

func (b bearerKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// triadFormats make values of Triad's own formats, each one its
// validator accepts (as a Schemathesis user registers strategies for the
// custom formats of a document).
func triadFormats(runs []string) map[string]func(*rand.Rand, *openapi3.Schema) string {
	names := []string{"data", "a.csv", "notes", "é.txt", "x y.md", "日本.json", ".hidden", "...", "v1.2", "report-2026.html", "sha256:x"}
	path := func(r *rand.Rand) string {
		segs := make([]string, 1+r.IntN(3))
		for i := range segs {
			segs[i] = names[r.IntN(len(names))]
		}
		p := strings.Join(segs, "/")
		if r.IntN(8) == 0 {
			p = "./" + p
		}
		return p
	}
	day := func(r *rand.Rand) time.Time {
		return time.Date(2000+r.IntN(30), time.Month(1+r.IntN(12)), 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, r.IntN(28))
	}
	return map[string]func(*rand.Rand, *openapi3.Schema) string{
		"run-id": func(r *rand.Rand, _ *openapi3.Schema) string {
			if r.IntN(6) == 0 {
				return fmt.Sprintf("r-fuzz-new-%d", r.IntN(1<<30))
			}
			return runs[r.IntN(len(runs))]
		},
		"run-path": func(r *rand.Rand, _ *openapi3.Schema) string { return path(r) },
		"run-prefix": func(r *rand.Rand, _ *openapi3.Schema) string {
			if r.IntN(3) == 0 {
				return ""
			}
			return path(r) + "/"
		},
		"run-dir": func(r *rand.Rand, _ *openapi3.Schema) string {
			if r.IntN(3) == 0 {
				return ""
			}
			return path(r)
		},
		"non-blank": func(r *rand.Rand, s *openapi3.Schema) string {
			texts := []string{"1+1", "print('hi')", "x = 21", "import math\nmath.pi", "heat pumps Europe", "  padded  ", "é", "1/0"}
			return texts[r.IntN(len(texts))]
		},
		"egress-host": func(r *rand.Rand, _ *openapi3.Schema) string {
			hs := []string{"*", "pypi.org", "*.example.com", "Files.PythonHosted.org", "a_b.internal.", "xn--bcher-kva.example"}
			return hs[r.IntN(len(hs))]
		},
		"egress-name": func(r *rand.Rand, _ *openapi3.Schema) string {
			hs := []string{"pypi.org", "api.example.com", "A-B.example.", "s3_eu.example"}
			return hs[r.IntN(len(hs))]
		},
		"cidr": func(r *rand.Rand, _ *openapi3.Schema) string {
			cs := []string{"10.0.0.0/8", "203.0.113.7", "fd00::/8", "::1", "192.168.1.0/24"}
			return cs[r.IntN(len(cs))]
		},
		"http-method": func(r *rand.Rand, _ *openapi3.Schema) string {
			ms := []string{"GET", "head", "POST", "Delete", "PROPFIND"}
			return ms[r.IntN(len(ms))]
		},
		"header-name": func(r *rand.Rand, _ *openapi3.Schema) string {
			hs := []string{"Authorization", "x-api-key", "X_Token", "Cookie"}
			return hs[r.IntN(len(hs))]
		},
		"domain": func(r *rand.Rand, _ *openapi3.Schema) string {
			ds := []string{"example.com", "gartner.com", "sub.example.org", "xn--bcher-kva.example", "a-b.co.uk."}
			return ds[r.IntN(len(ds))]
		},
		"date-range": func(r *rand.Rand, _ *openapi3.Schema) string {
			if r.IntN(2) == 0 {
				return []string{"day", "week", "month", "year"}[r.IntN(4)]
			}
			a := day(r)
			b := a.AddDate(0, 0, r.IntN(400))
			return a.Format(time.DateOnly) + ".." + b.Format(time.DateOnly)
		},
		"date": func(r *rand.Rand, _ *openapi3.Schema) string { return day(r).Format(time.DateOnly) },
		"duration-go": func(r *rand.Rand, s *openapi3.Schema) string {
			ds := []string{"1m", "90m", "2h30m", "24h", "168h"}
			return ds[r.IntN(len(ds))]
		},
	}
}
