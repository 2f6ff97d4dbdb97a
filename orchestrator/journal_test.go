package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

func text(s string) *string { return &s }

type block struct {
	n          int
	tool, body string
}

var blockRE = regexp.MustCompile(`(?m)^## Step (\d+): (\S+)\n`)

// blocks splits CEL.md into its Step Blocks.
func blocks(t *testing.T, cel []byte) []block {
	t.Helper()
	idx := blockRE.FindAllSubmatchIndex(cel, -1)
	var out []block
	for i, m := range idx {
		end := len(cel)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		var n int
		fmt.Sscan(string(cel[m[2]:m[3]]), &n)
		out = append(out, block{n: n, tool: string(cel[m[4]:m[5]]), body: string(cel[m[0]:end])})
	}
	return out
}

func journal(t *testing.T, s *orchestratortest.Stack, run runid.ID) []byte {
	t.Helper()
	b, err := s.Orch.Journal(s.Ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The scenario: tmp.write, a cell writing kpis.csv, a search, an
// operator note, and a failing cell that also warns.
func TestJournalScenario(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Search: true})
	ctx := s.Ctx(t)
	run := runid.New()
	o := s.Orch
	if _, err := o.Write(ctx, run, wire.WriteRequest{Path: "data/leads.csv", Text: text("source,leads\nads,40\nseo,25\n")}); err != nil {
		t.Fatal(err)
	}
	out, err := o.Exec(ctx, run, wire.ExecRequest{Code: "import pandas as pd\ndf = pd.read_csv('data/leads.csv')\ndf['share'] = df.leads / df.leads.sum()\ndf.to_csv('kpis.csv', index=False)"})
	if err != nil || !out.OK {
		t.Fatalf("exec: %+v %v", out, err)
	}
	res, err := o.Search(ctx, run, wire.SearchRequest{Query: "Acme Analytics pricing"}, orchestrator.SearchOptions{})
	if err != nil || len(res.Results) == 0 {
		t.Fatalf("search: %+v %v", res, err)
	}
	if err := o.Note(ctx, run, "Prefer 2026 sources.", "ana"); err != nil {
		t.Fatal(err)
	}
	fail, err := o.Exec(ctx, run, wire.ExecRequest{Code: "import warnings\nwarnings.warn('this API is deprecated', DeprecationWarning, stacklevel=1)\n1/0"})
	if err != nil || fail.OK || fail.Error == nil || fail.Error.Ename != "ZeroDivisionError" {
		t.Fatalf("failing cell: %+v %v", fail, err)
	}

	cel := journal(t, s, run)
	bs := blocks(t, cel)
	wantTools := []string{"tmp.write", "sandbox.exec", "browser.search", "sandbox.exec"}
	if len(bs) != len(wantTools) {
		t.Fatalf("got %d Step Blocks, want %d:\n%s", len(bs), len(wantTools), cel)
	}
	for i, b := range bs {
		if b.n != i+1 || b.tool != wantTools[i] {
			t.Errorf("block %d: got Step %d: %s, want Step %d: %s", i, b.n, b.tool, i+1, wantTools[i])
		}
		for _, sec := range []string{"**When:** ", "**Inputs:** ", "**What I did:**\n- ", "**Artifacts:**\n- ", "**Next steps:**\n- ", "**Evaluation (by Evaluator):** "} {
			if !strings.Contains(b.body, sec) {
				t.Errorf("Step %d lacks %q", b.n, sec)
			}
		}
	}
	if bytes.Contains(cel, []byte("PENDING")) {
		t.Error("a PENDING line is left in the journal")
	}
	if !strings.Contains(string(cel), "> Prefer 2026 sources.") || !strings.Contains(bs[3].body, "Saw operator note") {
		t.Error("the note is not in the journal, or the next step did not see it")
	}
	if !strings.Contains(bs[1].body, "PASS") {
		t.Errorf("the kpis step is not PASS:\n%s", bs[1].body)
	}
	m := regexp.MustCompile(`FAIL — score=[0-9.]+ \(completeness=[0-9.]+, correctness=[0-9.]+, evidence=[0-9.]+, hygiene=([0-9.]+)\)`).FindStringSubmatch(bs[3].body)
	if m == nil || m[1] == "1.00" {
		t.Errorf("the failing step is not FAIL with hygiene < 1:\n%s", bs[3].body)
	}
	// Every artifact line agrees with tmp.list.
	// The store directly: a tmp.list tool call would itself be a step.
	files, err := s.Store.List(ctx, run, "")
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]tmpfs.File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	artRE := regexp.MustCompile("(?m)^- [^:]+: `tmp/([^`]+)` \\(size=(\\d+), sha256=([0-9a-f]{64})\\)$")
	seen := 0
	for _, b := range bs {
		for _, a := range artRE.FindAllStringSubmatch(b.body, -1) {
			f, ok := byPath[a[1]]
			if !ok {
				t.Errorf("journal lists %s, which tmp.list does not have", a[1])
				continue
			}
			if fmt.Sprint(f.Size) != a[2] || f.SHA256.String() != a[3] {
				t.Errorf("%s: journal says size=%s sha256=%s, tmp.list says %d %s", a[1], a[2], a[3], f.Size, f.SHA256)
			}
			seen++
		}
	}
	if seen < 3 {
		t.Errorf("got %d artifact lines, want data/leads.csv, kpis.csv and the citations record at least", seen)
	}
	// No secret anywhere in the run's files.
	for _, f := range files {
		b, _, err := s.Store.ReadAll(ctx, run, f.Path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(s.Tavily.Key)) {
			t.Errorf("%s contains the Tavily key", f.Path)
		}
	}
	checkTraceAgrees(t, s, run, bs)
}

