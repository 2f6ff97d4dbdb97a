package runfiles_test

import (
	"testing"

	"github.com/triadhq/triad/runfiles"
)

func TestPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		want runfiles.Policy
	}{
		{"CEL.md", runfiles.Kept},
		{"CEL.step_12.md", runfiles.Kept},
		{runfiles.Checkpoint(3), runfiles.Kept},
		{"trace.jsonl", runfiles.Kept},
		{"evaluations.jsonl", runfiles.Kept},
		{"artifacts/index.json", runfiles.Kept},
		{"run.json", runfiles.Kept},
		{"run.ipynb", runfiles.Kept},
		{"citations/0001-abc.json", runfiles.Kept},
		{"outputs/exec-0001-display-1.png", runfiles.Kept},
		// Near misses stay the caller's.
		{"artifacts/CEL.md", runfiles.Open},
		{"notes.md", runfiles.Open},
		{"CEL.step_x.md", runfiles.Open},
		{"CEL.md.bak", runfiles.Open},
		{"artifacts/report.md", runfiles.Open},
		{"data/trace.jsonl", runfiles.Open},
		{"citations.json", runfiles.Open},
	} {
		if got := runfiles.PolicyOf(tc.path); got != tc.want {
			t.Errorf("PolicyOf(%q): got %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestDatasetAndDeliverable(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]bool{"leads.csv": true, "data/x.json": true, "citations/0001-a.json": false,
		"artifacts/index.json": false, "outputs/exec-0001-stdout.txt": false, "trace.jsonl": false, "notes.md": false} {
		if got := runfiles.IsDataset(p); got != want {
			t.Errorf("IsDataset(%q): got %v, want %v", p, got, want)
		}
	}
	for p, want := range map[string]bool{"artifacts/brief.pdf": true, "artifacts/index.json": false, "brief.pdf": false} {
		if got := runfiles.IsDeliverable(p); got != want {
			t.Errorf("IsDeliverable(%q): got %v, want %v", p, got, want)
		}
	}
}
