package evaluator_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
)

// heldProcess is a real interpreter whose stdin holds back any request
// naming report.html until release is closed, so a heavy step stays in
// progress for as long as the test needs.
type heldProcess struct {
	evaluator.Process
	started chan struct{}
	once    *sync.Once
	release chan struct{}
}

func (p heldProcess) Stdin() io.Writer { return p }

func (p heldProcess) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("report.html")) {
		p.once.Do(func() { close(p.started) })
		<-p.release
	}
	return p.Process.Stdin().Write(b)
}

// While one run's heavy step (a large HTML report) is being graded,
// another run's light step (a cell with no files) is graded at once, on
// the light lane's own interpreter: it does not wait for the heavy one.
func TestLightStepsDoNotWaitForHeavyOnes(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e, s := newEvaluatorWith(t, func(c *evaluator.Config) {
		real := c.Interpreter
		c.Interpreter = evaluator.InterpreterFunc(func(ctx context.Context, script []byte, d string) (evaluator.Process, error) {
			p, err := real.Start(ctx, script, d)
			if err != nil {
				return nil, err
			}
			return heldProcess{Process: p, started: started, once: &once, release: release}, nil
		})
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	light := evaluator.Request{Tool: "sandbox.exec", OK: true}
	if _, err := e.Evaluate(ctx, runid.New(), light); err != nil {
		t.Fatal(err)
	}

	heavyRun := runid.New()
	html := "<html><body>" + strings.Repeat("<p>The market grew 12%.</p>\n", 4000) + "</body></html>"
	report := artifact(t, s, heavyRun, "report.html", html)
	heavy := make(chan error, 1)
	go func() {
		_, err := e.Evaluate(ctx, heavyRun, evaluator.Request{Tool: "tmp.write", OK: true, Artifacts: []evaluator.Artifact{report}})
		heavy <- err
	}()
	select {
	case <-started:
	case err := <-heavy:
		t.Fatalf("the heavy step ended before it was held: %v", err)
	}

	v, err := e.Evaluate(ctx, runid.New(), light)
	if err != nil || !v.Pass {
		t.Fatalf("light step while a heavy one is graded: got %+v, %v, want a pass", v, err)
	}
	select {
	case err := <-heavy:
		t.Fatalf("the heavy step ended (%v) while held", err)
	default:
	}
	close(release)
	if err := <-heavy; err != nil {
		t.Errorf("heavy step: %v", err)
	}
}

// One step makes the evaluator parse at most MaxStepInspect bytes of
// artifacts; the rest are graded on their metadata.
func TestStepInspectBudget(t *testing.T) {
	e, s := newEvaluatorWith(t, func(c *evaluator.Config) { c.MaxStepInspect = 100 })
	run := runid.New()
	var arts []evaluator.Artifact
	for _, name := range []string{"a.csv", "b.csv", "c.csv"} {
		arts = append(arts, artifact(t, s, run, name, "channel,cac\nads,12\nseo,8\nweb,30\nmail,3\n")) // 41 bytes
	}
	v, err := e.Evaluate(t.Context(), run, evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: arts})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Pass || !strings.Contains(v.Critique, "on 2 artifact(s)") {
		t.Errorf("got %+v, want a pass with 2 of the 3 artifacts parsed (100-byte budget)", v)
	}
}
