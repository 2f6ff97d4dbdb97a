package runner_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
)

const oneWrite = "---\nname: one-write\ntitle: One write\ndescription: A recipe that writes a CSV.\nbackend: any\n---\n\n" +
	"```write {path: \"data/kpis.csv\"}\nchannel,cac\nads,12\nseo,8\n```\n"

// muteOnce is the test's fault hook on the evaluator: the first request
// that names kpis.csv is taken and never answered (an evaluator starved
// of CPU), until the evaluator's deadline closes the interpreter; every
// other request, the regrade's included, is answered by the real rubric.
type muteOnce struct {
	evaluator.Process
	used *atomic.Bool
	gate chan struct{} // closed by Close
	once sync.Once
	mute atomic.Bool
}

func (p *muteOnce) Stdin() io.Writer { return p }

func (p *muteOnce) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("kpis.csv")) && p.used.CompareAndSwap(false, true) {
		p.mute.Store(true)
		return len(b), nil
	}
	return p.Process.Stdin().Write(b)
}

func (p *muteOnce) Stdout() io.Reader { return muteReader{p} }

type muteReader struct{ p *muteOnce }

func (r muteReader) Read(b []byte) (int, error) {
	if r.p.mute.Load() {
		<-r.p.gate
		return 0, io.EOF
	}
	return r.p.Process.Stdout().Read(b)
}

func (p *muteOnce) Close() error {
	p.once.Do(func() { close(p.gate) })
	return p.Process.Close()
}

// A recipe step whose verdict the evaluator could not give in time waits
// for the regrade's verdict: it says PASS, never FAIL or UNGRADED, and
// CEL.md has the late verdict.
func TestRecipeStepWaitsForVerdict(t *testing.T) {
	var used atomic.Bool
	hook := func(next evaluator.Interpreter) evaluator.Interpreter {
		return evaluator.InterpreterFunc(func(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
			p, err := next.Start(ctx, script, dir)
			if err != nil {
				return nil, err
			}
			return &muteOnce{Process: p, used: &used, gate: make(chan struct{})}, nil
		})
	}
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", EvalFault: hook, EvalTimeout: 2 * time.Second})
	rc, err := recipes.Parse("one-write.md", []byte(oneWrite))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := recipes.NewCatalog(rc)
	if err != nil {
		t.Fatal(err)
	}
	r := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { r.Close() })
	ctx := s.Ctx(t)
	st, err := r.Run(ctx, runner.Request{Recipe: "one-write"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := runid.Must(st.RunID)
	cel, _ := s.Orch.Journal(ctx, run)
	if st.Status != runner.Succeeded {
		t.Fatalf("status %s: %s\n%s", st.Status, st.Error, cel)
	}
	if !used.Load() {
		t.Fatal("the fault hook never muted the evaluator: the step was not graded by the rubric")
	}
	for _, ss := range st.Steps {
		if !strings.HasPrefix(ss.Evaluation, "PASS ") {
			t.Errorf("recipe step %s: got evaluation %q, want PASS", ss.ID, ss.Evaluation)
		}
	}
	if !strings.Contains(string(cel), "UNGRADED — ") || !strings.Contains(string(cel), "### Late verdict of Step ") || strings.Contains(string(cel), "FAIL —") {
		t.Fatalf("CEL.md: want an UNGRADED step, its late verdict and no FAIL:\n%s", cel)
	}
}
