package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
)

// StepInfo is what a caller (the recipe runner) knows about a call beyond
// its inputs: the artifacts it must produce and what comes next.
type StepInfo struct {
	// Label names the step ("recipe step 3: fit the model").
	Label string
	// Expected are the artifacts the evaluator's completeness check wants.
	Expected []evaluator.Expect
	// Next lists the next steps for the journal.
	Next []string
}

type stepInfoKey struct{}

// WithStepInfo attaches StepInfo to the calls made with ctx.
func WithStepInfo(ctx context.Context, si StepInfo) context.Context {
	return context.WithValue(ctx, stepInfoKey{}, si)
}

func stepInfo(ctx context.Context) StepInfo {
	si, _ := ctx.Value(stepInfoKey{}).(StepInfo)
	return si
}

// TraceRecord is one line of trace.jsonl: enough, with the recorded search
// results and the content-addressed files, to replay the call.
type TraceRecord struct {
	Step      int                `json:"step"`
	Tool      string             `json:"tool"`
	Started   time.Time          `json:"started"`
	ElapsedMs int64              `json:"elapsed_ms"`
	Inputs    map[string]any     `json:"inputs"`
	OK        bool               `json:"ok"`
	Error     *TraceError        `json:"error,omitempty"`
	Outputs   []FileRef          `json:"outputs"`
	Eval      *evaluator.Verdict `json:"evaluation"`
	Label     string             `json:"label,omitempty"`
}

// TraceError is a failed call's error in the trace.
type TraceError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// IndexEntry is one line of artifacts/index.json.
type IndexEntry struct {
	Path   string       `json:"path"`
	SHA256 tmpfs.Digest `json:"sha256"`
	Size   int64        `json:"size"`
	Step   int          `json:"step"`
	URL    string       `json:"url"`
}

// journal is the recording half of the orchestration path.
type journal struct {
	cel  *cel.Journal
	eval *evaluator.Evaluator

	mu    sync.Mutex
	cites map[runid.ID]map[string]bool // citation URLs per run, loaded lazily
	meta  map[runid.ID]cel.Header      // recipe and objective, set before a run's first call
}

// SetRunInfo records the recipe and objective for the run's journal
// header; call it before the run's first tool call.
func (o *Orchestrator) SetRunInfo(run runid.ID, recipe, objective string) {
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	o.j.meta[run] = cel.Header{Run: run, Recipe: recipe, Objective: objective}
}

// record runs after every tool call, in the run's lock: Step Block with the
// evaluator's verdict, then evaluations.jsonl, trace.jsonl and the artifact
// index. Failures here are logged, not returned: the tool's effect happened.
func (o *Orchestrator) record(ctx context.Context, s *Step) {
	if o.j == nil {
		return
	}
	if err := o.record1(ctx, s); err != nil {
		o.log.ErrorContext(ctx, "record step", "run", s.Run, "tool", s.Tool, "err", err)
	}
}

func (o *Orchestrator) record1(ctx context.Context, s *Step) error {
	run := s.Run
	o.j.mu.Lock()
	h, ok := o.j.meta[run]
	o.j.mu.Unlock()
	if !ok {
		h = cel.Header{Run: run}
	}
	h.Started = s.Started
	files, err := o.j.cel.Start(ctx, h)
	if err != nil {
		return err
	}
	n, notes, err := o.j.cel.Next(ctx, run)
	if err != nil {
		return err
	}
	si := stepInfo(ctx)
	verdict := o.evaluate(ctx, s, si)
	did, next := describe(s, si)
	for _, nt := range notes {
		did = append(did, fmt.Sprintf("Saw operator note: “%s”", strings.TrimSpace(nt.Text)))
	}
	block := cel.Block{N: n, Tool: s.Tool, When: s.Started, Input: salient(s.Inputs), Did: did, Next: next,
		Eval: cel.Evaluation{Pass: verdict.Pass, Score: verdict.Score, Completeness: verdict.Completeness,
			Correctness: verdict.Correctness, Evidence: verdict.Evidence, Hygiene: verdict.Hygiene, Critique: verdict.Critique}}
	for _, a := range s.Artifacts {
		block.Artifacts = append(block.Artifacts, cel.Artifact{Path: a.Path, Size: a.Size, SHA256: a.SHA256})
	}
	wrote, err := o.j.cel.Append(ctx, run, block)
	if err != nil {
		return err
	}
	files = append(files, wrote...)

	ev, _ := json.Marshal(struct {
		Step int    `json:"step"`
		Tool string `json:"tool"`
		*evaluator.Verdict
	}{n, s.Tool, &verdict})
	f, err := o.appendLine(ctx, run, runfiles.Evaluations, ev)
	if err != nil {
		return err
	}
	files = append(files, f)

	tr := TraceRecord{Step: n, Tool: s.Tool, Started: s.Started, ElapsedMs: s.Elapsed.Milliseconds(), Inputs: s.Inputs,
		OK: s.Err == nil, Outputs: []FileRef{}, Eval: &verdict, Label: si.Label}
	if s.Err != nil {
		fe := fault.As(s.Err)
		if fe == nil {
			fe = &fault.Error{Kind: fault.Internal, Message: s.Err.Error()}
		}
		tr.Error = &TraceError{Kind: string(fe.Kind), Message: fe.Message}
	}
	for _, a := range s.Artifacts {
		tr.Outputs = append(tr.Outputs, ref(a))
	}
	line, err := json.Marshal(tr)
	if err != nil {
		return err
	}
	if f, err = o.appendLine(ctx, run, runfiles.Trace, line); err != nil {
		return err
	}
	files = append(files, f)

	if f, ok, err := o.updateIndex(ctx, run, n, s.Artifacts); err != nil {
		return err
	} else if ok {
		files = append(files, f)
	}
	for _, f := range files {
		if err := o.mirrorPut(ctx, run, f); err != nil {
			o.log.WarnContext(ctx, "mirror journal file", "run", run, "path", f.Path, "err", err)
		}
	}
	return nil
}

