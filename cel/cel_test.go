package cel_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./cel -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("%s differs from golden file:\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

var when = time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)

func TestFormatGolden(t *testing.T) {
	cases := []struct {
		name  string
		block cel.Block
	}{
		{"step_exec.md", cel.Block{
			N: 3, Tool: "sandbox.exec", When: when,
			Input: []cel.KV{{"code", `"import pandas as pd" (12 lines, sha256:0123456789ab)`}, {"timeout_s", "60"}},
			Did:   []string{"Ran a 12-line Python cell in the docker kernel: ok", "Wrote 1 file"},
			Artifacts: []cel.Artifact{{Path: "kpis.csv", Size: 1234, SHA256: tmpfs.DigestOf([]byte("kpis"))},
				{Path: "artifacts/charts/cac.png", Size: 20000, SHA256: tmpfs.DigestOf([]byte("png"))}},
			Next: []string{"Forecast 12m horizon with SARIMA"},
			Eval: cel.Evaluation{Pass: true, Score: 0.95, Completeness: 1, Correctness: 1, Evidence: 0.8, Hygiene: 1, Critique: "All expected artifacts present and parse."},
		}},
		{"step_fail.md", cel.Block{
			N: 7, Tool: "sandbox.exec", When: when,
			Input: []cel.KV{{"code", `"1/0" (1 lines, sha256:aaaaaaaaaaaa)`}},
			Did:   []string{"Ran a 1-line Python cell: failed with ZeroDivisionError: division by zero"},
			Next:  []string{"Fix the cell and run it again"},
			Eval:  cel.Evaluation{Pass: false, Score: 0.25, Completeness: 0, Correctness: 0, Evidence: 1, Hygiene: 0, Critique: "The cell raised ZeroDivisionError.\nstderr has a traceback."},
		}},
		{"step_none.md", cel.Block{N: 1, Tool: "tmp.list", When: when, Eval: cel.Evaluation{Pass: true, Score: 1, Completeness: 1, Correctness: 1, Evidence: 1, Hygiene: 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { golden(t, tc.name, cel.Format(tc.block)) })
	}
	t.Run("header", func(t *testing.T) {
		golden(t, "header.md", cel.FormatHeader(cel.Header{Run: runid.Must("r-1"), Started: when, Recipe: "market-scan", Objective: "Size the EU market"}))
	})
	t.Run("header_setup", func(t *testing.T) {
		golden(t, "header_setup.md", cel.FormatHeader(cel.Header{Run: runid.Must("r-2"), Started: when, Recipe: "sales-reallocation",
			Setup: &wire.RunSetup{Seed: 1234567, SeedFrom: "derived from the recipe, its params and its inputs", AsOf: "2025-06-30",
				AsOfFrom: "the latest date in input leads", SourceDateEpoch: 1751241600, Backend: "docker", Runtime: "runsc", Image: "triad-sandbox:c8128650f7f9",
				ReplayOf: "r-1"}}))
	})
	t.Run("note", func(t *testing.T) {
		golden(t, "note.md", cel.FormatNote(cel.Note{When: when, Author: "ana", Text: "Use the 2025 price list.\nIgnore vendor blogs."}))
	})
	t.Run("summary", func(t *testing.T) {
		golden(t, "summary.md", cel.FormatSummary(cel.Summary{When: when, Status: "succeeded", Steps: 4, Passed: 3, Failed: 1,
			Artifacts: []cel.Artifact{{Path: "artifacts/brief.pdf", Size: 99, SHA256: tmpfs.DigestOf([]byte("pdf"))}}}))
	})
}

func TestJournalNumbersStepsAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() *cel.Journal {
		b, _ := local.NewBlobs(dir)
		x, _ := local.NewIndex(dir)
		t.Cleanup(func() { x.Close() })
		return cel.New(tmpfs.New(b, x, nil))
	}
	ctx := t.Context()
	run := runid.New()
	j := open()
	if _, err := j.Start(ctx, cel.Header{Run: run, Started: when}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		n, _, err := j.Next(ctx, run)
		if err != nil || n != i {
			t.Fatalf("Next: got %d, %v, want %d", n, err, i)
		}
		files, err := j.Append(ctx, run, cel.Block{N: n, Tool: "tmp.list", When: when})
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 2 || files[0].Path != "CEL.step_"+string(rune('0'+i))+".md" {
			t.Fatalf("got %+v, want a checkpoint and the journal", files)
		}
	}
	if _, err := j.Append(ctx, run, cel.Block{N: 5, Tool: "tmp.list", When: when}); err == nil {
		t.Fatal("appending step 5 after 3 succeeded; want an error")
	}
	if _, err := j.AddNote(ctx, run, cel.Note{When: when, Text: "look here"}); err != nil {
		t.Fatal(err)
	}
	j2 := open()
	n, _, err := j2.Next(ctx, run)
	if err != nil || n != 4 {
		t.Fatalf("after restart: got %d, %v, want 4", n, err)
	}
	text, err := j2.Read(ctx, run)
	if err != nil || strings.Count(string(text), "\n## Step ") != 3 || !strings.Contains(string(text), "> look here") {
		t.Fatalf("journal: %s", text)
	}
}

// TestForgetRereads: after Forget, the journal's step count and the notes
// the next step must see come from the store, as another process left them.
func TestForgetRereads(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	run := runid.New()
	when := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	// Two "processes" over one store.
	a, other := cel.New(store), cel.New(store)
	if _, err := a.Start(ctx, cel.Header{Run: run, Started: when}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Append(ctx, run, cel.Block{N: 1, Tool: "tmp.list", When: when}); err != nil {
		t.Fatal(err)
	}
	if n, _, err := other.Next(ctx, run); err != nil || n != 2 {
		t.Fatalf("the other process's next step: got %d, %v, want 2", n, err)
	}
	if _, err := other.Append(ctx, run, cel.Block{N: 2, Tool: "tmp.list", When: when}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.AddNote(ctx, run, cel.Note{When: when, Author: "ops", Text: "look at b.csv\nnot a.csv"}); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := a.Next(ctx, run); n != 2 {
		t.Fatalf("a's cached next step: got %d, want the stale 2 before Forget", n)
	}
	a.Forget(run)
	n, notes, err := a.Next(ctx, run)
	if err != nil || n != 3 {
		t.Fatalf("next step after Forget: got %d, %v, want 3", n, err)
	}
	if len(notes) != 1 || notes[0].Author != "ops" || notes[0].Text != "look at b.csv\nnot a.csv" || !notes[0].When.Equal(when) {
		t.Errorf("notes after Forget: got %+v, want the other process's note", notes)
	}
}

// TestFinalizeOnce: a second Finalize with nothing new appends nothing,
// in this process or after a restart; a later step, note or status does.
func TestFinalizeOnce(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	run := runid.New()
	j := cel.New(store)
	if _, err := j.Start(ctx, cel.Header{Run: run, Started: when}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(ctx, run, cel.Block{N: 1, Tool: "tmp.list", When: when}); err != nil {
		t.Fatal(err)
	}
	summaries := func(j *cel.Journal) int {
		b, err := j.Read(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "\n## Summary\n")
	}
	finalize := func(j *cel.Journal, status string, steps int) int {
		t.Helper()
		files, err := j.Finalize(ctx, run, cel.Summary{When: when, Status: status, Steps: steps})
		if err != nil {
			t.Fatal(err)
		}
		return len(files)
	}
	for i, tc := range []struct {
		j      *cel.Journal
		status string
		steps  int
		wrote  bool
		want   int
	}{
		{j, "", 1, true, 1},
		{j, "", 1, false, 1},              // clicked again
		{cel.New(store), "", 1, false, 1}, // another process, or a restart
		{j, "failed", 1, true, 2},         // the run's status is news
		{j, "failed", 1, false, 2},
		{j, "", 1, false, 2}, // no status: the last summary stands
	} {
		if got := finalize(tc.j, tc.status, tc.steps) > 0; got != tc.wrote || summaries(j) != tc.want {
			t.Fatalf("finalize %d: wrote %v, %d summaries; want wrote %v, %d summaries", i+1, got, summaries(j), tc.wrote, tc.want)
		}
	}
	if _, err := j.AddNote(ctx, run, cel.Note{When: when, Text: "one more thing"}); err != nil {
		t.Fatal(err)
	}
	if finalize(j, "failed", 1) == 0 || summaries(j) != 3 {
		t.Fatalf("after a note, finalize appended nothing: %d summaries", summaries(j))
	}
	if _, err := j.Append(ctx, run, cel.Block{N: 2, Tool: "tmp.list", When: when}); err != nil {
		t.Fatal(err)
	}
	if finalize(cel.New(store), "failed", 2) == 0 || summaries(j) != 4 {
		t.Fatalf("after a step, finalize appended nothing: %d summaries", summaries(j))
	}
}

// An ungraded step's Evaluation line says UNGRADED and why, never FAIL;
// its late verdict is a section of its own, which numbers no step: the
// next Step Block's number is unchanged, in this process and another, and
// a summary after it is news.
func TestUngradedAndLate(t *testing.T) {
	line := cel.Evaluation{Ungraded: true, Critique: "evaluator did not answer in time"}.Line()
	if !strings.HasPrefix(line, "UNGRADED — ") || !strings.Contains(line, "did not answer in time") || strings.Contains(line, "FAIL") {
		t.Errorf("ungraded line: got %q", line)
	}
	ctx := t.Context()
	b, _ := local.NewBlobs(t.TempDir())
	x, _ := local.NewIndex(t.TempDir())
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	j := cel.New(store)
	run := runid.New()
	when := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	if _, err := j.Start(ctx, cel.Header{Run: run, Started: when}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(ctx, run, cel.Block{N: 1, Tool: "tmp.write", When: when, Eval: cel.Evaluation{Ungraded: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AppendLate(ctx, run, cel.Late{N: 2, Tool: "tmp.write", When: when}); err == nil {
		t.Error("a late verdict of a step the journal does not have was appended")
	}
	if _, err := j.Finalize(ctx, run, cel.Summary{When: when, Steps: 1, Ungraded: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AppendLate(ctx, run, cel.Late{N: 1, Tool: "tmp.write", When: when, Eval: cel.Evaluation{Pass: true, Score: 1}}); err != nil {
		t.Fatal(err)
	}
	text, _ := j.Read(ctx, run)
	want := "\n### Late verdict of Step 1: tmp.write\n**When:** 2026-11-28T08:00:00Z\n**Evaluation (by Evaluator):** PASS — score=1.00"
	if !strings.Contains(string(text), want) || !strings.Contains(string(text), "(0 PASS, 0 FAIL, 1 UNGRADED)") {
		t.Errorf("journal: got\n%s\nwant the summary's UNGRADED count and %q", text, want)
	}
	for _, jj := range []*cel.Journal{j, cel.New(store)} {
		if n, _, err := jj.Next(ctx, run); err != nil || n != 2 {
			t.Errorf("next step after a late verdict: got %d %v, want 2", n, err)
		}
	}
	// Another process reads the late verdict as the journal's last
	// section: the summary before it is not the last word.
	if files, err := cel.New(store).Finalize(ctx, run, cel.Summary{When: when, Steps: 1, Passed: 1}); err != nil || len(files) == 0 {
		t.Errorf("a summary after a late verdict: got %d files %v, want it appended", len(files), err)
	}
}
