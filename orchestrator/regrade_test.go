package orchestrator_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/wire"
)

// evalLines reads evaluations.jsonl as written, line by line.
func evalLines(t *testing.T, s *orchestratortest.Stack, run runid.ID) []map[string]any {
	t.Helper()
	b, _, err := s.Store.ReadAll(t.Context(), run, runfiles.Evaluations)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// ungradedStep writes kpis.csv (a step the rubric itself must grade)
// with the evaluator stalled, and checks the step is UNGRADED, never
// FAIL, in CEL.md, evaluations.jsonl, the trace, the run's status and its
// calls.
func ungradedStep(t *testing.T, s *orchestratortest.Stack, st *orchestratortest.Stall, run runid.ID) {
	t.Helper()
	ctx := s.Ctx(t)
	st.Set(true)
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "kpis.csv", Text: text("channel,cac\nads,12\nseo,8\n")}); err != nil {
		t.Fatal(err)
	}
	view, err := s.Orch.Status(ctx, run) // waits for the step's record
	if err != nil {
		t.Fatal(err)
	}
	if st.Started() == 0 {
		t.Fatal("the evaluator's interpreter was never asked: the step did not reach the fault hook")
	}
	if len(view.Steps) != 1 || view.Steps[0].Evaluation != "UNGRADED" {
		t.Fatalf("GET /runs/{id} steps: got %+v, want one step UNGRADED", view.Steps)
	}
	cel := string(journal(t, s, run))
	bs := blocks(t, []byte(cel))
	if len(bs) != 1 || !strings.Contains(bs[0].body, "**Evaluation (by Evaluator):** UNGRADED — ") ||
		!strings.Contains(bs[0].body, "did not answer in time") {
		t.Fatalf("CEL.md: got %q, want step 1 UNGRADED, saying the evaluator did not answer in time", cel)
	}
	if strings.Contains(cel, "FAIL") {
		t.Fatalf("CEL.md says FAIL for an evaluator that did not answer:\n%s", cel)
	}
	lines := evalLines(t, s, run)
	if len(lines) != 1 || lines[0]["ungraded"] != true || lines[0]["request"] == nil {
		t.Fatalf("evaluations.jsonl: got %v, want one ungraded line with its request", lines)
	}
	calls := runCalls(t, s, run)
	if len(calls) != 1 || calls[0].Verdict != "UNGRADED" {
		t.Fatalf("calls: got %+v, want one UNGRADED", calls)
	}
}

// gradedLate checks the step's late verdict, after the regrade, in every
// record: CEL.md keeps its UNGRADED Step Block and has the late verdict
// after it; evaluations.jsonl has a late line that supersedes the
// ungraded one; the run's status and calls show the verdict.
func gradedLate(t *testing.T, s *orchestratortest.Stack, run runid.ID) {
	t.Helper()
	ctx := s.Ctx(t)
	v, err := s.Orch.Graded(ctx, run, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v.Ungraded || !v.Pass {
		t.Fatalf("late verdict: got %+v, want PASS (a valid CSV)", v)
	}
	cel := string(journal(t, s, run))
	if !strings.Contains(cel, "\n### Late verdict of Step 1: tmp.write\n") ||
		!strings.Contains(cel[strings.Index(cel, "### Late verdict"):], "**Evaluation (by Evaluator):** PASS — ") {
		t.Fatalf("CEL.md: got\n%s\nwant a late PASS verdict of step 1", cel)
	}
	if strings.Contains(cel, "FAIL") {
		t.Fatalf("CEL.md says FAIL:\n%s", cel)
	}
	lines := evalLines(t, s, run)
	last := lines[len(lines)-1]
	if len(lines) != 2 || last["step"] != float64(1) || last["late"] != true || last["pass"] != true || last["ungraded"] != nil {
		t.Fatalf("evaluations.jsonl: got %v, want the ungraded line then a late PASS for step 1", lines)
	}
	view, err := s.Orch.Status(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(view.Steps) != 1 || view.Steps[0].Evaluation != "PASS" {
		t.Fatalf("GET /runs/{id} steps: got %+v, want one step PASS", view.Steps)
	}
	calls := runCalls(t, s, run)
	if len(calls) != 1 || calls[0].Verdict != "PASS" {
		t.Fatalf("calls: got %+v, want one PASS", calls)
	}
}

// An evaluator that cannot answer in time leaves the step UNGRADED, never
// FAIL; the background regrade grades it once the evaluator answers, and
// the run's feed tells its subscribers.
func TestUngradedThenGraded(t *testing.T) {
	st := &orchestratortest.Stall{}
	s := orchestratortest.New(t, orchestratortest.Options{EvalFault: st.Wrap, EvalTimeout: 2 * time.Second})
	ctx := s.Ctx(t)
	run := runid.New()
	if err := s.Orch.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	feed, cancel, err := s.Orch.Subscribe(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	ungradedStep(t, s, st, run)
	st.Set(false) // the evaluator answers again
	for u := range feed {
		if u.Call != nil && u.Call.Verdict != "UNGRADED" {
			t.Fatalf("feed: got call %+v, want UNGRADED", u.Call)
		}
		if u.Verdict != nil {
			if u.Verdict.Step != 1 || u.Verdict.Verdict != "PASS" {
				t.Fatalf("feed: got late verdict %+v, want step 1 PASS", u.Verdict)
			}
			break
		}
	}
	gradedLate(t, s, run)
}

// A step still ungraded when the process stops is graded by the next
// process on the same data: its request is in evaluations.jsonl, and
// reading the run (GET /runs/{id}) queues it.
func TestUngradedAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	st := &orchestratortest.Stall{}
	s1 := orchestratortest.New(t, orchestratortest.Options{Dir: dir, EvalFault: st.Wrap, EvalTimeout: 2 * time.Second})
	run := runid.New()
	ungradedStep(t, s1, st, run)
	s1.Close() // still stalled: the step is ungraded when the process ends

	s2 := orchestratortest.New(t, orchestratortest.Options{Dir: dir})
	ctx := s2.Ctx(t)
	feed, cancel, err := s2.Orch.Subscribe(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if _, err := s2.Orch.Status(ctx, run); err != nil {
		t.Fatal(err)
	}
	for u := range feed {
		if u.Verdict != nil {
			break
		}
	}
	gradedLate(t, s2, run)
}

// runCalls reads the run's calls as GET /runs/{id}/calls answers them.
func runCalls(t *testing.T, s *orchestratortest.Stack, run runid.ID) []wire.CallEvent {
	t.Helper()
	rr, err := s.Orch.ReadRun(s.Ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	calls, err := rr.Calls(s.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return calls
}
