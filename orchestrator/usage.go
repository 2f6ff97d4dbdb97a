package orchestrator

import (
	"context"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/wire"
)

// Per-run accounting: the kernel manager reads a run's live kernel after
// each step that ran in it (record), before a restart, every
// --usage-every, and a last time before the kernel stops, and hands what
// it used since its previous reading to used, which adds it, with the
// bytes the run's egress moved since, to the run's usage and its tenant's
// (tenancy.Use). A reading never fails or holds up a call: the step's
// answer is sent before it, and one that fails is logged and skipped. See
// docs/DECISIONS.md, "Per-run accounting (issue 27)".

// used adds what the run's kernel used (u) and what its egress moved
// since the last time to its usage; a run that is not found (deleted)
// adds nothing.
func (o *Orchestrator) used(ctx context.Context, run runid.ID, u kernels.Used) {
	r, done := o.runs.use(run)
	defer done()
	ow, ok := o.kernelOwner(ctx, r)
	if !ok {
		return
	}
	var add tenancy.Used
	if u.CPUKnown {
		s := u.CPU.Seconds()
		add.CPUSeconds = &s
	}
	if u.Memory >= 0 {
		m, bs := u.Memory, u.MemoryByteSeconds
		add.MemoryBytes, add.MemoryByteSeconds = &m, &bs
	}
	add.EgressOut, add.EgressIn = o.sb.moved(run)
	o.t.Use(ctx, ow, add)
}

// meterStep reads the run's kernel after a step that ran in it.
func (o *Orchestrator) meterStep(ctx context.Context, run runid.ID, out Outcome) {
	if o.kernels == nil {
		return
	}
	switch out.(type) {
	case *ExecOutcome, *ContextOutcome:
		o.kernels.Meter(ctx, run)
	}
}

// Usage is what a run used (GET /runs/{id}'s usage): its kernels as of
// their last reading, its egress, and the bytes its files hold now.
func (rr *RunReader) Usage(ctx context.Context) wire.RunUsage {
	return rr.o.t.RunUsage(ctx, rr.owner)
}

// TenantUsage is what the caller's tenant's runs used and store (GET
// /usage); an admin may name another tenant.
func (o *Orchestrator) TenantUsage(ctx context.Context, tenant string) (wire.TenantUsage, error) {
	return o.t.TenantUsage(ctx, tenant)
}
