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
	// FetchedURLs are the URLs the run's sandbox fetched through the
	// egress proxy: whole for plain HTTP and intercepted HTTPS, the origin
	// ("https://host/") for HTTPS passed through, whose paths the proxy
	// cannot see. A report may cite them, or any URL of such an origin.
	FetchedURLs []string `json:"fetched_urls,omitempty"`
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
	// MaxStepInspect bounds what one step may make the evaluator parse:
	// artifacts are copied in, in order, while their sizes add up to at
	// most this (8 MiB); the rest are graded on their metadata.
	MaxStepInspect int64
	// LightBytes is the most a light step may make the evaluator read (64
	// KiB): the artifacts copied in plus the request itself. Light steps
	// (a cell with no files, a small CSV) are graded by an interpreter of
	// their own, so a run whose steps make the evaluator parse megabytes
	// never delays another run's light steps; see docs/DECISIONS.md,
	// "Evaluator lanes".
	LightBytes int64
	// HeavyInterpreters is how many interpreters grade the other steps,
	// at once (1). Each rests after a step as long as the step took.
	HeavyInterpreters int
	// Timeout bounds one evaluation once an interpreter has taken it (10
	// s); the wait for a free interpreter is bounded by the caller's ctx.
	Timeout time.Duration
	Logger  *slog.Logger
}

// Evaluator grades steps on interpreters of its own, in two lanes: one
// interpreter for light steps and Config.HeavyInterpreters for the rest.
// Each interpreter grades one step at a time and is restarted if it dies
// or hangs.
type Evaluator struct {
	c   Config
	log *slog.Logger
	seq atomic.Int64

	light, heavy *lane
}

// lane is a pool of interpreters: each idle one waits in slots, started
// or not yet (proc nil until first use). A paced lane's interpreter rests
// after each step as long as the step took, so back-to-back heavy steps
// take at most half a CPU each and the rest of the server keeps the other
// half.
type lane struct {
	slots chan *interp
	paced bool
}

// interp is one interpreter of a lane.
type interp struct {
	proc Process
	out  *bufio.Reader
	rest time.Time // takes no step before this
}

func newLane(n int) *lane {
	l := &lane{slots: make(chan *interp, n)}
	for range n {
		l.slots <- &interp{}
	}
	return l
}

// New returns an Evaluator; the interpreter starts on first use.
func New(c Config) (*Evaluator, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxInspect == 0 {
		c.MaxInspect = 8 << 20
	}
	if c.MaxStepInspect == 0 {
		c.MaxStepInspect = 8 << 20
	}
	if c.LightBytes == 0 {
		c.LightBytes = 64 << 10
	}
	if c.HeavyInterpreters <= 0 {
		c.HeavyInterpreters = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	heavy := newLane(c.HeavyInterpreters)
	heavy.paced = true
	return &Evaluator{c: c, log: c.Logger, light: newLane(1), heavy: heavy}, nil
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
	var staged int64
	for _, a := range req.Artifacts {
		if a.Size > e.c.MaxInspect || staged+a.Size > e.c.MaxStepInspect {
			continue
		}
		if err := e.stage(ctx, host, a); err != nil {
			e.log.WarnContext(ctx, "stage artifact for the evaluator", "run", run, "path", a.Path, "err", err)
			continue
		}
		staged += a.Size
	}
	req.Dir = dir
	line, err := json.Marshal(req)
	if err != nil {
		return Verdict{}, err
	}
	l := e.heavy
	if staged+int64(len(line)) <= e.c.LightBytes {
		l = e.light
	}
	v, err := e.roundTrip(ctx, l, line)
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

// roundTrip waits for an interpreter of lane l, sends it one request line
// and reads one verdict line, restarting the interpreter once if it is dead
// or does not answer within Config.Timeout.
func (e *Evaluator) roundTrip(ctx context.Context, l *lane, line []byte) (Verdict, error) {
	var it *interp
	select {
	case it = <-l.slots:
	case <-ctx.Done():
		return Verdict{}, fmt.Errorf("evaluator busy: %w", ctx.Err())
	}
	defer func() { l.slots <- it }()
	if wait := time.Until(it.rest); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return Verdict{}, fmt.Errorf("evaluator busy: %w", ctx.Err())
		}
	}
	if l.paced {
		start := time.Now()
		defer func() { it.rest = time.Now().Add(time.Since(start)) }()
	}
	// The timeout starts now: a wait for the interpreter is no part of
	// this step's evaluation, and must not leave it too little time.
	ctx, cancel := context.WithTimeout(ctx, e.c.Timeout)
	defer cancel()
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		if it.proc == nil {
			p, err := e.c.Interpreter.Start(context.WithoutCancel(ctx), Script, e.c.Dir)
			if err != nil {
				return Verdict{}, fmt.Errorf("start evaluator interpreter: %w", err)
			}
			it.proc, it.out = p, bufio.NewReaderSize(p.Stdout(), 64<<10)
		}
		v, err := it.exchange(ctx, line)
		if err == nil {
			return v, nil
		}
		lastErr = err
		it.proc.Close()
		it.proc, it.out = nil, nil
		if ctx.Err() != nil {
			break
		}
	}
	return Verdict{}, lastErr
}

func (it *interp) exchange(ctx context.Context, line []byte) (Verdict, error) {
	type result struct {
		v   Verdict
		err error
	}
	ch := make(chan result, 1)
	proc, out := it.proc, it.out
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

// Close stops the interpreters, after the evaluations in progress. It is
// safe to call twice; an Evaluate after it starts an interpreter again.
func (e *Evaluator) Close() error {
	var errs []error
	for _, l := range []*lane{e.light, e.heavy} {
		its := make([]*interp, 0, cap(l.slots))
		for range cap(l.slots) {
			its = append(its, <-l.slots)
		}
		for _, it := range its {
			if it.proc != nil {
				errs = append(errs, it.proc.Close())
				it.proc, it.out = nil, nil
			}
			l.slots <- it
		}
	}
	return errors.Join(errs...)
}

// InterpreterFunc adapts a function to Interpreter.
type InterpreterFunc func(ctx context.Context, script []byte, dir string) (Process, error)

// Start implements Interpreter.
func (f InterpreterFunc) Start(ctx context.Context, script []byte, dir string) (Process, error) {
	return f(ctx, script, dir)
}
