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
	b      *Backend
	stdin  *io.PipeWriter
	stdout *io.PipeReader
	cancel context.CancelFunc
	killed chan struct{} // closed by Close: wakes a sleeping guest
	done   chan struct{}
	once   sync.Once
}

// StartProgram runs script in a fresh instance of the compiled interpreter.
// dir is mounted read-only at /in (the stdlib at /lib); the program reads
// its stdin and writes its stdout through the returned pipes until Close.
func (b *Backend) StartProgram(ctx context.Context, script []byte, dir string) (*Program, error) {
	p := &Program{b: b, killed: make(chan struct{}), done: make(chan struct{})}
	// Registered before it starts, so Backend.Close always ends it before
	// releasing the runtime and memory it runs on.
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errors.New("wasm backend: closed")
	}
	b.programs[p] = struct{}{}
	b.mu.Unlock()
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
		WithNanosleep(p.sleep).
		WithRandSource(rand.Reader)
	ictx := experimental.WithMemoryAllocator(ctx, newAllocator(b.memLimit, &memStats{}))
	mod, err := b.rt.InstantiateModule(ictx, b.compiled, mc)
	if err != nil {
		b.forgetProgram(p)
		return nil, fmt.Errorf("instantiate python.wasm: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.stdin, p.stdout, p.cancel = stdinW, stdoutR, cancel
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
		b.forgetProgram(p)
	}()
	return p, nil
}

func (b *Backend) forgetProgram(p *Program) {
	b.mu.Lock()
	delete(b.programs, p)
	b.mu.Unlock()
}

// sleep is the guest's nanosleep: interrupted by Close, so a sleeping
// program never holds Close up.
func (p *Program) sleep(ns int64) {
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.killed:
	}
}

// Stdin is the program's standard input.
func (p *Program) Stdin() io.Writer { return p.stdin }

// Stdout is the program's standard output; reads fail once it has ended.
func (p *Program) Stdout() io.Reader { return p.stdout }

// Close ends the program and waits for its instance to go. It is safe to
// call twice.
func (p *Program) Close() error {
	p.once.Do(func() {
		close(p.killed)
		p.stdin.Close()
		p.cancel()
	})
	<-p.done
	return nil
}
