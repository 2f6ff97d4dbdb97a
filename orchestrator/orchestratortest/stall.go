package orchestratortest

import (
	"context"
	"io"
	"sync"
	"sync/atomic"

	"github.com/triadhq/triad/evaluator"
)

// Stall is a fault hook for Options.EvalFault: while on, every
// interpreter the evaluator starts takes requests and never answers, as an
// evaluator starved of CPU would not, until the evaluator's deadline
// closes it; while off, the real interpreter runs. It wraps the
// interpreter in tests only: nothing in the product sleeps or stalls.
type Stall struct {
	on      atomic.Bool
	started atomic.Int64
}

// Set turns the stall on or off, for interpreters started from now on.
func (s *Stall) Set(on bool) { s.on.Store(on) }

// Started is how many stalled interpreters were started.
func (s *Stall) Started() int64 { return s.started.Load() }

// Wrap is the hook: Options{EvalFault: stall.Wrap}.
func (s *Stall) Wrap(next evaluator.Interpreter) evaluator.Interpreter {
	return evaluator.InterpreterFunc(func(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
		if !s.on.Load() {
			return next.Start(ctx, script, dir)
		}
		s.started.Add(1)
		r, w := io.Pipe()
		return &stalled{r: r, w: w}, nil
	})
}

// stalled is an interpreter that never answers; Close ends its output.
type stalled struct {
	r    *io.PipeReader
	w    *io.PipeWriter
	once sync.Once
}

func (p *stalled) Stdin() io.Writer  { return io.Discard }
func (p *stalled) Stdout() io.Reader { return p.r }
func (p *stalled) Close() error {
	p.once.Do(func() { p.w.Close() })
	return nil
}
