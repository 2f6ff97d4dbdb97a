package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// A recorded step is one group commit: on the local store, the run's
// index log gains one record that puts the checkpoint, CEL.md,
// evaluations.jsonl, trace.jsonl and the artifact index together, so a
// crash leaves all of them or none (tmpfs/local's crash-point test proves
// the record's side; docs/DECISIONS.md, "One group commit per step").
func TestStepIsOneIndexRecord(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{})
	ctx := s.Ctx(t)
	run := runid.New()
	for _, p := range []string{"artifacts/a.txt", "artifacts/b.txt"} {
		if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: p, Text: text("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if tr, err := s.Trace(ctx, run); err != nil || len(tr) != 2 {
		t.Fatalf("trace: got %d records (%v), want 2", len(tr), err)
	}
	log, err := os.ReadFile(filepath.Join(s.Dir, "store", "runs", run.String(), "index.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(log), []byte("\n"))
	var rec struct {
		Op    string `json:"op"`
		Files []struct {
			Path string `json:"path"`
		} `json:"files"`
	}
	if err := json.Unmarshal(lines[len(lines)-1], &rec); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range rec.Files {
		got = append(got, f.Path)
	}
	slices.Sort(got)
	want := []string{"CEL.md", "CEL.step_2.md", "artifacts/index.json", "evaluations.jsonl", "trace.jsonl"}
	if rec.Op != "batch" || !slices.Equal(got, want) {
		t.Fatalf("step 2's record: got %s %v, want batch %v", rec.Op, got, want)
	}
}
