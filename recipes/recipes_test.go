package recipes

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/testenv"
)

const demoRecipe = `---
name: demo
title: Demo
description: A small recipe that exercises every kind of block.
params:
  objective: {type: string, default: "Size the market"}
  top_k: {type: int, default: 4, description: Results per search}
  competitors: {type: list, default: [Acme Analytics, Globex Insights]}
  threshold: {type: float, default: 0.5}
  strict: {type: bool}
inputs:
  leads: {path: data/leads.csv, default: leads.csv, description: CRM export}
outputs:
  - {path: facts.json, keys: [facts]}
  - artifacts/report.md
---

# Demo

Some prose.

` + "```python {id: collect, outputs: [facts.json]}" + `
import json
json.dump({"facts": []}, open("facts.json", "w"))
` + "```" + `

## Search

` + "```search" + `
foreach: competitors
query: "{{ item }} pricing for {{ params.objective | lower }}"
top_k: "{{ params.top_k }}"
save_as: "evidence/{{ item | slug }}.json"
` + "```" + `

` + "```python {outputs: [artifacts/report.md], timeout: 90}" + `
open("artifacts/report.md", "w").write("# Report\n")
` + "```" + `

` + "```write {path: \"notes/{{ params.top_k }}.md\"}" + `
Objective: {{ params.objective }}
` + "```" + `

Closing words.
`

