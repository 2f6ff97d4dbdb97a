package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
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
		InterruptGrace:   c.Sandbox.InterruptGrace,
		Logger:           log,
	})
}

// openEvaluator starts the evaluator. Its rubric runs on the embedded WASI
// interpreter in child processes of this binary (`triad eval-worker`), one
// per interpreter the evaluator keeps, each separate from every user kernel
// and from the sandbox backend. The rubric parses untrusted bytes (a
// step's CSV, HTML, JSON); in a child, the compiled interpreter (about 50
// MiB) and whatever a rubric run costs stay out of the server's memory, and
// a fault in either cannot take the server down. A worker is started when
// the first step that needs the rubric is graded: light steps are graded
// in Go.
func openEvaluator(ctx context.Context, c *config, store *tmpfs.Store, log *slog.Logger) (*evaluator.Evaluator, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("evaluator: find this binary to run its workers: %w", err)
	}
	// Each process stages artifacts and runs workers in directories of
	// its own: several triad processes may share --data (a server, and
	// `triad run` or `triad replay` beside it).
	var dirs []string
	mkdir := func(parent string) (string, error) {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return "", err
		}
		d, err := os.MkdirTemp(parent, "proc-")
		if err != nil {
			return "", err
		}
		dirs = append(dirs, d)
		// Absolute: the workers are handed these paths.
		return filepath.Abs(d)
	}
	removeDirs := func() {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	staging, err1 := mkdir(filepath.Join(c.Data, "eval"))
	work, err2 := mkdir(filepath.Join(c.Data, "work", "evaluator"))
	cache, err3 := filepath.Abs(wazeroCache(c))
	if err := errors.Join(err1, err2, err3); err != nil {
		removeDirs()
		return nil, nil, fmt.Errorf("evaluator: %w", err)
	}
	w := &evalWorkers{self: self, work: work, cache: cache, log: log}
	e, err := evaluator.New(evaluator.Config{
		Interpreter: evaluator.InterpreterFunc(w.start),
		Store:       store,
		Dir:         staging,
		Logger:      log,
	})
	if err != nil {
		removeDirs()
		return nil, nil, err
	}
	return e, func() { e.Close(); removeDirs() }, nil
}

// evalWorkers starts evaluator workers: `triad eval-worker` children. Its
// paths, and the staging directory workers are started with, are absolute.
type evalWorkers struct {
	self, work, cache string
	log               *slog.Logger
}

// start runs the rubric in a new worker that sees dir. Only the evaluator's
// own script runs there: the worker holds its own copy.
func (w *evalWorkers) start(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
	if !bytes.Equal(script, evaluator.Script) {
		return nil, errors.New("evaluator worker: it runs evaluator.Script only")
	}
	cmd := exec.Command(w.self, "eval-worker", "--work", w.work, "--cache", w.cache, "--dir", dir)
	cmd.Env = []string{} // nothing of the server's environment (its keys) reaches the worker
	cmd.Stderr = &logLines{log: w.log}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("evaluator worker: %w", err)
	}
	return &worker{cmd: cmd, stdin: stdin, stdout: stdout}, nil
}

// worker is a running `triad eval-worker`.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.Reader
	once   sync.Once
}

func (p *worker) Stdin() io.Writer  { return p.stdin }
func (p *worker) Stdout() io.Reader { return p.stdout }

// Close ends the worker and waits for it. It is safe to call twice.
func (p *worker) Close() error {
	p.once.Do(func() {
		p.stdin.Close()
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	return nil
}

// logLines logs what a worker writes on stderr, a line at a time.
type logLines struct {
	log *slog.Logger
	buf []byte
}

func (l *logLines) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > 64<<10 {
				l.buf = l.buf[:0]
			}
			return len(b), nil
		}
		l.log.Warn("evaluator worker", "stderr", string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

// evalWorkerCmd is `triad eval-worker`, started by the server only: it
// runs the evaluator's rubric on the embedded WASI interpreter, with dir
// read-only at /in, and relays its stdin and stdout until either ends.
func evalWorkerCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("eval-worker", flag.ContinueOnError)
	work := fs.String("work", "", "directory for this worker's own work root (created inside it, removed on exit)")
	cache := fs.String("cache", "", "wazero compilation cache")
	dir := fs.String("dir", "", "the artifacts the rubric reads, at /in")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := os.MkdirTemp(*work, "worker-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	// Warnings go to stderr, which the server logs (logLines).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := wasm.New(ctx, wasm.Config{WorkRoot: root, CacheDir: *cache, MemoryLimitBytes: 512 << 20, Logger: log})
	if err != nil {
		return err
	}
	defer b.Close()
	// A compile without a warm cache leaves the compiler's garbage in
	// the heap, which the runtime would return to the system slowly.
	debug.FreeOSMemory()
	p, err := b.StartProgram(ctx, evaluator.Script, *dir)
	if err != nil {
		return err
	}
	defer p.Close()
	go func() {
		// The server closed the pipe, or died: end the program.
		io.Copy(p.Stdin(), os.Stdin)
		p.Close()
	}()
	_, err = io.Copy(os.Stdout, p.Stdout())
	if errors.Is(err, io.ErrClosedPipe) {
		err = nil
	}
	return err
}
