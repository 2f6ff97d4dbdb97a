package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// openWasm starts the embedded WASI sandbox.
func openWasm(ctx context.Context, c *config, log *slog.Logger) (sandbox.Backend, error) {
	return nil, fmt.Errorf("%w: the wasm sandbox is not in this build yet; use --sandbox docker", sandbox.ErrUnavailable)
}

// openEvaluator starts the evaluator on the embedded WASI interpreter.
func openEvaluator(ctx context.Context, c *config, store *tmpfs.Store, log *slog.Logger) (*evaluator.Evaluator, error) {
	log.Warn("the evaluator's wasm interpreter is not in this build yet; Evaluation lines will say so")
	return nil, nil
}
