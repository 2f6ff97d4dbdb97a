package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/triadhq/triad/sandbox"
)

// openWasm starts the embedded WASI sandbox.
func openWasm(ctx context.Context, c *config, log *slog.Logger) (sandbox.Backend, error) {
	return nil, fmt.Errorf("%w: the wasm sandbox is not in this build yet; use --sandbox docker", sandbox.ErrUnavailable)
}
