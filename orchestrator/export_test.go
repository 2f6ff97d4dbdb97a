package orchestrator

import (
	"context"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
)

// StartStep does what call does for a call before the tool runs, holding
// run with h: it writes the call-in-progress record. A test that then
// drops h without recording stands for a process that died between the
// call's answer and its verdict.
func (o *Orchestrator) StartStep(ctx context.Context, h Held, run runid.ID, out Outcome) {
	s := &Step{Run: run, Outcome: out, Started: time.Now().UTC()}
	n, _, _ := o.j.Next(ctx, run)
	o.j.Begin(ctx, s, n, auth.From(ctx), StepInfo{})()
}

// OwnerLookups counts how often a run's owner was resolved.
func (o *Orchestrator) OwnerLookups() int64 { return o.ownerLookups.n.Load() }
