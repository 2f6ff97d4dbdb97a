package orchestrator

import (
	"context"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// StartStep does what call does for a call before the tool runs, holding
// run with h: the lock's Begin and the step-started marker. A test that
// then drops h without recording stands for a process that died between
// the call's answer and its verdict.
func (o *Orchestrator) StartStep(ctx context.Context, h Held, run runid.ID, out Outcome) {
	s := &Step{Run: run, Outcome: out, Started: time.Now().UTC()}
	o.begin(ctx, h, s)
	o.markStep(ctx, s)()
}
