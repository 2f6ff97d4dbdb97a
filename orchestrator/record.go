package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"path"
	"sort"
	"strings"
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
	views map[runid.ID]*view           // what the evaluator sees of each run, loaded lazily
	// recovered are the runs whose crashed steps this process has looked
	// for (see recoverRun).
	recovered map[runid.ID]bool
}

// SetRunInfo records the recipe and objective for the run's journal
// header; call it before the run's first tool call.
func (o *Orchestrator) SetRunInfo(run runid.ID, recipe, objective string) {
	o.touch(run)
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
func (o *Orchestrator) startJournal(ctx context.Context, run runid.ID, when time.Time) ([]cel.Write, error) {
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

// record1 writes the step's records. Each is appended (tmpfs.Store.Append)
// and the evaluator sees the step, not the run, so a step costs the same
// however long the run is.
func (o *Orchestrator) record1(ctx context.Context, s *Step) error {
	run := s.Run
	o.updateView(ctx, s)
	writes, err := o.startJournal(ctx, run, s.Started)
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
	writes = append(writes, wrote...)

	// The Step Block is the step's commit point (a marker without one is
	// an interrupted step); the two record lines follow it, in parallel.
	ev, _ := runfiles.Marshal(struct {
		Step int    `json:"step"`
		Tool string `json:"tool"`
		*evaluator.Verdict
	}{n, s.Outcome.Tool(), &verdict})
	tr := traceRecord(s, si, n, verdict)
	p := auth.From(ctx)
	tr.KeyID, tr.Tenant = p.KeyID, p.Tenant
	line, err := runfiles.Marshal(tr)
	if err != nil {
		return err
	}
	var (
		wg         sync.WaitGroup
		wev, wtr   cel.Write
		eerr, terr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		wev, eerr = o.appendLine(ctx, run, runfiles.Evaluations, ev)
	}()
	wtr, terr = o.appendLine(ctx, run, runfiles.Trace, line)
	wg.Wait()
	if err := errors.Join(eerr, terr); err != nil {
		return err
	}
	writes = append(writes, wev, wtr)

	if f, ok, err := o.updateIndex(ctx, run, n, s.Artifacts); err != nil {
		return err
	} else if ok {
		writes = append(writes, cel.Write{File: f})
	}
	o.mirrorJournal(ctx, run, writes)
	if si.Receipt != nil {
		si.Receipt.Step, si.Receipt.Verdict = n, verdict
	}
	s.verdict = &verdict
	call := callEvent(tr)
	o.publish(run, Update{Call: &call})
	return nil
}

// mirrorJournal brings the live kernel's copies of the journal's files up
// to date: appended text is appended (when the working directory can), so
// the cost does not grow with the journal; checkpoints are not copied (see
// runfiles.IsCheckpoint).
func (o *Orchestrator) mirrorJournal(ctx context.Context, run runid.ID, writes []cel.Write) {
	if o.kernels == nil {
		return
	}
	sess := o.kernels.Peek(run)
	if sess == nil {
		return // materialised when the kernel starts
	}
	for _, w := range writes {
		var err error
		if w.Appended != nil {
			err = sess.Dir.Append(ctx, w.File, w.Prev, w.Appended)
		} else {
			err = sess.Dir.Put(ctx, w.File)
		}
		if err != nil {
			o.log.WarnContext(ctx, "mirror journal file", "run", run, "path", w.Path, "err", err)
		}
	}
}

// view is what the evaluator needs to know about a run beyond the step it
// grades: the run's datasets (which a report may cite by name). It is
// loaded with one listing the first time a step needs it, then kept up to
// date from each step's artifacts and the paths it touched, so grading a
// step never lists the run.
type view struct {
	datasets map[string]bool
}

// maxViews bounds the views kept; past it, they start over.
const maxViews = 10000

// updateView applies a step's changes to the run's view, if one is loaded.
func (o *Orchestrator) updateView(ctx context.Context, s *Step) {
	o.j.mu.Lock()
	v := o.j.views[s.Run]
	o.j.mu.Unlock()
	if v == nil {
		return
	}
	set := func(p string, present bool) {
		o.j.mu.Lock()
		defer o.j.mu.Unlock()
		if present && runfiles.IsDataset(p) {
			v.datasets[p] = true
		} else {
			delete(v.datasets, p)
		}
	}
	for _, a := range s.Artifacts {
		set(a.Path, true)
	}
	for _, p := range s.Touched {
		_, err := o.store.Stat(ctx, s.Run, p)
		set(p, err == nil)
	}
}

// datasets returns the run's datasets, loading its view on first use.
func (o *Orchestrator) datasets(ctx context.Context, run runid.ID) ([]string, error) {
	o.j.mu.Lock()
	v := o.j.views[run]
	o.j.mu.Unlock()
	if v == nil {
		files, err := o.store.List(ctx, run, "")
		if err != nil {
			return nil, err
		}
		v = &view{datasets: map[string]bool{}}
		for _, f := range files {
			if runfiles.IsDataset(f.Path) {
				v.datasets[f.Path] = true
			}
		}
		o.j.mu.Lock()
		if len(o.j.views) >= maxViews {
			clear(o.j.views)
		}
		o.j.views[run] = v
		o.j.mu.Unlock()
	}
	o.j.mu.Lock()
	defer o.j.mu.Unlock()
	out := make([]string, 0, len(v.datasets))
	for p := range v.datasets {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// citesEvidence reports whether the evaluator's evidence check reads a
// step's artifacts (reports in Markdown or HTML): only then does it need
// the run's datasets.
func citesEvidence(arts []tmpfs.File) bool {
	for _, a := range arts {
		switch strings.ToLower(path.Ext(a.Path)) {
		case ".md", ".html", ".htm":
			return true
		}
	}
	return false
}

// evaluate grades s. It never fails: an evaluator that cannot answer yields
// a FAIL verdict that says so, so no Evaluation line is left pending.
// The request holds what the step touched and what the rubric reads of
// the run (datasets for a report, the expected artifacts a step did not
// write itself), never a listing of the whole run.
func (o *Orchestrator) evaluate(ctx context.Context, s *Step, si StepInfo) evaluator.Verdict {
	req := evalRequest(s, si)
	if citesEvidence(s.Artifacts) {
		if ds, err := o.datasets(ctx, s.Run); err == nil {
			req.Datasets = ds
		}
		req.FetchedURLs = o.fetchedURLs(ctx, s)
	}
	if len(si.Expected) > 0 {
		req.RunFiles = map[string]evaluator.Artifact{}
		for _, e := range si.Expected {
			if f, err := o.store.Stat(ctx, s.Run, e.Path); err == nil {
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
func (o *Orchestrator) appendLine(ctx context.Context, run runid.ID, p string, line []byte) (cel.Write, error) {
	prev, err := o.store.Stat(ctx, run, p)
	if err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return cel.Write{}, err
	}
	text := append(line[:len(line):len(line)], '\n')
	f, err := o.store.Append(ctx, run, p, text)
	return cel.Write{File: f, Appended: text, Prev: prev.SHA256}, err
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