// evaluate grades s. It never fails: an evaluator that cannot answer yields
// a FAIL verdict that says so, so no Evaluation line is left pending.
func (o *Orchestrator) evaluate(ctx context.Context, s *Step, si StepInfo) evaluator.Verdict {
	req := evaluator.Request{Tool: s.Tool, OK: s.Err == nil, ElapsedMs: s.Elapsed.Milliseconds(), Expected: si.Expected}
	if s.Err != nil {
		req.Error = s.Err.Error()
		if fe := fault.As(s.Err); fe != nil {
			req.Error = string(fe.Kind) + ": " + fe.Message
		}
	}
	for _, a := range s.Artifacts {
		req.Artifacts = append(req.Artifacts, evaluator.Artifact{Path: a.Path, Size: a.Size, SHA256: a.SHA256})
	}
	if s.Tool == ToolExec {
		if ok, _ := s.Detail["ok"].(bool); !ok && s.Err == nil {
			req.OK = false
			if e, _ := s.Detail["error"].(*ExecError); e != nil {
				req.Error = e.Message
			}
		}
		req.Stderr, _ = s.Detail["stderr"].(string)
		req.Restarted, _ = s.Detail["restarted"].(bool)
		req.Tampered, _ = s.Detail["tampered"].([]string)
		if d, ok := s.Detail["timeout"].(time.Duration); ok {
			req.BudgetMs = d.Milliseconds()
		}
	}
	if n, ok := s.Detail["results"].(int); ok {
		req.Results = n
	}
	files, err := o.store.List(ctx, s.Run, "")
	if err == nil {
		if len(si.Expected) > 0 {
			req.RunFiles = map[string]evaluator.Artifact{}
		}
		for _, f := range files {
			if runfiles.IsDataset(f.Path) {
				req.Datasets = append(req.Datasets, f.Path)
			}
			if req.RunFiles != nil {
				req.RunFiles[f.Path] = evaluator.Artifact{Path: f.Path, Size: f.Size, SHA256: f.SHA256}
			}
		}
	}
	req.CitationURLs = o.citationURLs(ctx, s.Run)
	if o.j.eval == nil {
		return evaluator.Verdict{Critique: "No evaluator is configured."}
	}
	v, err := o.j.eval.Evaluate(ctx, s.Run, req)
	if err != nil {
		o.log.ErrorContext(ctx, "evaluator", "run", s.Run, "err", err)
		return evaluator.Verdict{Critique: "The evaluator could not grade this step: " + err.Error()}
	}
	return v
}

