package main_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// call makes one tool call over HTTP in run and returns its status and body.
func (s *server) call(run, path string, body any) (int, []byte) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.url+path, bytes.NewReader(b))
	req.Header.Set("X-Run-Id", run)
	resp, err := s.do(req)
	if err != nil {
		s.t.Fatalf("POST %s: %v\n%s", path, err, s.logs)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (s *server) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		s.t.Fatalf("triad serve did not stop cleanly: %v\n%s", err, s.logs)
	}
}

type replayReport struct {
	RunID     string   `json:"run_id"`
	Identical bool     `json:"identical"`
	Same      int      `json:"identical_files"`
	Different int      `json:"different_files"`
	Why       []string `json:"why"`
}

// A session made over HTTP on the real binary, with a seed and as_of given
// at POST /runs, replays after the server stopped: with `triad replay`
// over the same data directory, and with POST /runs/{id}/replay on a
// restarted server, where another seed makes the seeded file differ.
func TestReplayCommandAfterRestart(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	s := startServer(t, bin, data, "--sandbox", "wasm")

	for _, bad := range []map[string]any{{"seed": -1}, {"as_of": "yesterday"}, {"seed": 1 << 33}} {
		if code := s.json(http.MethodPost, "/runs", bad, nil); code != http.StatusBadRequest {
			t.Errorf("POST /runs %v: got %d, want 400", bad, code)
		}
	}
	var nr struct {
		RunID string `json:"run_id"`
		Seed  int64  `json:"seed"`
		AsOf  string `json:"as_of"`
	}
	if code := s.json(http.MethodPost, "/runs", map[string]any{"seed": 42, "as_of": "2025-06-30"}, &nr); code != http.StatusCreated || nr.Seed != 42 || nr.AsOf != "2025-06-30" {
		t.Fatalf("POST /runs: %d %+v", code, nr)
	}
	run := nr.RunID
	if code, b := s.call(run, "/tmp/write", map[string]any{"path": "in.txt", "text": "hello\n"}); code != http.StatusOK {
		t.Fatalf("tmp.write: %d %s", code, b)
	}
	code, b := s.call(run, "/sandbox/exec", map[string]any{"code": "import os, random\n" +
		"open('out.txt', 'w').write(' '.join([open('in.txt').read().strip(), str(TRIAD_SEED), TRIAD_AS_OF, os.environ['SOURCE_DATE_EPOCH'], repr(random.random())]))"})
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"ok":true`)) {
		t.Fatalf("exec: %d %s", code, b)
	}
	code, b = s.call(run, "/sandbox/exec", map[string]any{"code": "print(open('out.txt').read())"})
	if code != http.StatusOK || !bytes.Contains(b, []byte("hello 42 2025-06-30 1751241600 ")) {
		t.Fatalf("the cell did not see the run's seed and as_of: %d %s", code, b)
	}
	s.stop()

	out, err := exec.Command(bin, "replay", run, "--data", data, "--sandbox", "wasm").CombinedOutput()
	if err != nil {
		t.Fatalf("triad replay: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "reproduced: 2 identical, 0 different (seed 42") || !strings.Contains(string(out), "= out.txt") {
		t.Errorf("triad replay output:\n%s", out)
	}

	s = startServer(t, bin, data, "--sandbox", "wasm")
	var rep replayReport
	if code := s.json(http.MethodPost, "/runs/"+run+"/replay", nil, &rep); code != http.StatusCreated || !rep.Identical || rep.Same != 2 {
		t.Errorf("POST /runs/{id}/replay: %d %+v", code, rep)
	}
	if code := s.json(http.MethodPost, "/runs/"+run+"/replay", map[string]any{"seed": 43}, &rep); code != http.StatusCreated ||
		rep.Identical || rep.Different != 1 || len(rep.Why) == 0 || !strings.Contains(rep.Why[0], "seed 43") {
		t.Errorf("POST /runs/{id}/replay with seed 43: %d %+v, want out.txt different because of the seed", code, rep)
	}
	var e struct {
		Error struct{ Kind, Message, Suggestion string } `json:"error"`
	}
	for path, want := range map[string]int{"/runs/-bad/replay": http.StatusBadRequest, "/runs/r-never-made/replay": http.StatusNotFound} {
		if code := s.json(http.MethodPost, path, nil, &e); code != want || e.Error.Suggestion == "" {
			t.Errorf("POST %s: got %d %+v, want %d with a suggestion", path, code, e, want)
		}
	}
	out, err = exec.Command(bin, "replay", run, "--server", s.url, "--api-key", s.key, "--seed", "43").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "diverged") || !strings.Contains(string(out), "≠ out.txt") {
		t.Errorf("triad replay --server --seed 43: err %v, want a failure naming out.txt:\n%s", err, out)
	}
}
