package recipes

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes/notebook"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/wire"
)

// This file runs the standard recipes' steps for real, in order, in a temp
// directory: python cells in the sandbox image with `docker run` (one fresh
// interpreter per cell, after the parameters cell, which proves that cells
// share nothing but files and params), searches through the real Tavily
// client against the Tavily fake, writes as files. It checks every step's
// declared outputs. The recipe runner replaces this driver later; it is
// kept small on purpose.
//
// Set TRIAD_RECIPE_OUT=DIR to keep each run's files in DIR/<recipe>.

// sandboxImage returns the sandbox image's tag (see orchestratortest.Image).
func sandboxImage(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		testenv.Missing(t, "the docker CLI")
	}
	return orchestratortest.Image(t)
}

// cellRunner runs one cell file with dir as the working directory.
type cellRunner func(ctx context.Context, dir, cell string, timeout time.Duration) *wire.ExecResponse

// dockerRunner runs cells in the sandbox image, jailed as the backend jails
// kernels: no network, the image's unprivileged user, read-only root.
func dockerRunner(img string) cellRunner {
	return func(ctx context.Context, dir, cell string, timeout time.Duration) *wire.ExecResponse {
		// Like the kernel, start from the image's prebuilt font cache:
		// building it takes seconds, and on a loaded machine matplotlib
		// then warns on stderr, which the evaluator grades down.
		return runCmd(ctx, timeout, "docker", "run", "--rm", "--network", "none", "-u", "1000:1000",
			"--read-only", "--tmpfs", "/tmp:size=256m", "-e", "HOME=/tmp", "-e", "MPLCONFIGDIR=/tmp/mpl",
			"-v", dir+":/work", "-v", cell+":/cell.py:ro", "-w", "/work", img,
			"/bin/sh", "-c", "mkdir -p /tmp/mpl && cp -a "+image.MPLSeed+"/. /tmp/mpl/ && exec python3 /cell.py")
	}
}

// stdlibRunner runs cells with the host's Debian CPython 3.11 (the version
// of the embedded WASI sandbox) and no site-packages, which proves that a
// backend "any" recipe needs nothing but the standard library.
func stdlibRunner(py string) cellRunner {
	return func(ctx context.Context, dir, cell string, timeout time.Duration) *wire.ExecResponse {
		return runCmdIn(ctx, dir, timeout, py, "-I", "-S", cell)
	}
}

func runCmd(ctx context.Context, timeout time.Duration, name string, args ...string) *wire.ExecResponse {
	return runCmdIn(ctx, "", timeout, name, args...)
}

func runCmdIn(ctx context.Context, dir string, timeout time.Duration, name string, args ...string) *wire.ExecResponse {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := &wire.ExecResponse{OK: err == nil, Stdout: stdout.String(), Stderr: stderr.String(), DurationMs: time.Since(start).Milliseconds()}
	if err != nil {
		res.Error = &wire.ExecError{Kind: wire.CellExecution, Ename: "CellFailed", Evalue: err.Error(),
			Traceback: strings.SplitAfter(stderr.String(), "\n")}
	}
	return res
}

// cellTimeout is generous: the test measures correctness, never speed.
const cellTimeout = 10 * time.Minute

func TestStandardRecipesRun(t *testing.T) {
	img := sandboxImage(t)
	srv := tavilytest.NewServer(t)
	search, err := tavily.New(tavily.Config{BaseURL: srv.URL, APIKey: srv.Key})
	if err != nil {
		t.Fatal(err)
	}
	defer search.Close()
	for _, r := range Standard() {
		t.Run(r.Name, func(t *testing.T) {
			t.Parallel()
			dir := runRecipe(t, r, dockerRunner(img), search)
			if r.Name == "implementation-brief" {
				checkPDF(t, filepath.Join(dir, "artifacts/implementation_brief.pdf"))
				checkBriefJournal(t, r, dir, dockerRunner(img))
			}
		})
	}
}

