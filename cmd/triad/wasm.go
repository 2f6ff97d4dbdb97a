package main

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
)

// wazeroCache is where compiled python.wasm is cached under --data, so a
// restarted server loads it in a fraction of a second.
func wazeroCache(c *config) string { return filepath.Join(c.Data, "cache", "wazero") }

// openWasm starts the embedded WASI sandbox.
func openWasm(ctx context.Context, c *config, log *slog.Logger) (sandbox.Backend, error) {
	return wasm.New(ctx, wasm.Config{
		WorkRoot:         filepath.Join(c.Data, "work", "wasm"),
		CacheDir:         wazeroCache(c),
		MemoryLimitBytes: min(c.Sandbox.memory, 4<<30),
		Logger:           log,
	})
}

// openEvaluator starts the evaluator on an embedded WASI interpreter of its
// own, separate from every user kernel and from the sandbox backend.
func openEvaluator(ctx context.Context, c *config, store *tmpfs.Store, log *slog.Logger) (*evaluator.Evaluator, func(), error) {
	wb, err := wasm.New(ctx, wasm.Config{
		WorkRoot:         filepath.Join(c.Data, "work", "evaluator"),
		CacheDir:         wazeroCache(c),
		MemoryLimitBytes: 512 << 20,
		Logger:           log,
	})
	if err != nil {
		return nil, nil, err
	}
	e, err := evaluator.New(evaluator.Config{
		Interpreter: evaluator.InterpreterFunc(func(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
			return wb.StartProgram(ctx, script, dir)
		}),
		Store:  store,
		Dir:    filepath.Join(c.Data, "eval"),
		Logger: log,
	})
	if err != nil {
		wb.Close()
		return nil, nil, err
	}
	return e, func() { e.Close(); wb.Close() }, nil
}
