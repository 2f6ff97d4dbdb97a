package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// IndexEntry is one deliverable in artifacts/index.json.
type IndexEntry = wire.IndexEntry

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

// objective is the run's objective as SetRunInfo gave it, if it did.
func (o *Orchestrator) objective(run runid.ID) string {
	if o.j == nil {
		return ""
	}
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	return o.j.meta[run].Objective
}

// startJournal writes the journal's header, with the run's setup, if the
// run has none yet: at its first call or note. The setup is recorded then
// too, so every journaled run has one.
func (o *Orchestrator) startJournal(ctx context.Context, run runid.ID, when time.Time) ([]tmpfs.File, error) {
	if started, err := o.j.cel.Started(ctx, run); err != nil || started {
		return nil, err
	}
	o.j.mu.Lock()
	h, ok := o.j.meta[run]
	o.j.mu.Unlock()
	if !ok {
		h = cel.Header{Run: run}
	}
	h.Started = when
	setup, err := o.ensureSetup(ctx, run)
	if err != nil {
		return nil, err
	}
	h.Setup = &setup
	return o.j.cel.Start(ctx, h)
}

// record runs after every tool call, in the run's lock: Step Block with the
// evaluator's verdict, then evaluations.jsonl, trace.jsonl and the artifact
// index. Failures here are logged, not returned: the tool's effect happened.
func (o *Orchestrator) record(ctx context.Context, s *Step) {
	if o.j == nil {
		return
	}
	if err := o.record1(ctx, s); err != nil {
		o.log.ErrorContext(ctx, "record step", "run", s.Run, "tool", s.Outcome.Tool(), "err", err)
	}
}

func (o *Orchestrator) record1(ctx context.Context, s *Step) error {
	run := s.Run
	files, err := o.startJournal(ctx, run, s.Started)
	if err != nil {
		return err
	}
	n, notes, err := o.j.cel.Next(ctx, run)
	if err != nil {
		return err
	}
	si := stepInfo(ctx)
	verdict := o.evaluate(ctx, s, si)
	block := stepBlock(s, si, n, notes, verdict)
	wrote, err := o.j.cel.Append(ctx, run, block)
	if err != nil {
		return err
	}
	files = append(files, wrote...)

	ev, _ := runfiles.Marshal(struct {
		Step int    `json:"step"`
		Tool string `json:"tool"`
		*evaluator.Verdict
	}{n, s.Outcome.Tool(), &verdict})
	f, err := o.appendLine(ctx, run, runfiles.Evaluations, ev)
	if err != nil {
		return err
	}
	files = append(files, f)

	tr := traceRecord(s, si, n, verdict)
	p := auth.From(ctx)
	tr.KeyID, tr.Tenant = p.KeyID, p.Tenant
	line, err := runfiles.Marshal(tr)
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
	if si.Receipt != nil {
		si.Receipt.Step, si.Receipt.Verdict = n, verdict
	}
	s.verdict = &verdict
	call := callEvent(tr)
	o.publish(run, Update{Call: &call})
	return nil
}

// evaluate grades s. It never fails: an evaluator that cannot answer yields
// a FAIL verdict that says so, so no Evaluation line is left pending.
func (o *Orchestrator) evaluate(ctx context.Context, s *Step, si StepInfo) evaluator.Verdict {
	req := evalRequest(s, si)
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
				req.RunFiles[f.Path] = wire.Ref(f)
			}
		}
	}
	req.CitationURLs = o.citationURLs(ctx, s.Run)
	if o.j.eval == nil {
		return evaluator.Verdict{Critique: "No evaluator is configured."}
	}
	t0 := time.Now()
	v, err := o.j.eval.Evaluate(ctx, s.Run, req)
	if err != nil {
		o.metrics.evaluated("error", time.Since(t0))
		o.log.ErrorContext(ctx, "evaluator", "run", s.Run, "err", err)
		return evaluator.Verdict{Critique: "The evaluator could not grade this step: " + err.Error()}
	}
	verdict := "fail"
	if v.Pass {
		verdict = "pass"
	}
	o.metrics.evaluated(verdict, time.Since(t0))
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
		byPath[a.Path] = IndexEntry{FileRef: wire.Ref(a), Step: step, URL: "/blobs/" + a.SHA256.String()}
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
	b, err := runfiles.MarshalIndent(idx)
	if err != nil {
		return tmpfs.File{}, false, err
	}
	f, err := o.store.WriteBytes(ctx, run, runfiles.Index, append(b, '\n'))
	return f, err == nil, err
}