func TestStdlibRecipesRunWithoutPackages(t *testing.T) {
	py := "/usr/bin/python3.11"
	if _, err := os.Stat(py); err != nil {
		testenv.Missing(t, "Debian's "+py+" (the WASI sandbox's Python version)")
	}
	srv := tavilytest.NewServer(t)
	search, err := tavily.New(tavily.Config{BaseURL: srv.URL, APIKey: srv.Key})
	if err != nil {
		t.Fatal(err)
	}
	defer search.Close()
	var names []string
	for _, r := range Standard() {
		if r.Backend != BackendAny {
			continue
		}
		names = append(names, r.Name)
		t.Run(r.Name, func(t *testing.T) { runRecipe(t, r, stdlibRunner(py), search) })
	}
	if want := []string{"competitor-alert", "market-scan"}; !slices.Equal(names, want) {
		t.Errorf("got backend-any recipes %v, want %v", names, want)
	}
}

// runRecipe runs r's default plan in a fresh directory and returns it.
func runRecipe(t *testing.T, r *Recipe, run cellRunner, search *tavily.Client) string {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	cells := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil { // the sandbox user writes here
		t.Fatal(err)
	}
	inputs, err := r.InputFiles()
	if err != nil {
		t.Fatal(err)
	}
	plan := outsideTriad(t, r)
	for p, b := range inputs {
		writeFile(t, dir, p, b)
	}
	journal := newJournal(r, dir)
	results := make([]*notebook.Exec, len(plan.Steps))
	for i, s := range plan.Steps {
		before := snapshotFiles(t, dir)
		switch s.Kind {
		case KindExec:
			results[i] = &notebook.Exec{Answer: runCell(t, plan, s, dir, cells, run)}
		case KindSearch:
			rec, err := search.Search(ctx, *s.Search)
			if err != nil {
				t.Fatalf("step %d: search %q: %v", s.N, s.Search.Query, err)
			}
			raw, err := rec.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			// What a search step saves: the browser.search answer.
			saved := rec.Response()
			sum := sha256.Sum256(raw)
			saved.CitationsID = hex.EncodeToString(sum[:])
			b, err := json.MarshalIndent(saved, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, dir, s.SaveAs, b)
			t.Logf("step %d %s: %q -> %d results in %s", s.N, s.ID, s.Search.Query, len(saved.Results), s.SaveAs)
		case KindWrite:
			writeFile(t, dir, s.Write.Path, []byte(s.Write.Text))
		}
		for _, o := range s.Outputs {
			if err := checkOutput(dir, o); err != nil {
				t.Errorf("step %d (%s): %v", s.N, s.ID, err)
			}
		}
		journal.step(t, s, before)
	}
	for _, o := range r.Outputs {
		if err := checkOutput(dir, o); err != nil {
			t.Errorf("deliverable: %v", err)
		}
	}
	nb, err := plan.RunNotebook(results, map[string]any{"run_id": "r-test"})
	if err != nil {
		t.Fatal(err)
	}
	validateNotebook(t, nb)
	writeFile(t, dir, "run.ipynb", nb)
	if out := os.Getenv("TRIAD_RECIPE_OUT"); out != "" {
		keep := filepath.Join(out, r.Name)
		_ = os.RemoveAll(keep)
		if err := os.CopyFS(keep, os.DirFS(dir)); err != nil {
			t.Log(err)
		}
	}
	return dir
}

// outsideTriad binds r's defaults on its bundled inputs for cells run
// outside Triad, as in the starter notebook: the parameters cell carries
// the seed and as_of that Triad's kernel setup would set.
func outsideTriad(t *testing.T, r *Recipe) *Plan {
	t.Helper()
	byName := map[string][]byte{}
	for _, in := range r.Inputs {
		if in.Default != "" {
			b, err := in.DefaultData()
			if err != nil {
				t.Fatal(err)
			}
			byName[in.Name] = b
		}
	}
	params, _, err := r.Derive(nil, byName)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := r.Bind(params)
	if err != nil {
		t.Fatal(err)
	}
	plan.Steps[0].Code = parametersCell(r.Params, plan.Params, true)
	return plan
}

