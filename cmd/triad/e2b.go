package main

import (
	"context"
	"log/slog"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
)

// openE2B builds the E2B surface over the stack's orchestrator, with its
// sandbox records in the stack's store.
func openE2B(ctx context.Context, c *config, st *stack, log *slog.Logger) (*e2b.Server, error) {
	if c.E2B.APIKey == "" {
		log.Warn("the E2B surface is open: set --e2b-api-key (TRIAD_E2B_API_KEY) to demand an X-API-Key")
	}
	return e2b.New(ctx, e2b.Config{
		Core: st.orch, Records: tmpfsrecords.New(st.store),
		APIKey: c.E2B.APIKey, DefaultTimeout: c.E2B.DefaultTimeout, MaxTimeout: c.E2B.MaxTimeout,
		Logger: log.With("surface", "e2b"),
	})
}