// citationURLs returns the URLs of the run's recorded searches.
func (o *Orchestrator) citationURLs(ctx context.Context, run runid.ID) []string {
	o.j.mu.Lock()
	set, ok := o.j.cites[run]
	o.j.mu.Unlock()
	if !ok {
		set = map[string]bool{}
		files, _ := o.store.List(ctx, run, runfiles.CitationsDir)
		for _, f := range files {
			b, _, err := o.store.ReadAll(ctx, run, f.Path)
			if err != nil {
				continue
			}
			if rec, err := browser.ParseRecord(b); err == nil {
				for _, r := range rec.Results {
					set[r.URL] = true
				}
			}
		}
		o.j.mu.Lock()
		o.j.cites[run] = set
		o.j.mu.Unlock()
	}
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	out := make([]string, 0, len(set))
	for u := range set {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

func (o *Orchestrator) addCitations(run runid.ID, urls []string) {
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	set, ok := o.j.cites[run]
	if !ok {
		return // loaded from the records on first use
	}
	for _, u := range urls {
		set[u] = true
	}
}

// appendLine appends one JSON line to a run file.
func (o *Orchestrator) appendLine(ctx context.Context, run runid.ID, path string, line []byte) (tmpfs.File, error) {
	old, _, err := o.store.ReadAll(ctx, run, path)
	if err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return tmpfs.File{}, err
	}
	var b bytes.Buffer
	b.Write(old)
	b.Write(line)
	b.WriteByte('\n')
	return o.store.WriteBytes(ctx, run, path, b.Bytes())
}

// updateIndex adds the step's deliverables (files under artifacts/) to
// artifacts/index.json.
func (o *Orchestrator) updateIndex(ctx context.Context, run runid.ID, step int, arts []tmpfs.File) (tmpfs.File, bool, error) {
	var add []tmpfs.File
	for _, a := range arts {
		if runfiles.IsDeliverable(a.Path) {
			add = append(add, a)
		}
	}
	if len(add) == 0 {
		return tmpfs.File{}, false, nil
	}
	var idx struct {
		Artifacts []IndexEntry `json:"artifacts"`
	}
	old, _, err := o.store.ReadAll(ctx, run, runfiles.Index)
	if err == nil {
		json.Unmarshal(old, &idx)
	} else if !errors.Is(err, tmpfs.ErrNotFound) {
		return tmpfs.File{}, false, err
	}
	byPath := map[string]IndexEntry{}
	for _, e := range idx.Artifacts {
		byPath[e.Path] = e
	}
	for _, a := range add {
		byPath[a.Path] = IndexEntry{Path: a.Path, SHA256: a.SHA256, Size: a.Size, Step: step, URL: "/blobs/" + a.SHA256.String()}
	}
	// Deliverables a later step deleted leave the index too.
	live, err := o.store.List(ctx, run, runfiles.ArtifactsDir)
	if err != nil {
		return tmpfs.File{}, false, err
	}
	exists := map[string]bool{}
	for _, f := range live {
		exists[f.Path] = true
	}
	idx.Artifacts = idx.Artifacts[:0]
	for p, e := range byPath {
		if exists[p] {
			idx.Artifacts = append(idx.Artifacts, e)
		}
	}
	sort.Slice(idx.Artifacts, func(i, j int) bool { return idx.Artifacts[i].Path < idx.Artifacts[j].Path })
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return tmpfs.File{}, false, err
	}
	f, err := o.store.WriteBytes(ctx, run, runfiles.Index, append(b, '\n'))
	return f, err == nil, err
}

// salient orders a step's inputs for the Step Block.
func salient(in map[string]any) []cel.KV {
	keys := make([]string, 0, len(in))
	for k := range in {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]cel.KV, 0, len(keys))
	for _, k := range keys {
		var v string
		switch x := in[k].(type) {
		case string:
			v = x
		default:
			b, _ := json.Marshal(x)
			v = string(b)
		}
		out = append(out, cel.KV{Key: k, Value: v})
	}
	return out
}

// describe writes the "What I did" and "Next steps" bullets.
func describe(s *Step, si StepInfo) (did, next []string) {
	if si.Label != "" {
		did = append(did, si.Label)
	}
	failed := s.Err != nil
	switch s.Tool {
	case ToolExec:
		backend, _ := s.Detail["backend"].(string)
		if e, _ := s.Detail["error"].(*ExecError); e != nil {
			failed = true
			did = append(did, fmt.Sprintf("Ran a Python cell in the %s kernel: failed (%s)", backend, e.Message))
			next = append(next, e.Suggestion)
		} else if s.Err == nil {
			did = append(did, fmt.Sprintf("Ran a Python cell in the %s kernel: ok", backend))
		}
		if n := len(s.Artifacts); n > 0 {
			did = append(did, fmt.Sprintf("Stored %d file(s) the cell wrote or its outputs, content-addressed", n))
		}
	case ToolSearch:
		if n, ok := s.Detail["results"].(int); ok {
			did = append(did, fmt.Sprintf("Searched the web: %d result(s); top domains %s", n, s.Detail["domains"]))
			did = append(did, "Kept the raw results as a citations record")
		}
	case ToolWrite:
		if len(s.Artifacts) > 0 {
			did = append(did, fmt.Sprintf("Stored %s (%d bytes)", s.Artifacts[0].Path, s.Artifacts[0].Size))
		}
	case ToolRead:
		did = append(did, fmt.Sprintf("Read %v", s.Inputs["path"]))
	case ToolList:
		did = append(did, fmt.Sprintf("Listed files under %q", s.Inputs["prefix"]))
	case ToolDelete:
		did = append(did, fmt.Sprintf("Deleted %v", s.Inputs["path"]))
	}
	if s.Err != nil {
		fe := fault.As(s.Err)
		msg, sugg := s.Err.Error(), ""
		if fe != nil {
			msg, sugg = string(fe.Kind)+": "+fe.Message, fe.Suggestion
		}
		did = append(did, "Failed: "+msg)
		if sugg != "" {
			next = append(next, sugg)
		}
	}
	if !failed {
		next = append(next, si.Next...)
		if len(next) == 0 {
			next = append(next, "Review the artifacts above, or continue with the next tool call")
		}
	}
	if len(did) > 3 {
		did = did[:3]
	}
	return did, next
}
