package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
)

// Program is a Python program running in an interpreter of its own, with a
// read-only view of one host directory and nothing else. The evaluator runs
// its rubric this way: no user kernel shares its process, globals or files.
type Program struct {
	stdin  *io.PipeWriter
	stdout *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// StartProgram runs script in a fresh instance of the compiled interpreter.
// dir is mounted read-only at /in (the stdlib at /lib); the program reads
// its stdin and writes its stdout through the returned pipes until Close.
func (b *Backend) StartProgram(ctx context.Context, script []byte, dir string) (*Program, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, errors.New("wasm backend: closed")
	}
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	fsc := wazero.NewFSConfig().(sysfs.FSConfig).
		WithSysFSMount(&sysfs.AdaptFS{FS: rootFS{mounts: []string{"in", "lib"}}}, "/").(sysfs.FSConfig).
		WithSysFSMount(&sysfs.ReadFS{FS: sysfs.DirFS(dir)}, "/in").(sysfs.FSConfig).
		WithSysFSMount(&sysfs.ReadFS{FS: &sysfs.AdaptFS{FS: b.libFS}}, "/lib")
	mc := wazero.NewModuleConfig().
		WithName("program-"+randomHex(6)).
		WithStartFunctions().
		WithArgs("python", "-S", "-B", "-c", string(script)).
		WithEnv("PYTHONHOME", "/").
		WithEnv("PYTHONUTF8", "1").
		WithEnv("LANG", "C.UTF-8").
		WithStdin(stdinR).
		WithStdout(stdoutW).
		WithStderr(io.Discard).
		WithFSConfig(fsc).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(func(ns int64) { time.Sleep(time.Duration(ns)) }).
		WithRandSource(rand.Reader)
	ictx := experimental.WithMemoryAllocator(ctx, newAllocator(b.memLimit, &memStats{}))
	mod, err := b.rt.InstantiateModule(ictx, b.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("instantiate python.wasm: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p := &Program{stdin: stdinW, stdout: stdoutR, cancel: cancel, done: make(chan struct{})}
	start := mod.ExportedFunction("_start")
	go func() {
		_, err := start.Call(runCtx)
		_ = stdinR.CloseWithError(io.ErrClosedPipe)
		if err == nil {
			err = io.EOF
		}
		_ = stdoutW.CloseWithError(err)
		_ = mod.Close(context.Background())
		close(p.done)
	}()
	return p, nil
}

// Stdin is the program's standard input.
func (p *Program) Stdin() io.Writer { return p.stdin }

// Stdout is the program's standard output; reads fail once it has ended.
func (p *Program) Stdout() io.Reader { return p.stdout }

// Close ends the program and waits for its instance to go. It is safe to
// call twice.
func (p *Program) Close() error {
	p.once.Do(func() {
		p.stdin.Close()
		p.cancel()
	})
	<-p.done
	return nil
}
