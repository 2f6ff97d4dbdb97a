package runner_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/notebook"
	"github.com/triadhq/triad/recipes/runner"
)

func newRunner(t *testing.T, s *orchestratortest.Stack) *runner.Runner {
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	r := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { r.Close() })
	return r
}

// Every standard recipe runs end to end on the bundled data, the search
// recipes against the Tavily-like test server, and leaves non-empty
// artifacts, a valid run.ipynb and a journal graded PASS throughout.
func TestStandardRecipesEndToEnd(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Search: true, Warm: 1})
	r := newRunner(t, s)
	std := recipes.Standard()
	if len(std) != 5 {
		names := []string{}
		for _, rc := range std {
			names = append(names, rc.Name)
		}
		t.Errorf("got %d standard recipes %v, want 5", len(std), names)
	}
	for _, rc := range std {
		t.Run(rc.Name, func(t *testing.T) {
			ctx := s.Ctx(t)
			st, err := r.Run(ctx, runner.Request{Recipe: rc.Name, Objective: "Test objective for " + rc.Name}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			run := runid.Must(st.RunID)
			if st.Status != runner.Succeeded {
				cel, _ := s.Orch.Journal(ctx, run)
				t.Fatalf("status %s: %s\n%+v\n%s", st.Status, st.Error, st.Steps, cel)
			}
			// A finished recipe run frees its slot in the kernel quota.
			if s.Kernels.Peek(run) != nil {
				t.Errorf("the finished run still holds its kernel; want it released at the run's end")
			}
			for _, o := range rc.Outputs {
				f, err := s.Store.Stat(ctx, run, o.Path)
				if err != nil || f.Size == 0 {
					t.Errorf("declared output %s: %+v %v", o.Path, f, err)
				}
			}
			arts, _ := s.Store.List(ctx, run, "artifacts/")
			if len(arts) < 2 {
				t.Errorf("got %d artifacts, want deliverables under artifacts/", len(arts))
			}
			nb, _, err := s.Store.ReadAll(ctx, run, runner.NotebookPath)
			if err != nil {
				t.Fatal(err)
			}
			if err := notebook.Validate(nb); err != nil {
				t.Errorf("run.ipynb is not a valid notebook: %v", err)
			}
			var parsed struct {
				Cells []struct {
					CellType string `json:"cell_type"`
					Outputs  []any  `json:"outputs"`
				} `json:"cells"`
			}
			json.Unmarshal(nb, &parsed)
			code, withOutput := 0, 0
			for _, c := range parsed.Cells {
				if c.CellType == "code" {
					code++
					if len(c.Outputs) > 0 {
						withOutput++
					}
				}
			}
			if code < 5 {
				t.Errorf("run.ipynb has %d code cells, want at least 5", code)
			}
			cel, err := s.Orch.Journal(ctx, run)
			if err != nil {
				t.Fatal(err)
			}
			evals := regexp.MustCompile(`\*\*Evaluation \(by Evaluator\):\*\* (\w+)`).FindAllStringSubmatch(string(cel), -1)
			if len(evals) < len(st.Steps) {
				t.Errorf("journal has %d evaluations for %d recipe steps", len(evals), len(st.Steps))
			}
			for i, e := range evals {
				if e[1] != "PASS" {
					t.Errorf("journal Step %d is %s:\n%s", i+1, e[1], stepBlock(string(cel), i+1))
				}
			}
			if !strings.Contains(string(cel), "## Summary") {
				t.Error("the journal was not finalized with a summary")
			}
			switch rc.Name {
			case "forecast-pack":
				checkMAPE(t, s, run)
			case "implementation-brief":
				checkPDF(t, s, run)
			}
		})
	}
}

func stepBlock(cel string, n int) string {
	i := strings.Index(cel, "## Step "+strconv.Itoa(n)+":")
	if i < 0 {
		return ""
	}
	rest := cel[i:]
	if j := strings.Index(rest[3:], "\n## "); j >= 0 {
		return rest[:j+3]
	}
	return rest
}

// checkMAPE: the forecast pack reports MAPE on a holdout.
func checkMAPE(t *testing.T, s *orchestratortest.Stack, run runid.ID) {
	ctx := s.Ctx(t)
	b, _, err := s.Store.ReadAll(ctx, run, "artifacts/holdout_metrics.csv")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(bytes.ToLower(b), []byte("mape")) {
		t.Fatalf("holdout_metrics.csv has no MAPE:\n%s", b)
	}
	md, _, _ := s.Store.ReadAll(ctx, run, "artifacts/forecast_pack.md")
	if !bytes.Contains(md, []byte("MAPE")) || !bytes.Contains(bytes.ToLower(md), []byte("holdout")) {
		t.Fatalf("forecast_pack.md does not report MAPE on the holdout")
	}
}

// checkPDF: the brief's PDF has more than one page and renders.
func checkPDF(t *testing.T, s *orchestratortest.Stack, run runid.ID) {
	ctx := s.Ctx(t)
	arts, _ := s.Store.List(ctx, run, "artifacts/")
	var pdf string
	for _, a := range arts {
		if strings.HasSuffix(a.Path, ".pdf") {
			pdf = a.Path
		}
	}
	if pdf == "" {
		t.Fatal("the brief left no PDF under artifacts/")
	}
	b, _, err := s.Store.ReadAll(ctx, run, pdf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "brief.pdf")
	os.WriteFile(p, b, 0o644)
	info, err := exec.Command("pdfinfo", p).Output()
	if err != nil {
		t.Fatalf("pdfinfo (poppler-utils) failed: %v", err)
	}
	m := regexp.MustCompile(`Pages:\s+(\d+)`).FindSubmatch(info)
	if m == nil {
		t.Fatalf("pdfinfo: %s", info)
	}
	if n, _ := strconv.Atoi(string(m[1])); n < 2 {
		t.Fatalf("the brief has %d page(s), want more than one", n)
	}
	if out, err := exec.Command("pdftoppm", "-png", "-r", "40", p, filepath.Join(dir, "page")).CombinedOutput(); err != nil {
		t.Fatalf("pdftoppm: %v %s", err, out)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "page*.png"))
	if len(pages) < 2 {
		t.Fatalf("pdftoppm rendered %d pages", len(pages))
	}
	if dst := os.Getenv("TRIAD_KEEP_BRIEF"); dst != "" {
		os.WriteFile(dst, b, 0o644)
	}
}

// Bad requests get 400-class faults that name the problem.
func TestBadRequests(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	r := newRunner(t, s)
	cases := []struct {
		name string
		req  runner.Request
		kind fault.Kind
		msg  string
	}{
		{"unknown recipe", runner.Request{Recipe: "no-such-recipe"}, fault.BadInput, "no-such-recipe"},
		{"unknown param", runner.Request{Recipe: "forecast-pack", Params: map[string]any{"horizon_months": 3}}, fault.BadInput, "horizon_months"},
		{"wrong type", runner.Request{Recipe: "sales-reallocation", Params: map[string]any{"bootstrap": "many"}}, fault.BadInput, "bootstrap"},
		{"docker recipe on wasm", runner.Request{Recipe: "forecast-pack"}, fault.Unsupported, "Docker"},
		{"bad run id", runner.Request{Recipe: "forecast-pack", RunID: "../x"}, fault.InvalidRun, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Start(s.Ctx(t), tc.req, nil)
			fe := fault.As(err)
			if fe == nil || fe.Kind != tc.kind || !strings.Contains(fe.Message, tc.msg) || fe.Suggestion == "" {
				t.Fatalf("got %v, want a %s fault mentioning %q with a suggestion", err, tc.kind, tc.msg)
			}
		})
	}
}
