// Package evaluator grades every tool call on completeness, correctness, evidence and hygiene, in a jailed interpreter of its own.
//
// The rubric is a small stdlib-only Python program (evaluator.py) run by an
// Interpreter: in production the embedded WASI CPython (sandbox/wasm),
// separate from every user kernel, with the step's artifacts staged into a
// directory it can only read. Nothing a cell does in its kernel (monkeypatched
// builtins, a forged journal) reaches the evaluator's process or its code.
// Steps whose artifacts the rubric would not open are graded by Grade, the
// rubric's arithmetic in Go, held to the Python by a differential test.
package evaluator

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Script is the rubric program the interpreter runs.
//
//go:embed evaluator.py
var Script []byte

// Interpreter starts a jailed Python program.
type Interpreter interface {
	// Start runs script in a fresh interpreter that sees dir read-only at
	// /in and nothing else of the host. The program reads stdin and writes
	// stdout; Close ends it.
	Start(ctx context.Context, script []byte, dir string) (Process, error)
}

// Process is a running program.
type Process interface {
	Stdin() io.Writer
	Stdout() io.Reader
	Close() error
}

// Artifact is a file the step produced.
type Artifact = wire.FileRef

// Expect is an artifact a recipe step declares, with optional checks.
type Expect = wire.ExpectedFile

// Request describes one step to grade.
type Request struct {
	Tool      string     `json:"tool"`
	OK        bool       `json:"ok"`
	Error     string     `json:"error,omitempty"`
	Artifacts []Artifact `json:"artifacts"`
	Expected  []Expect   `json:"expected,omitempty"`
	// RunFiles are the run's files after the step, for expected artifacts
	// the step did not itself write (a resumed step's outputs).
	RunFiles  map[string]Artifact `json:"run_files,omitempty"`
	Results   int                 `json:"results,omitempty"`
	Stderr    string              `json:"stderr,omitempty"`
	Restarted bool                `json:"restarted,omitempty"`
	Tampered  []string            `json:"tampered,omitempty"`
	ElapsedMs int64               `json:"elapsed_ms"`
	BudgetMs  int64               `json:"budget_ms,omitempty"`
	// CitationURLs are the URLs the run's recorded searches returned.
	CitationURLs []string `json:"citation_urls,omitempty"`
	// Datasets are the run's input files, which a report may cite by name.
	Datasets []string `json:"datasets,omitempty"`
	// Dir is set by Evaluate: where the staged artifacts are under /in.
	Dir string `json:"dir,omitempty"`
}

// Verdict is the evaluator's grade.
type Verdict struct {
	Pass         bool    `json:"pass"`
	Score        float64 `json:"score"`
	Completeness float64 `json:"completeness"`
	Correctness  float64 `json:"correctness"`
	Evidence     float64 `json:"evidence"`
	Hygiene      float64 `json:"hygiene"`
	Critique     string  `json:"critique"`
	Error        string  `json:"error,omitempty"`
}