// runCell runs exec step s in a fresh interpreter, after the parameters
// cell, and fails the test if it fails or writes to stderr.
func runCell(t *testing.T, plan *Plan, s Step, dir, cells string, run cellRunner) *wire.ExecResponse {
	t.Helper()
	code := s.Code
	if s.ID != ParametersID {
		code = plan.Steps[0].Code + "\n" + s.Code
	}
	cell := filepath.Join(cells, fmt.Sprintf("%02d-%s.py", s.N, s.ID))
	if err := os.WriteFile(cell, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	res := run(t.Context(), dir, cell, cellTimeout)
	res.ExecutionCount = s.N
	if !res.OK {
		t.Fatalf("step %d (%s, line %d) failed:\n%s\n%s", s.N, s.ID, s.Line, res.Stdout, res.Stderr)
	}
	if strings.TrimSpace(res.Stderr) != "" {
		t.Errorf("step %d (%s) wrote to stderr, which the evaluator grades down:\n%s", s.N, s.ID, res.Stderr)
	}
	t.Logf("step %d %s (%d ms): %s", s.N, s.ID, res.DurationMs, lastLine(res.Stdout))
	return res
}

// checkBriefJournal checks the brief's Method & Evidence appendix with the
// run's journal, then re-runs the appendix and render cells without one, as
// when the cells run outside Triad.
func checkBriefJournal(t *testing.T, r *Recipe, dir string, run cellRunner) {
	t.Helper()
	type evidence struct {
		Available bool `json:"available"`
		Summary   struct {
			Steps, Pass int
		} `json:"summary"`
	}
	read := func() evidence {
		var ev evidence
		b, err := os.ReadFile(filepath.Join(dir, "work/method_evidence.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	plan := outsideTriad(t, r)
	var evStep, renderStep Step
	for _, s := range plan.Steps {
		switch s.ID {
		case "evidence":
			evStep = s
		case "render":
			renderStep = s
		}
	}
	// The journal has a block for every step before the evidence cell.
	if ev := read(); !ev.Available || ev.Summary.Steps != evStep.N-1 || ev.Summary.Pass != ev.Summary.Steps {
		t.Errorf("with a journal: got %+v, want available with %d steps, all PASS", ev, evStep.N-1)
	}
	if err := os.Remove(filepath.Join(dir, "CEL.md")); err != nil {
		t.Fatal(err)
	}
	cells := t.TempDir()
	runCell(t, plan, evStep, dir, cells, run)
	if ev := read(); ev.Available || ev.Summary.Steps != 0 {
		t.Errorf("without a journal: got %+v, want unavailable with no steps", ev)
	}
	runCell(t, plan, renderStep, dir, cells, run)
	if err := checkOutput(dir, Output{ExpectedFile: wire.ExpectedFile{Path: "artifacts/implementation_brief.html", Contains: []string{"rendered outside a Triad run"}}}); err != nil {
		t.Error(err)
	}
	checkPDF(t, filepath.Join(dir, "artifacts/implementation_brief.pdf"))
}

// checkOutput applies the checks the evaluator applies to a declared
// output, so that a recipe's declarations are known to hold on its sample
// data.
func checkOutput(dir string, o Output) error {
	b, err := os.ReadFile(filepath.Join(dir, o.Path))
	if err != nil {
		return fmt.Errorf("output %s: %v", o.Path, err)
	}
	if len(b) == 0 {
		return fmt.Errorf("output %s is empty", o.Path)
	}
	switch ext := filepath.Ext(o.Path); {
	case ext == ".csv":
		rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
		if err != nil {
			return fmt.Errorf("output %s: %v", o.Path, err)
		}
		for _, c := range o.Columns {
			if !slices.Contains(rows[0], c) {
				return fmt.Errorf("output %s: got columns %v, want %q among them", o.Path, rows[0], c)
			}
		}
		if len(rows)-1 < o.MinRows {
			return fmt.Errorf("output %s: got %d rows, want at least %d", o.Path, len(rows)-1, o.MinRows)
		}
	case ext == ".json":
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("output %s: %v", o.Path, err)
		}
		m, _ := v.(map[string]any)
		for _, k := range o.Keys {
			if _, ok := m[k]; !ok {
				return fmt.Errorf("output %s: lacks key %q", o.Path, k)
			}
		}
		if o.MinRows > 0 {
			n := -1
			if l, ok := v.([]any); ok {
				n = len(l)
			} else if l, ok := m["results"].([]any); ok {
				n = len(l)
			}
			if n < o.MinRows {
				return fmt.Errorf("output %s: got %d items, want at least %d", o.Path, n, o.MinRows)
			}
		}
	case ext == ".png":
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			return fmt.Errorf("output %s is not a PNG", o.Path)
		}
	case ext == ".pdf":
		if !bytes.HasPrefix(b, []byte("%PDF-")) {
			return fmt.Errorf("output %s is not a PDF", o.Path)
		}
	}
	text := string(b)
	if ext := filepath.Ext(o.Path); ext == ".html" || ext == ".htm" {
		// As the evaluator reads HTML: the visible text, entities decoded.
		text = html.UnescapeString(htmlTagRE.ReplaceAllString(text, " "))
	}
	for _, s := range o.Contains {
		if !strings.Contains(text, s) {
			return fmt.Errorf("output %s does not contain %q", o.Path, s)
		}
	}
	return nil
}

var htmlTagRE = regexp.MustCompile(`<[^>]*>`)

// journal writes CEL.md in the format package cel writes (the spec's Step
// Block) after each step, so that cells which read the journal (the brief's
// Method & Evidence appendix) see one. It is the smallest honest stand-in
// for package cel: no evaluator runs here; the output checks above grade
// every step, and the test fails before a step could be graded FAIL.
type journal struct {
	path string
	n    int
}

func newJournal(r *Recipe, dir string) *journal {
	j := &journal{path: filepath.Join(dir, "CEL.md")}
	head := fmt.Sprintf("# Context Engineering Log (CEL)\n\n- **Run:** r-test\n- **Started:** %s\n- **Recipe:** %s\n",
		time.Now().UTC().Format(time.RFC3339), r.Name)
	_ = os.WriteFile(j.path, []byte(head), 0o666)
	return j
}

func (j *journal) step(t *testing.T, s Step, before map[string]string) {
	t.Helper()
	j.n++
	tool := map[Kind]string{KindExec: "sandbox.exec", KindSearch: "browser.search", KindWrite: "tmp.write"}[s.Kind]
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Step %d: %s\n**When:** %s\n**Inputs:** step `%s` of the recipe (line %d)\n**What I did:**\n- %s\n**Artifacts:**\n",
		j.n, tool, time.Now().UTC().Format(time.RFC3339), s.ID, s.Line, s.Title)
	after := snapshotFiles(t, filepath.Dir(j.path))
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if p == "CEL.md" || before[p] == after[p] {
			continue
		}
		fi, err := os.Stat(filepath.Join(filepath.Dir(j.path), p))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "- %s: `tmp/%s` (size=%d, sha256=%s)\n", filepath.Base(p), p, fi.Size(), after[p][:12])
	}
	fmt.Fprintf(&b, "**Next steps:**\n- [ ] Step %d\n**Evaluation (by Evaluator):** PASS — score=1.00 (completeness=1.00, correctness=1.00, evidence=1.00, hygiene=1.00). all checks passed.\n", j.n+1)
	f, err := os.OpenFile(j.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
}

