package journal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/internal/storeerr"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
)

// EvalLine is one line of evaluations.jsonl: a step's verdict. A step has
// one line, or, when it was ungraded, its ungraded line and later the
// line with its verdict (Late), which supersedes it: readers take the
// last line of each step.
type EvalLine struct {
	Step int    `json:"step"`
	Tool string `json:"tool"`
	evaluator.Verdict
	// Late marks the verdict of a step that was ungraded when it was
	// recorded.
	Late bool `json:"late,omitempty"`
	// Request is kept on an ungraded line only: what the evaluator needs
	// to grade the step again, in this process or, after a restart, the
	// run's next holder.
	Request *evaluator.Request `json:"request,omitempty"`
}

// Pending is a step still ungraded, with what grading it again takes.
type Pending struct {
	Step    int
	Tool    string
	Request evaluator.Request
}

// ungradedMark is how an ungraded line reads, for a cheap look before
// parsing.
var ungradedMark = []byte(`"ungraded":true`)

// readEvaluations returns the last evaluations.jsonl line of each step.
func readEvaluations(ctx context.Context, store *tmpfs.Store, run runid.ID) (map[int]EvalLine, error) {
	b, _, err := store.ReadAll(ctx, run, runfiles.Evaluations)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storeerr.Fault(err, run, runfiles.Evaluations)
	}
	return parseEvaluations(run, b)
}

func parseEvaluations(run runid.ID, b []byte) (map[int]EvalLine, error) {
	out := map[int]EvalLine{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e EvalLine
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("evaluations of run %s: %w", run, err)
		}
		out[e.Step] = e
	}
	return out, sc.Err()
}

// Ungraded returns the run's steps that are still ungraded, in order. A
// run with none costs one read of evaluations.jsonl and no parse.
func (j *Journal) Ungraded(ctx context.Context, run runid.ID) ([]Pending, error) {
	b, _, err := j.store.ReadAll(ctx, run, runfiles.Evaluations)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storeerr.Fault(err, run, runfiles.Evaluations)
	}
	if !bytes.Contains(b, ungradedMark) {
		return nil, nil
	}
	latest, err := parseEvaluations(run, b)
	if err != nil {
		return nil, err
	}
	var out []Pending
	for _, e := range latest {
		if e.Ungraded && e.Request != nil {
			out = append(out, Pending{Step: e.Step, Tool: e.Tool, Request: *e.Request})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Step < out[b].Step })
	return out, nil
}

// Verdict returns step's verdict as it stands (the last evaluations.jsonl
// line of the step), and false when the step has none recorded.
func (j *Journal) Verdict(ctx context.Context, run runid.ID, step int) (evaluator.Verdict, bool, error) {
	latest, err := readEvaluations(ctx, j.store, run)
	if err != nil {
		return evaluator.Verdict{}, false, err
	}
	e, ok := latest[step]
	return e.Verdict, ok, nil
}

// Regrade grades an ungraded step again. When the evaluator answers, it
// appends the step's late verdict to CEL.md (cel.FormatLate) and its line
// to evaluations.jsonl, which supersedes the ungraded one, and returns
// the writes; when it still cannot, the step stays ungraded and nothing
// is written. The caller holds the run's lock, as for Record.
func (j *Journal) Regrade(ctx context.Context, run runid.ID, p Pending) (evaluator.Verdict, []cel.Write, error) {
	v := j.grade(ctx, run, p.Request)
	if v.Ungraded {
		return v, nil, nil
	}
	writes, err := j.cel.AppendLate(ctx, run, cel.Late{N: p.Step, Tool: p.Tool, When: time.Now().UTC(), Eval: celEval(v)})
	if err != nil {
		return v, nil, err
	}
	line, err := runfiles.Marshal(EvalLine{Step: p.Step, Tool: p.Tool, Verdict: v, Late: true})
	if err != nil {
		return v, nil, err
	}
	w, err := j.appendLine(ctx, run, runfiles.Evaluations, line)
	if err != nil {
		return v, nil, err
	}
	return v, append(writes, w), nil
}

// celEval is a verdict as a Step Block's Evaluation line shows it.
func celEval(v evaluator.Verdict) cel.Evaluation {
	return cel.Evaluation{Pass: v.Pass, Score: v.Score, Completeness: v.Completeness,
		Correctness: v.Correctness, Evidence: v.Evidence, Hygiene: v.Hygiene, Critique: v.Critique, Ungraded: v.Ungraded}
}
