package api_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// Over HTTP: a step the evaluator could not grade in time (a test fault
// hook stalls it) is UNGRADED in GET /runs/{id}, GET /runs and GET /cel,
// never FAIL; once the evaluator answers, the run's event stream sends
// its late verdict, and GET /runs/{id} and GET /cel show PASS.
func TestUngradedOverHTTP(t *testing.T) {
	st := &orchestratortest.Stall{}
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", EvalFault: st.Wrap, EvalTimeout: 2 * time.Second})
	c := apiServer(t, api.Config{Orchestrator: s.Orch})
	run := runid.New().String()

	st.Set(true)
	c.write(run, "kpis.csv", "channel,cac\nads,12\nseo,8\n")
	var view wire.RunView
	c.do("GET", "/runs/"+run, "", nil).json(t, &view)
	if len(view.Steps) != 1 || view.Steps[0].Evaluation != "UNGRADED" {
		t.Fatalf("GET /runs/{id} steps: got %+v, want one UNGRADED", view.Steps)
	}
	listed := func() wire.RunSummary {
		t.Helper()
		var list wire.RunList
		c.do("GET", "/runs", "", nil).json(t, &list)
		for _, r := range list.Runs {
			if r.RunID == run {
				return r
			}
		}
		t.Fatalf("GET /runs: run %s not listed: %+v", run, list.Runs)
		return wire.RunSummary{}
	}
	if r := listed(); r.LastVerdict != "UNGRADED" || r.Failed != 0 || r.Passed != 0 {
		t.Errorf("GET /runs: got %+v, want last_verdict UNGRADED counted in neither passed nor failed", r)
	}
	cel := string(c.do("GET", "/cel", run, nil).body)
	if !strings.Contains(cel, "**Evaluation (by Evaluator):** UNGRADED — ") || strings.Contains(cel, "FAIL") {
		t.Fatalf("GET /cel: want UNGRADED and no FAIL:\n%s", cel)
	}

	// Follow the run, then let the evaluator answer.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.url+"/runs/"+run+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	st.Set(false)
	sc := bufio.NewScanner(resp.Body)
	event, late := "", ""
	for late == "" && sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "call":
			if !strings.Contains(line, `"verdict":"UNGRADED"`) {
				t.Errorf("call event: got %s, want UNGRADED", line)
			}
		case strings.HasPrefix(line, "data: ") && event == "verdict":
			late = line
		}
	}
	if !strings.Contains(late, `"step":1,`) || !strings.Contains(late, `"verdict":"PASS"`) {
		t.Fatalf("verdict event: got %q (%v), want step 1 PASS", late, sc.Err())
	}
	c.do("GET", "/runs/"+run, "", nil).json(t, &view)
	if len(view.Steps) != 1 || view.Steps[0].Evaluation != "PASS" {
		t.Fatalf("GET /runs/{id} steps after the regrade: got %+v, want one PASS", view.Steps)
	}
	if r := listed(); r.LastVerdict != "PASS" || r.Passed != 1 || r.Failed != 0 {
		t.Errorf("GET /runs after the regrade: got %+v, want last_verdict PASS, passed 1", r)
	}
	cel = string(c.do("GET", "/cel", run, nil).body)
	if !strings.Contains(cel, "### Late verdict of Step 1: tmp.write\n") || strings.Contains(cel, "FAIL") {
		t.Fatalf("GET /cel after the regrade: want the late verdict of step 1 and no FAIL:\n%s", cel)
	}
}
