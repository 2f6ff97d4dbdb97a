package main

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"runtime/debug"
	"sync"

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
// own, separate from every user kernel and from the sandbox backend. The
// interpreter is compiled (or loaded from the cache under --data) when the
// first step that needs it is graded, not at startup: light steps are
// graded in Go, and the compiled module is about 40 MiB of the server's
// memory (its machine code and the embedded python.wasm it is read from)
// that a server which never needs it should not carry.
func openEvaluator(ctx context.Context, c *config, store *tmpfs.Store, log *slog.Logger) (*evaluator.Evaluator, func(), error) {
	lw := &lazyWasm{cfg: wasm.Config{
		WorkRoot:         filepath.Join(c.Data, "work", "evaluator"),
		CacheDir:         wazeroCache(c),
		MemoryLimitBytes: 512 << 20,
		Logger:           log,
	}}
	e, err := evaluator.New(evaluator.Config{
		Interpreter: evaluator.InterpreterFunc(lw.startProgram),
		Store:       store,
		Dir:         filepath.Join(c.Data, "eval"),
		Logger:      log,
	})
	if err != nil {
		return nil, nil, err
	}
	return e, func() { e.Close(); lw.close() }, nil
}

// lazyWasm is a wasm backend created on its first use.
type lazyWasm struct {
	cfg wasm.Config

	mu     sync.Mutex
	b      *wasm.Backend
	closed bool
}

// startProgram starts script on the backend, creating the backend first if
// this is the first program. A failed creation is retried by the next call.
func (l *lazyWasm) startProgram(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("the evaluator's interpreter is closed")
	}
	if l.b == nil {
		b, err := wasm.New(context.WithoutCancel(ctx), l.cfg)
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		l.b = b
		// A compile without a warm cache leaves about 100 MiB of the
		// compiler's garbage in the heap, which the runtime would return
		// to the system only slowly: return it now, once.
		debug.FreeOSMemory()
	}
	b := l.b
	l.mu.Unlock()
	return b.StartProgram(ctx, script, dir)
}

// close closes the backend if it was created; later starts fail.
func (l *lazyWasm) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.b != nil {
		l.b.Close()
	}
}
