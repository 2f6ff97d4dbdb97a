package main_test

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/triadhq/triad/internal/crashpoint"
)

// A call answers before its verdict is written. If the server dies in
// between (the real binary, killed by SIGKILL right after the answer is
// sent: TRIAD_TEST_CRASH), the restarted server records that step as
// interrupted, with a FAIL verdict, the first time the run is read: never
// a missing step, and never PENDING. GET /cel, GET /runs/{id} and the
// trace then agree, and the run goes on with the next step number.
func TestCrashBetweenAnswerAndVerdict(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	const run = "r-crash"
	t.Setenv(crashpoint.Env, "after-answer:2")
	s := startServer(t, bin, data, "--sandbox", "wasm")
	call := func(s *server, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
		req.Header.Set("X-Run-Id", run)
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.do(req)
		if err != nil {
			t.Fatalf("POST %s: %v\n%s", path, err, s.logs)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call(s, "/tmp/write", `{"path":"a.txt","text":"first"}`); code != 200 {
		t.Fatalf("step 1: %d %s", code, body)
	}
	// Step 2 answers in full, then the process dies before its verdict.
	if code, body := call(s, "/sandbox/exec", `{"code":"print(6*7)"}`); code != 200 || !strings.Contains(body, `"stdout":"42\n"`) {
		t.Fatalf("step 2: %d %s", code, body)
	}
	err := s.cmd.Wait()
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the server did not die by SIGKILL after the answer: %v\n%s", err, s.logs)
	}

	t.Setenv(crashpoint.Env, "")
	s2 := startServer(t, bin, data, "--sandbox", "wasm")
	resp := s2.get("/cel", run)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cel := string(b)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /cel after the restart: %d %s", resp.StatusCode, cel)
	}
	if strings.Contains(cel, "PENDING") {
		t.Fatalf("CEL.md shows PENDING:\n%s", cel)
	}
	_, step2, ok := strings.Cut(cel, "\n## Step 2: sandbox.exec\n")
	if !ok {
		t.Fatalf("CEL.md has no Step Block for the interrupted call:\n%s", cel)
	}
	if !strings.Contains(step2, "interrupted") || !regexp.MustCompile(`\*\*Evaluation \(by Evaluator\):\*\* FAIL — `).MatchString(step2) ||
		!strings.Contains(step2, `code="print(6\*7)"`) {
		t.Fatalf("step 2 is not an interrupted FAIL with its inputs:\n%s", step2)
	}
	var view struct {
		Steps []struct {
			Step       int    `json:"step"`
			Tool       string `json:"tool"`
			Evaluation string `json:"evaluation"`
		} `json:"steps"`
	}
	s2.json("GET", "/runs/"+run, nil, &view)
	if len(view.Steps) != 2 || view.Steps[0].Evaluation != "PASS" || view.Steps[1].Tool != "sandbox.exec" || view.Steps[1].Evaluation != "FAIL" {
		t.Fatalf("GET /runs/%s after the restart: %+v", run, view.Steps)
	}
	// The run goes on: the next call is step 3, and the cell's answer was
	// real (the kernel is new, so its state is gone, but its stdout was
	// kept as the answer said).
	if code, body := call(s2, "/tmp/write", `{"path":"b.txt","text":"after"}`); code != 200 {
		t.Fatalf("step 3: %d %s", code, body)
	}
	// GET /cel right after the answer has the step and its verdict.
	resp = s2.get("/cel", run)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	_, step3, ok := strings.Cut(string(b), "\n## Step 3: tmp.write\n")
	if !ok || strings.Count(string(b), "\n## Step ") != 3 || !strings.Contains(step3, "**Evaluation (by Evaluator):** PASS") {
		t.Fatalf("step 3 with its verdict is not in CEL.md:\n%s", b)
	}
}
