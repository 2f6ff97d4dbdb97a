package api_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// A call answers before its step is recorded (see orchestrator/pending.go),
// yet every read issued right after the answer shows the step with its
// verdict: GET /cel, GET /runs/{id}, and the trace. The reads go out the
// moment each answer arrives, while the recording (the evaluator, the
// appends) is still running, so a reader that did not wait for it would
// see the step missing.
func TestVerdictVisibleRightAfterAnswer(t *testing.T) {
	for _, backend := range []string{"docker", "wasm"} {
		t.Run(backend, func(t *testing.T) {
			c := sandboxServer(t, backend)
			const run = "r-verdict"
			evalLine := regexp.MustCompile(`\*\*Evaluation \(by Evaluator\):\*\* (PASS|FAIL) — `)
			for i := 1; i <= 12; i++ {
				var n int
				if i%3 == 0 {
					c.write(run, fmt.Sprintf("data/%d.csv", i), "a,b\n1,2\n")
				} else {
					out, a := c.exec(run, map[string]any{"code": fmt.Sprintf("x = %d\nx * 2", i)})
					if a.status != 200 || !out.OK {
						t.Fatalf("exec %d: %d %s", i, a.status, a.body)
					}
				}
				n = i
				a := c.do(http.MethodGet, "/cel", run, nil)
				if a.status != 200 {
					t.Fatalf("GET /cel: %d %s", a.status, a.body)
				}
				heading := fmt.Sprintf("\n## Step %d: ", n)
				_, block, ok := strings.Cut(string(a.body), heading)
				if !ok || !evalLine.MatchString(block) || strings.Contains(string(a.body), "PENDING") {
					t.Fatalf("GET /cel right after call %d has no Step Block with a verdict for it:\n%s", n, a.body)
				}
				if v := runView(t, c, run); len(v.Steps) != n || v.Steps[n-1].Evaluation == "" {
					t.Fatalf("GET /runs/%s right after call %d: %+v", run, n, v.Steps)
				}
			}
			checkRecordsAgree(t, c, run)
		})
	}
}