// snapshotFiles maps each file under dir to its sha256.
func snapshotFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sum := sha256.Sum256(b)
		out[filepath.ToSlash(rel)] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func checkPDF(t *testing.T, path string) {
	t.Helper()
	if _, err := exec.LookPath("pdfinfo"); err != nil {
		testenv.Missing(t, "poppler-utils (pdfinfo, pdftoppm)")
	}
	out, err := exec.Command("pdfinfo", path).CombinedOutput()
	if err != nil {
		t.Fatalf("pdfinfo: %v\n%s", err, out)
	}
	pages := 0
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Pages:"); ok {
			fmt.Sscan(strings.TrimSpace(v), &pages)
		}
	}
	if pages < 2 {
		t.Errorf("got %d PDF pages, want more than one", pages)
	}
	png := filepath.Join(t.TempDir(), "page")
	if out, err := exec.Command("pdftoppm", "-png", "-r", "50", path, png).CombinedOutput(); err != nil {
		t.Fatalf("pdftoppm: %v\n%s", err, out)
	}
	got, _ := filepath.Glob(png + "*.png")
	if len(got) != pages {
		t.Errorf("pdftoppm rendered %d pages, want %d", len(got), pages)
	}
}

func writeFile(t *testing.T, dir, p string, b []byte) {
	t.Helper()
	full := filepath.Join(dir, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(full), 0o777); err != nil {
		t.Fatal(err)
	}
	// Directories and files must stay writable by the sandbox's user.
	for d := filepath.Dir(full); d != dir && strings.HasPrefix(d, dir); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o777)
	}
	if err := os.WriteFile(full, b, 0o666); err != nil {
		t.Fatal(err)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
