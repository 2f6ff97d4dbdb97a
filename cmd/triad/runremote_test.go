package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// triad run --server sends --input files with POST /run (multipart), so
// the server sees them with the request: an input the recipe lacks, or a
// param it lacks, is refused by the server naming it, and leaves no run.
func TestRunRemoteSendsInputs(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	s := startServer(t, bin, data, "--sandbox", "wasm")
	file := filepath.Join(t.TempDir(), "snapshot.json")
	if err := os.WriteFile(file, []byte(`{"format": "triad.competitor-snapshot/v1", "taken_at": "2026-10-30", "competitors": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--input", "nope=" + file}, `has no input \"nope\"`},
		{[]string{"--input", "previous=" + file, "--param", "colour=red"}, "colour"},
	} {
		args := append([]string{"run", "competitor-alert", "--server", s.url, "--api-key", s.key}, tc.args...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "400") || !strings.Contains(string(out), tc.want) {
			t.Errorf("triad %s: err %v, want a 400 naming %s:\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
	var runs struct {
		Runs []struct{} `json:"runs"`
	}
	if code := s.json("GET", "/runs", nil, &runs); code != 200 || len(runs.Runs) != 0 {
		t.Errorf("refused runs left %d runs (GET /runs %d)", len(runs.Runs), code)
	}
}