// checkTraceAgrees: trace.jsonl has one record per Step Block with the same
// tool and outputs, and artifacts/index.json lists only live files.
func checkTraceAgrees(t *testing.T, s *orchestratortest.Stack, run runid.ID, bs []block) {
	t.Helper()
	ctx := s.Ctx(t)
	tr, err := s.Trace(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != len(bs) {
		t.Fatalf("trace has %d records, journal %d blocks", len(tr), len(bs))
	}
	for i, rec := range tr {
		if rec.Step != bs[i].n || rec.Tool != bs[i].tool {
			t.Errorf("trace %d: got step %d %s, journal says %d %s", i, rec.Step, rec.Tool, bs[i].n, bs[i].tool)
		}
		for _, out := range rec.Outputs {
			if !strings.Contains(bs[i].body, "`tmp/"+out.Path+"` (size="+fmt.Sprint(out.Size)+", sha256="+out.SHA256.String()+")") {
				t.Errorf("trace step %d output %s is not in its Step Block", rec.Step, out.Path)
			}
		}
		verdict := "FAIL"
		if rec.Eval != nil && rec.Eval.Pass {
			verdict = "PASS"
		}
		if !strings.Contains(bs[i].body, "**Evaluation (by Evaluator):** "+verdict) {
			t.Errorf("trace step %d says %s, its Step Block does not", rec.Step, verdict)
		}
	}
	b, _, err := s.Store.ReadAll(ctx, run, runfiles.Evaluations)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(bytes.Split(bytes.TrimSpace(b), []byte("\n"))); n != len(bs) {
		t.Errorf("evaluations.jsonl has %d lines, want %d", n, len(bs))
	}
}

func TestArtifactIndexAgrees(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker"})
	ctx := s.Ctx(t)
	run := runid.New()
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "import os\nos.makedirs('artifacts', exist_ok=True)\nopen('artifacts/a.md','w').write('# A\\nsee data.csv\\n')\nopen('artifacts/b.csv','w').write('x\\n1\\n')"})
	if err != nil || !out.OK {
		t.Fatalf("%+v %v", out, err)
	}
	if _, err := s.Orch.Delete(ctx, run, "artifacts/b.csv"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "artifacts/c.txt", Text: text("c")}); err != nil {
		t.Fatal(err)
	}
	// The store directly: wait for the last call's recording first.
	if _, err := s.Orch.ReadRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	b, _, err := s.Store.ReadAll(ctx, run, runfiles.Index)
	if err != nil {
		t.Fatal(err)
	}
	var idx struct{ Artifacts []orchestrator.IndexEntry }
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	live, _ := s.Store.List(ctx, run, "artifacts/")
	want := map[string]tmpfs.File{}
	for _, f := range live {
		if f.Path != runfiles.Index {
			want[f.Path] = f
		}
	}
	if len(idx.Artifacts) != len(want) {
		t.Fatalf("index has %+v, live artifacts %v", idx.Artifacts, want)
	}
	for _, e := range idx.Artifacts {
		f, ok := want[e.Path]
		if !ok || f.SHA256 != e.SHA256 || f.Size != e.Size || e.URL != "/blobs/"+f.SHA256.String() || e.Step == 0 {
			t.Errorf("index entry %+v does not match %+v", e, f)
		}
	}
	bs := blocks(t, journal(t, s, run))
	checkTraceAgrees(t, s, run, bs)
}

// 20 concurrent calls on one run give steps 1..20, in order, no gaps.
func TestConcurrentCallsAreSerialized(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{})
	ctx := s.Ctx(t)
	run := runid.New()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%4 == 3 {
				_, err := s.Orch.List(ctx, run, "")
				errs <- err
				return
			}
			_, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: fmt.Sprintf("f/%02d.txt", i), Text: text(fmt.Sprint(i))})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	bs := blocks(t, journal(t, s, run))
	if len(bs) != 20 {
		t.Fatalf("got %d blocks, want 20", len(bs))
	}
	for i, b := range bs {
		if b.n != i+1 {
			t.Fatalf("block %d is Step %d", i+1, b.n)
		}
	}
	tr, err := s.Trace(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 20 {
		t.Fatalf("got %d trace records, want 20", len(tr))
	}
	for i, rec := range tr {
		if rec.Step != i+1 {
			t.Fatalf("trace record %d is step %d", i+1, rec.Step)
		}
	}
}

