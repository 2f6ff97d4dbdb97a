package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
)

// Legacy is where Triad kept sandbox records before the core owned every
// run: the files of a reserved run (tmpfsrecords), which a key of the
// default tenant could read and change through the tools, with each
// sandbox's owner and envs in plain text. New moves them once (migrate).
type Legacy interface {
	Records
	// Run is the reserved run that holds them, retired once they moved.
	Run() runid.ID
}

// Migrate moves the records c.Legacy holds into c.Records, as New does,
// for a server that does not serve the surface. c.Core, c.Records,
// c.Sealer and c.Legacy are required.
func Migrate(ctx context.Context, c Config) error {
	if c.Core == nil || c.Records == nil || c.Sealer == nil || c.Legacy == nil {
		return errors.New("e2b: Migrate needs Core, Records, Sealer and Legacy")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return migrate(ctx, c)
}

// migrate moves every legacy record into c.Records, then retires the
// legacy run. For each sandbox it first makes the core the authority on
// its owner: a run the core does not know yet becomes the recorded
// owner's (the operator's for a record made before owners), created when
// the sandbox started. A run the core already has as another tenant's was
// claimed through the hole issue 23 closes (a call naming the sandbox's id
// before its creator's first call): its record is dropped and logged, so
// the creator's code never runs among files another tenant could write;
// the run stays the claimer's, as the core has it. Each record is stored
// sealed before its legacy copy is deleted, so a crash midway loses
// nothing, and a second start (or a replica starting at once) finds
// nothing left to move.
//
// New runs it when Config.Legacy is set; a server with the surface off
// calls Migrate, so the records leave the runs all the same.
func migrate(ctx context.Context, c Config) error {
	g := &registry{recs: c.Records, seal: c.Sealer, log: c.Logger, m: map[runid.ID]Sandbox{}}
	all, err := c.Legacy.All(ctx)
	if err != nil {
		return fmt.Errorf("read the sandbox records to migrate: %w", err)
	}
	moved, dropped := 0, 0
	for _, b := range all {
		var l legacyRecord
		if err := json.Unmarshal(b, &l); err != nil || l.ID.IsZero() {
			c.Logger.ErrorContext(ctx, "dropping a damaged E2B sandbox record while migrating it", "err", err)
			dropped++
			continue
		}
		p := auth.Operator
		if l.Owner != nil {
			p = *l.Owner
		}
		err := c.Core.Adopt(ctx, l.ID, p, l.StartedAt)
		switch {
		case err == nil:
			sb := Sandbox{ID: l.ID, Template: l.Template, Metadata: l.Metadata, Envs: l.Envs, TimeoutS: l.TimeoutS,
				StartedAt: l.StartedAt, EndAt: l.EndAt, State: l.State, TokenSHA256: l.TokenSHA256}
			if err := g.putLocked(ctx, sb); err != nil {
				return fmt.Errorf("migrate sandbox record %s: %w", l.ID, err)
			}
			moved++
		case errors.Is(err, orchestrator.ErrOwned):
			c.Logger.ErrorContext(ctx, "dropping the E2B sandbox whose run another tenant claimed before its creator's first call; the run stays that tenant's",
				"sandbox", l.ID, "creator_tenant", p.Tenant, "err", err)
			dropped++
		default:
			return fmt.Errorf("migrate sandbox record %s: %w", l.ID, err)
		}
		if err := c.Legacy.Delete(ctx, l.ID); err != nil {
			return fmt.Errorf("delete migrated sandbox record %s: %w", l.ID, err)
		}
	}
	// The run is retired even when it holds nothing more, so that a start
	// that died after moving the records finishes the job.
	if err := c.Core.Retire(ctx, c.Legacy.Run()); err != nil {
		return fmt.Errorf("retire run %s, which held the sandbox records: %w", c.Legacy.Run(), err)
	}
	if moved+dropped > 0 {
		c.Logger.InfoContext(ctx, "moved the E2B sandbox records out of the runs, their envs sealed", "moved", moved, "dropped", dropped,
			"from_run", c.Legacy.Run())
	}
	return nil
}