// Config configures an Evaluator.
type Config struct {
	Interpreter Interpreter
	Store       *tmpfs.Store
	// Dir is a host directory for staging artifacts; the interpreter sees
	// it read-only.
	Dir string
	// MaxInspect is the largest artifact copied in for parsing (8 MiB);
	// larger ones are graded on their metadata.
	MaxInspect int64
	// Timeout bounds one evaluation (10 s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Evaluator grades steps. It keeps one interpreter and restarts it if it
// dies or hangs; evaluations are serialized through it.
type Evaluator struct {
	c   Config
	log *slog.Logger
	seq atomic.Int64

	mu   sync.Mutex
	proc Process
	out  *bufio.Reader
}

// New returns an Evaluator; the interpreter starts on first use.
func New(c Config) (*Evaluator, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxInspect == 0 {
		c.MaxInspect = 8 << 20
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	return &Evaluator{c: c, log: c.Logger}, nil
}

// Evaluate grades one step of run: in Go when the rubric would read none
// of its artifacts (Grade), else by the rubric in its interpreter.
func (e *Evaluator) Evaluate(ctx context.Context, run runid.ID, req Request) (Verdict, error) {
	if v, ok := Grade(req); ok {
		return v, nil
	}
	return e.interpret(ctx, run, req)
}

// interpret grades one step by running the rubric in the interpreter, with
// the step's artifacts staged where it can read them.
func (e *Evaluator) interpret(ctx context.Context, run runid.ID, req Request) (Verdict, error) {
	dir := strconv.FormatInt(e.seq.Add(1), 10)
	host := filepath.Join(e.c.Dir, dir)
	if err := os.MkdirAll(host, 0o755); err != nil {
		return Verdict{}, err
	}
	defer os.RemoveAll(host)
	for _, a := range req.Artifacts {
		if a.Size > e.c.MaxInspect {
			continue
		}
		if err := e.stage(ctx, host, a); err != nil {
			e.log.WarnContext(ctx, "stage artifact for the evaluator", "run", run, "path", a.Path, "err", err)
		}
	}
	req.Dir = dir
	line, err := json.Marshal(req)
	if err != nil {
		return Verdict{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, e.c.Timeout)
	defer cancel()
	v, err := e.roundTrip(ctx, line)
	if err != nil {
		return Verdict{}, err
	}
	if v.Error != "" {
		return v, fmt.Errorf("evaluator: %s", v.Error)
	}
	return v, nil
}

func (e *Evaluator) stage(ctx context.Context, dir string, a Artifact) error {
	r, err := e.c.Store.OpenBlob(ctx, a.SHA256)
	if err != nil {
		return err
	}
	defer r.Close()
	dst := filepath.Join(dir, filepath.FromSlash(a.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// roundTrip sends one request line and reads one verdict line, restarting
// the interpreter once if it is dead or does not answer in time.
func (e *Evaluator) roundTrip(ctx context.Context, line []byte) (Verdict, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		if e.proc == nil {
			p, err := e.c.Interpreter.Start(context.WithoutCancel(ctx), Script, e.c.Dir)
			if err != nil {
				return Verdict{}, fmt.Errorf("start evaluator interpreter: %w", err)
			}
			e.proc, e.out = p, bufio.NewReaderSize(p.Stdout(), 64<<10)
		}
		v, err := e.exchange(ctx, line)
		if err == nil {
			return v, nil
		}
		lastErr = err
		e.proc.Close()
		e.proc, e.out = nil, nil
		if ctx.Err() != nil {
			break
		}
	}
	return Verdict{}, lastErr
}

func (e *Evaluator) exchange(ctx context.Context, line []byte) (Verdict, error) {
	type result struct {
		v   Verdict
		err error
	}
	ch := make(chan result, 1)
	proc, out := e.proc, e.out
	go func() {
		if _, err := proc.Stdin().Write(append(line, '\n')); err != nil {
			ch <- result{err: err}
			return
		}
		b, err := out.ReadBytes('\n')
		if err != nil {
			ch <- result{err: err}
			return
		}
		var v Verdict
		ch <- result{v: v, err: json.Unmarshal(b, &v)}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		// Closing the process unblocks the goroutine above.
		return Verdict{}, errors.Join(errors.New("evaluator did not answer in time"), ctx.Err())
	}
}

// Close stops the interpreter. It is safe to call twice.
func (e *Evaluator) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc != nil {
		err := e.proc.Close()
		e.proc, e.out = nil, nil
		return err
	}
	return nil
}

// InterpreterFunc adapts a function to Interpreter.
type InterpreterFunc func(ctx context.Context, script []byte, dir string) (Process, error)

// Start implements Interpreter.
func (f InterpreterFunc) Start(ctx context.Context, script []byte, dir string) (Process, error) {
	return f(ctx, script, dir)
}