// A cell that overwrites or deletes CEL.md cannot corrupt the journal: it
// is restored, and the step's hygiene is marked down.
func TestCellCannotCorruptJournal(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker"})
	ctx := s.Ctx(t)
	run := runid.New()
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "x.txt", Text: text("x")}); err != nil {
		t.Fatal(err)
	}
	before := journal(t, s, run)
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "print(open('CEL.md').read()[:40])\nopen('CEL.md','w').write('# forged\\n## Step 99: nothing\\n')\nopen('trace.jsonl','a').write('{}\\n')"})
	if err != nil || !out.OK || !strings.Contains(out.Stdout, "Context Engineering Log") {
		t.Fatalf("the cell could not read the journal: %+v %v", out, err)
	}
	after := journal(t, s, run)
	if !bytes.HasPrefix(after, before) || bytes.Contains(after, []byte("forged")) || bytes.Contains(after, []byte("Step 99")) {
		t.Fatalf("the journal was corrupted:\n%s", after)
	}
	bs := blocks(t, after)
	if len(bs) != 2 || !strings.Contains(bs[1].body, "changed the journal") || strings.Contains(bs[1].body, "hygiene=1.00") {
		t.Fatalf("the tampering step should be marked down on hygiene:\n%s", bs[len(bs)-1].body)
	}
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "import os\nos.remove('CEL.md')"}); err != nil {
		t.Fatal(err)
	}
	final := journal(t, s, run)
	if !bytes.HasPrefix(final, after) || len(blocks(t, final)) != 3 {
		t.Fatalf("deleting CEL.md lost the journal:\n%s", final)
	}
	checkTraceAgrees(t, s, run, blocks(t, final))
	// The kernel sees the restored journal again.
	out, _ = s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "print(open('CEL.md').read().count('## Step '))"})
	if strings.TrimSpace(out.Stdout) != "3" {
		t.Fatalf("the kernel's CEL.md has %q Step Blocks, want 3 (restored)", out.Stdout)
	}
}

// Monkeypatching builtins in the user's kernel does not reach the
// evaluator: the same work gets the same verdict.
func TestMonkeypatchedKernelDoesNotChangeVerdict(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker"})
	ctx := s.Ctx(t)
	work := "open('bad.json','w').write('{not json')"
	verdict := func(run runid.ID) string {
		tr, err := s.Trace(ctx, run)
		if err != nil || len(tr) == 0 {
			t.Fatalf("trace: %v", err)
		}
		b, _ := json.Marshal(tr[len(tr)-1].Eval)
		return string(b)
	}
	control := runid.New()
	if _, err := s.Orch.Exec(ctx, control, wire.ExecRequest{Code: work}); err != nil {
		t.Fatal(err)
	}
	patched := runid.New()
	patch := `import builtins, json
builtins.len = lambda *a, **k: 0
builtins.open.__doc__ = 'patched'
json.loads = lambda *a, **k: {"ok": True}
import sys; sys.modules['json'] = json
`
	if _, err := s.Orch.Exec(ctx, patched, wire.ExecRequest{Code: patch}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Orch.Exec(ctx, patched, wire.ExecRequest{Code: work}); err != nil {
		t.Fatal(err)
	}
	if a, b := verdict(control), verdict(patched); a != b || !strings.Contains(a, `"pass":false`) {
		t.Fatalf("verdicts differ or pass a broken JSON file:\ncontrol %s\npatched %s", a, b)
	}
}

// The closing summary lists the run's deliverables, not Triad's index of
// them.
func TestFinalizeListsDeliverables(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{})
	ctx := t.Context()
	run := runid.New()
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "artifacts/brief.md", Text: text("# Brief\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Orch.ReadRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.Stat(ctx, run, runfiles.Index); err != nil {
		t.Fatalf("no index after a deliverable: %v", err)
	}
	if err := s.Orch.Finalize(ctx, run, "succeeded"); err != nil {
		t.Fatal(err)
	}
	cel := string(journal(t, s, run))
	_, summary, ok := strings.Cut(cel, "\n## Summary\n")
	if !ok {
		t.Fatalf("no summary:\n%s", cel)
	}
	if !strings.Contains(summary, "`tmp/artifacts/brief.md`") || strings.Contains(summary, "index.json") {
		t.Errorf("got summary\n%s\nwant artifacts/brief.md and not the index", summary)
	}
}