func mustParse(t *testing.T, file, src string) *Recipe {
	t.Helper()
	r, err := Parse(file, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseDemo(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	if r.Name != "demo" || r.Backend != BackendAny {
		t.Errorf("got name %q backend %q, want demo any", r.Name, r.Backend)
	}
	var names []string
	for _, p := range r.Params {
		names = append(names, fmt.Sprintf("%s:%s=%v", p.Name, p.Type, p.Default))
	}
	want := []string{"objective:string=Size the market", "top_k:int=4",
		"competitors:list=[Acme Analytics Globex Insights]", "threshold:float=0.5", "strict:bool=<nil>",
		"seed:int=<nil>", "as_of:string=<nil>"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("params (-want +got):\n%s", diff)
	}
	if got := r.Blocks[0]; got.ID != "collect" || got.Line != 22 || got.Title != "Demo" || got.Doc != "# Demo\n\nSome prose." {
		t.Errorf("got first block %+v", got)
	}
	if got := r.Blocks[2]; got.ID != "step-3" || got.TimeoutSeconds != 90 || got.Title != "Search" {
		t.Errorf("got third block id %q timeout %d title %q, want step-3 90 Search", got.ID, got.TimeoutSeconds, got.Title)
	}
	if r.Epilogue != "Closing words." {
		t.Errorf("got epilogue %q", r.Epilogue)
	}
}

func TestBindDefaults(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	p, err := r.Bind(map[string]any{"top_k": 7.0}) // JSON numbers arrive as float64
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range p.Steps {
		line := fmt.Sprintf("%d %s %s", s.N, s.ID, s.Kind)
		if s.Search != nil {
			line += fmt.Sprintf(" %q top_k=%d -> %s", s.Search.Query, s.Search.TopK, s.SaveAs)
		}
		if s.Write != nil {
			line += fmt.Sprintf(" %s %q", s.Write.Path, s.Write.Text)
		}
		got = append(got, line)
	}
	want := []string{
		"1 parameters exec",
		"2 collect exec",
		`3 step-2-1 search "Acme Analytics pricing for size the market" top_k=7 -> evidence/acme-analytics.json`,
		`4 step-2-2 search "Globex Insights pricing for size the market" top_k=7 -> evidence/globex-insights.json`,
		"5 step-3 exec",
		`6 step-4 write notes/7.md "Objective: Size the market\n"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	if got := p.Steps[1].Outputs; len(got) != 1 || got[0].Path != "facts.json" || len(got[0].Keys) != 1 {
		t.Errorf("got collect outputs %+v, want facts.json with the front matter's keys check", got)
	}
	if got := p.Steps[4].Timeout.Seconds(); got != 90 {
		t.Errorf("got timeout %vs, want 90s", got)
	}
	if !p.Steps[0].Rerun || p.Steps[1].Rerun {
		t.Errorf("only the parameters cell reruns on resume")
	}
	wantCell := `objective = "Size the market"
top_k = 7
competitors = ["Acme Analytics", "Globex Insights"]
threshold = 0.5
strict = False
seed = TRIAD_SEED  # the run's seed, set by Triad when the kernel started
as_of = TRIAD_AS_OF  # the run's as-of date, YYYY-MM-DD, or "" for none
`
	if !strings.HasSuffix(p.Steps[0].Code, wantCell) {
		t.Errorf("got parameters cell\n%s\nwant it to end with\n%s", p.Steps[0].Code, wantCell)
	}
	for _, s := range p.Steps {
		if s.Search != nil {
			if err := s.Search.Validate(); err != nil {
				t.Errorf("search step %s: %v", s.ID, err)
			}
		}
	}
}

func TestBindRejects(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	tests := []struct {
		name   string
		params map[string]any
		want   string
	}{
		{"unknown param", map[string]any{"topk": 3}, `no param "topk"`},
		{"string for int", map[string]any{"top_k": "five"}, `param top_k: want int, got string "five"`},
		{"fraction for int", map[string]any{"top_k": 2.5}, "param top_k: want int"},
		{"int for string", map[string]any{"objective": 3.0}, "param objective: want string"},
		{"string for bool", map[string]any{"strict": "yes"}, "param strict: want bool"},
		{"scalar for list", map[string]any{"competitors": "Acme"}, "param competitors: want a list"},
		{"nested list", map[string]any{"competitors": []any{[]any{"a"}}}, "param competitors: item 1"},
		{"NaN", map[string]any{"threshold": nan()}, "param threshold: want a finite number"},
		{"top_k out of range", map[string]any{"top_k": 50}, "top_k is 50"},
		{"slug collision", map[string]any{"competitors": []any{"Acme Inc", "acme-inc"}}, "two searches save to evidence/acme-inc.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.Bind(tt.params)
			fe := fault.As(err)
			if fe == nil || fe.Kind != fault.BadInput {
				t.Fatalf("got %v, want a BadInput fault", err)
			}
			if !strings.Contains(fe.Message, tt.want) {
				t.Errorf("got message %q, want it to contain %q", fe.Message, tt.want)
			}
			if fe.Suggestion == "" {
				t.Error("got no suggestion")
			}
		})
	}
}

func TestParamFromText(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	tests := []struct {
		name, text string
		want       any
	}{
		{"top_k", " 8 ", int64(8)},
		{"threshold", "0.25", 0.25},
		{"strict", "true", true},
		{"competitors", "Acme, Globex ,", []any{"Acme", "Globex"}},
		{"competitors", `["a, b", 3]`, []any{"a, b", int64(3)}},
		{"objective", "a=b, c", "a=b, c"},
	}
	for _, tt := range tests {
		got, err := r.ParamFromText(tt.name, tt.text)
		if err != nil {
			t.Errorf("%s=%q: %v", tt.name, tt.text, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s=%q (-want +got):\n%s", tt.name, tt.text, diff)
		}
	}
	if _, err := r.ParamFromText("top_k", "many"); fault.As(err) == nil || !strings.Contains(err.Error(), "top_k") {
		t.Errorf("got %v, want a fault naming top_k", err)
	}
	if _, err := r.ParamFromText("nope", "1"); fault.As(err) == nil {
		t.Errorf("got %v, want a fault for an unknown param", err)
	}
}

// TestParseErrorsNameFileAndLine feeds malformed recipes and checks that
// each error names the file, the line and the problem.
func TestParseErrorsNameFileAndLine(t *testing.T) {
	const head = "---\nname: bad\ntitle: Bad\ndescription: d\n"
	tests := []struct {
		name string
		src  string
		want string
	}{
		{"no front matter", "# hi\n", "bad.md:1: recipe must start with YAML front matter"},
		{"unclosed front matter", "---\nname: x\n", "bad.md:1: front matter is not closed"},
		{"unknown front matter key", head + "parms: {}\n---\n```python\nx=1\n```\n", `bad.md:5: front matter: unknown field "parms"`},
		{"yaml syntax", head + "params: [a\n---\n```python\nx=1\n```\n", "bad.md:5: front matter:"},
		{"missing title", "---\nname: bad\ndescription: d\n---\n```python\nx=1\n```\n", "bad.md:2: front matter: title is missing"},
		{"bad name", "---\nname: Bad_Name\ntitle: t\ndescription: d\n---\n```python\nx=1\n```\n", `bad.md:2: front matter: name "Bad_Name"`},
		{"bad backend", head + "backend: gpu\n---\n```python\nx=1\n```\n", `backend "gpu"`},
		{"bad template", head + "template: Data_Sci\n---\n```python\nx=1\n```\n", `template "Data_Sci" is not a template name`},
		{"unknown param field", head + "params:\n  top_k:\n    type: int\n    defualt: 3\n---\n```python\nx=1\n```\n", `bad.md:8: front matter: unknown field "defualt"`},
		{"bad param type", head + "params:\n  k: {type: integer}\n---\n```python\nx=1\n```\n", `bad.md:6: param k: type "integer"`},
		{"default of wrong type", head + "params:\n  k: {type: int, default: many}\n---\n```python\nx=1\n```\n", `bad.md:6: param k: default: want int, got string "many"`},
		{"keyword param", head + "params:\n  class: {type: string}\n---\n```python\nx=1\n```\n", `bad.md:6: param name "class"`},
		{"required with default", head + "params:\n  k: {type: int, default: 1, required: true}\n---\n```python\nx=1\n```\n", "bad.md:6: param k: a required param has no default"},
		{"unknown sample", head + "inputs:\n  x: {path: data/x.csv, default: nope.csv}\n---\n```python\nx=1\n```\n", `bad.md:6: input x: default "nope.csv" is not a bundled sample data file`},
		{"input path escapes", head + "inputs:\n  x: {path: ../x.csv}\n---\n```python\nx=1\n```\n", `bad.md:6: input x: path "../x.csv" contains '..'`},
		{"no steps", head + "---\n# Nothing\n", "bad.md:6: recipe has no steps"},
		{"unclosed fence", head + "---\n\n```python\nx = 1\n", "bad.md:7: code block is not closed"},
		{"search unknown field", head + "---\n\n```search\nquery: x\ntopk: 3\nsave_as: e.json\n```\n", `bad.md:9: search block: unknown field "topk"`},
		{"search without save_as", head + "---\n```search\nquery: x\n```\n", "bad.md:6: search block: save_as is missing"},
		{"unquoted template", head + "---\n```search\nquery: {{ params.objective }}\nsave_as: e.json\n```\n", "bad.md:7: search block: quote a value that starts with a template"},
		{"unknown param in template", head + "---\n```search\nquery: \"{{ params.nope }}\"\nsave_as: e.json\n```\n", `bad.md:6: search block: query: template: <params>: map has no entry for key "nope"`},
		{"foreach over non-list", head + "---\n```search\nforeach: objective\nquery: \"{{ item }}\"\nsave_as: \"e/{{ item }}.json\"\n```\n", `bad.md:6: search block: foreach "objective" must name a list param`},
		{"item outside foreach", head + "---\n```search\nquery: \"{{ item }}\"\nsave_as: e.json\n```\n", "item is only defined in a search block with foreach"},
		{"bad date range", head + "---\n```search\nquery: x\ndate_range: fortnight\nsave_as: e.json\n```\n", "bad.md:6: search block: date_range"},
		{"attributes not a mapping", head + "---\n```python outputs=x.csv\nx=1\n```\n", "bad.md:6: python block: write attributes as a flow mapping"},
		{"unknown attribute", head + "---\n```python {output: [x.csv]}\nx=1\n```\n", `bad.md:6: python block attributes: unknown field "output"`},
		{"unquoted template in attributes", head + "---\n```write {path: notes/{{ params.objective }}.md}\ntext\n```\n", "bad.md:6: write block attributes: ',' or '}' must be specified (quote values that hold a template"},
		{"write without path", head + "---\n```write\ntext\n```\n", "bad.md:6: write block: path is missing"},
		{"empty block", head + "---\n\n\n```python\n```\n", "bad.md:8: python block is empty"},
		{"duplicate id", head + "---\n```python {id: a}\nx=1\n```\n```python {id: a}\nx=1\n```\n", `bad.md:9: python block: id "a" is also the id of the block at line 6`},
		{"output produced by nobody", head + "outputs: [artifacts/x.md]\n---\n```python\nx=1\n```\n", "bad.md:5: output artifacts/x.md is produced by no step"},
		{"absolute output", head + "---\n```python {outputs: [/etc/passwd]}\nx=1\n```\n", `bad.md:6: python block: outputs: path "/etc/passwd" is absolute`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("bad.md", []byte(tt.src))
			fe := fault.As(err)
			if fe == nil || fe.Kind != fault.BadInput {
				t.Fatalf("got %v, want a BadInput fault", err)
			}
			if !strings.Contains(fe.Message, tt.want) {
				t.Errorf("got %q, want it to contain %q", fe.Message, tt.want)
			}
			if !strings.HasPrefix(fe.Message, "bad.md:") {
				t.Errorf("got %q, want it to start with the file name and line", fe.Message)
			}
		})
	}
}

// TestParseTemplate: a recipe's front matter may name the sandbox
// template its runs start from.
func TestParseTemplate(t *testing.T) {
	r, err := Parse("t.md", []byte("---\nname: t\ntitle: T\ndescription: d\ntemplate: data-sci\n---\n```python\nx=1\n```\n"))
	if err != nil || r.Template != "data-sci" {
		t.Fatalf("got %+v, %v; want template data-sci", r, err)
	}
}

func TestParseObjectiveAdded(t *testing.T) {
	r := mustParse(t, "x.md", "---\nname: x\ntitle: X\ndescription: d\n---\n```python\nprint(objective)\n```\n")
	p, ok := r.Param("objective")
	if !ok || p.Type != TypeString || p.Default != "" {
		t.Fatalf("got %+v, want an implicit string objective", p)
	}
	if _, err := r.Bind(map[string]any{"objective": "why"}); err != nil {
		t.Fatal(err)
	}
}

// TestParametersCellIsValidPython checks, with a real CPython, that the
// parameters cell parses and assigns exactly the bound values, for values
// that would break naive quoting.
func TestParametersCellIsValidPython(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testenv.Missing(t, "Debian's /usr/bin/python3")
	}
	r := mustParse(t, "demo.md", demoRecipe)
	nasty := "quote \" apostrophe ' backslash \\ newline \n tab \t nul \x00 line-sep \u2028 emoji 🙂 \"\"\" '''"
	p, err := r.Bind(map[string]any{
		"objective":   nasty,
		"competitors": []any{"a\\b", "c\"d", 1.0, 2.5, true},
		"threshold":   1e21,
		"strict":      true,
	})
	if err != nil {
		t.Fatal(err)
	}
	script := "TRIAD_SEED, TRIAD_AS_OF = 1, \"\"\n" + p.Steps[0].Code + `
import ast, json, sys
with open(sys.argv[1]) as f:
    ast.parse(f.read())
json.dump({"objective": objective, "top_k": top_k, "competitors": competitors, "threshold": threshold,
           "strict": strict, "types": [type(v).__name__ for v in (top_k, threshold, strict)]}, sys.stdout)
`
	path := filepath.Join(t.TempDir(), "params.py")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "-W", "error", path, path).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	want := `{"objective": "quote \" apostrophe ' backslash \\ newline \n tab \t nul \u0000 line-sep \u2028 emoji \ud83d\ude42 \"\"\" '''", "top_k": 4, "competitors": ["a\\b", "c\"d", 1, 2.5, true], "threshold": 1e+21, "strict": true, "types": ["int", "float", "bool"]}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
}

func TestTemplatesCannotInjectYAML(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	p, err := r.Bind(map[string]any{"competitors": []any{"x\"\ntop_k: 20\nsave_as: /etc/passwd"}})
	if err != nil {
		t.Fatal(err)
	}
	s := p.Steps[2]
	if s.Search.TopK != 4 || s.SaveAs != "evidence/x-top-k-20-save-as-etc-passwd.json" {
		t.Errorf("got top_k %d save_as %q: a param value changed the block's structure", s.Search.TopK, s.SaveAs)
	}
}

func TestStandardRecipes(t *testing.T) {
	want := []string{"competitor-alert", "forecast-pack", "implementation-brief", "market-scan", "sales-reallocation"}
	var got []string
	for _, r := range Standard() {
		got = append(got, r.Name)
		t.Run(r.Name, func(t *testing.T) {
			p, err := r.Bind(nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Origin != "standard" {
				t.Errorf("got origin %q, want standard", r.Origin)
			}
			cells := 0
			for _, s := range p.Steps[1:] {
				if s.Kind == KindExec {
					cells++
					if len(s.Outputs) == 0 {
						t.Errorf("cell %s (line %d) declares no outputs; every cell writes its products to files", s.ID, s.Line)
					}
				}
			}
			if cells < 5 || cells > 8 {
				t.Errorf("got %d python cells, want 5 to 8", cells)
			}
			deliverables := 0
			for _, o := range r.Outputs {
				if strings.HasPrefix(o.Path, "artifacts/") {
					deliverables++
				}
			}
			if deliverables == 0 {
				t.Error("no deliverable under artifacts/")
			}
			for _, in := range r.Inputs {
				if in.Required {
					t.Errorf("input %s is required; standard recipes run with no arguments but objective", in.Name)
				}
			}
			for _, prm := range r.Params {
				if prm.Required {
					t.Errorf("param %s is required; standard recipes run with no arguments but objective", prm.Name)
				}
			}
		})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("standard recipes (-want +got):\n%s", diff)
	}
}

func TestStepDefinition(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	a, _ := r.Bind(nil)
	b, _ := r.Bind(nil)
	c, _ := r.Bind(map[string]any{"objective": "other"})
	for i := range a.Steps {
		if string(a.Steps[i].Definition()) != string(b.Steps[i].Definition()) {
			t.Errorf("step %d: two binds of the same params differ", i+1)
		}
	}
	// The objective changes the parameters cell and the searches that use
	// it, and nothing else.
	var changed []string
	for i := range a.Steps {
		if string(a.Steps[i].Definition()) != string(c.Steps[i].Definition()) {
			changed = append(changed, a.Steps[i].ID)
		}
	}
	if diff := cmp.Diff([]string{"parameters", "step-2-1", "step-2-2", "step-4"}, changed); diff != "" {
		t.Errorf("steps whose definition changed with the objective (-want +got):\n%s", diff)
	}
	// Prose and line numbers are not part of a definition.
	moved := mustParse(t, "demo.md", strings.Replace(demoRecipe, "Some prose.", "Other\n\nprose.", 1))
	m, _ := moved.Bind(nil)
	for i := range a.Steps {
		if string(a.Steps[i].Definition()) != string(m.Steps[i].Definition()) {
			t.Errorf("step %s: editing prose changed its definition", a.Steps[i].ID)
		}
	}
}

func TestCatalog(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# My recipes\n")
	write("demo.md", demoRecipe)
	user, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(user) != 1 || user[0].Origin != filepath.Join(dir, "demo.md") {
		t.Fatalf("got %d user recipes, want demo from %s", len(user), dir)
	}
	c, err := NewCatalog(user...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(c.List()), len(Standard())+1; got != want {
		t.Errorf("got %d recipes, want %d", got, want)
	}
	if r, err := c.Get("demo"); err != nil || r != user[0] {
		t.Errorf("Get(demo) = %v, %v", r, err)
	}
	if _, err := c.Get("nope"); fault.As(err) == nil || fault.As(err).Kind != fault.NotFound ||
		!strings.Contains(fault.As(err).Suggestion, "forecast-pack") {
		t.Errorf("Get(nope) = %v, want NotFound listing the recipes", err)
	}

	write("forecast-pack.md", strings.Replace(demoRecipe, "name: demo", "name: forecast-pack", 1))
	user, err = LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewCatalog(user...); fault.As(err) == nil || fault.As(err).Kind != fault.Conflict {
		t.Errorf("got %v, want a Conflict: user recipes may not shadow standard ones", err)
	}

	write("forecast-pack.md", demoRecipe)
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "forecast-pack.md:2: recipe name \"demo\" differs") {
		t.Errorf("got %v, want a name/file mismatch at line 2", err)
	}
	write("forecast-pack.md", "not a recipe")
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "forecast-pack.md:1:") {
		t.Errorf("got %v, want a parse error naming the file", err)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); fault.As(err) == nil {
		t.Errorf("got %v, want a fault for a missing directory", err)
	}
}

func TestSearchStepsMatchTheBrowserContract(t *testing.T) {
	for _, r := range Standard() {
		p, err := r.Bind(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Steps {
			if s.Kind != KindSearch {
				continue
			}
			var _ *browser.Request = s.Search
			if err := s.Search.Validate(); err != nil {
				t.Errorf("%s step %s: %v", r.Name, s.ID, err)
			}
		}
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

// TestWriteCellWritesTheSameFile runs the starter notebook's form of a
// write step with a real CPython and compares the file it writes.
func TestWriteCellWritesTheSameFile(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testenv.Missing(t, "Debian's /usr/bin/python3")
	}
	texts := map[string]string{
		"module":      "\"\"\"Doc.\"\"\"\nimport numpy as np\n\n\ndef f(x):\n    return x ** 2  # '\\n' stays\n",
		"quotes":      "it's ''' tricky\n",
		"trailing":    "ends with a quote'",
		"backslash":   "C:\\path\\",
		"carriage":    "a\r\nb\n",
		"unicode":     "naïve — 🙂\n",
		"raw escapes": "\\n is not a newline here; \\u00e9 neither\n",
	}
	for name, text := range texts {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			code := writeCell(&WriteArgs{Path: "sub/out.txt", Text: text})
			cell := filepath.Join(dir, "cell.py")
			if err := os.WriteFile(cell, []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(py, "-W", "error", cell)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("python: %v\n%s\n%s", err, out, code)
			}
			got, err := os.ReadFile(filepath.Join(dir, "sub/out.txt"))
			if err != nil {
				t.Fatal(err)
			}
			// write_text translates "\n" only on Windows; bytes match here.
			if string(got) != text {
				t.Errorf("got %q, want %q\ncell:\n%s", got, text, code)
			}
		})
	}
}
