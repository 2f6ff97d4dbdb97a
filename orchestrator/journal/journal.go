// Package journal records a run's calls and recovers the ones a crash interrupted: the Step Block with the evaluator's verdict, trace.jsonl, evaluations.jsonl and the artifact index, and the call-in-progress record that stands in for a call until it is recorded.
//
// The orchestrator calls it under the run's lock, once per call: Next
// numbers the step, Begin writes the call-in-progress record, Record
// writes everything the step leaves. A process that dies between the two
// (here, or a replica sharing the store) leaves the call-in-progress
// record behind; the run's next holder finds it (Interrupted) and records
// the call as interrupted, exactly once. That is the one recovery scheme:
// there was a second, the run lock's own record of the call in progress,
// which the lock carried for a replica's successor; the record in the
// store's records serves both, since every replica shares the store. See
// docs/DECISIONS.md, "When the evaluator runs" and "One recovery".
package journal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/internal/storeerr"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Metrics receives the evaluator's verdicts; nil records none.
type Metrics interface {
	// Evaluated is one verdict ("pass", "fail" or "ungraded": the
	// evaluator could not answer) and the evaluator's latency.
	Evaluated(verdict string, d time.Duration)
}

// Config configures a Journal.
type Config struct {
	Store *tmpfs.Store
	CEL   *cel.Journal
	// Evaluator grades every step; nil writes a FAIL line that says so.
	Evaluator *evaluator.Evaluator
	Logger    *slog.Logger
	Metrics   Metrics
	// Holder names this process in the call-in-progress records it
	// writes (a replica's name), so an interrupted call says whose it was.
	Holder string
}

// Journal records steps. It keeps nothing per run: what it needs between
// a run's steps is the run's Cache, which the caller holds.
type Journal struct {
	store  *tmpfs.Store
	cel    *cel.Journal
	eval   *evaluator.Evaluator
	log    *slog.Logger
	m      Metrics
	holder string
}

// New returns a Journal.
func New(c Config) *Journal {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Journal{store: c.Store, cel: c.CEL, eval: c.Evaluator, log: c.Logger, m: c.Metrics, holder: c.Holder}
}

// CEL is the journal's CEL.md writer.
func (j *Journal) CEL() *cel.Journal { return j.cel }

// Cache is what the journal keeps of one run between its steps: loaded
// from the run's files on first use and kept up to date from each step,
// so grading a step never lists the run. It lives in the run's one
// in-memory record, and is used only by the call that holds the run.
type Cache struct {
	cites    map[string]bool // citation URLs, nil until loaded
	datasets map[string]bool // the run's datasets, nil until loaded
}

// Forget drops what the cache holds: another process may have written the
// run since.
func (c *Cache) Forget() { *c = Cache{} }

// Cached reports whether the cache holds anything.
func (c *Cache) Cached() bool { return c.cites != nil || c.datasets != nil }

// AddCitations adds URLs a search of the run found, if the citations are
// loaded (else they are read from the records on first use).
func (c *Cache) AddCitations(urls []string) {
	if c.cites == nil {
		return
	}
	for _, u := range urls {
		c.cites[u] = true
	}
}

// Next returns the number the run's next step will have and the operator
// notes added since its last.
func (j *Journal) Next(ctx context.Context, run runid.ID) (int, []cel.Note, error) {
	return j.cel.Next(ctx, run)
}

// Recording is one step to record.
type Recording struct {
	Step *Step
	// N is the step's number and Notes the notes it saw (Next).
	N     int
	Notes []cel.Note
	Info  Info
	// Who made the call, for the trace.
	Who   auth.Principal
	Cache *Cache
	// Header is the journal's header, asked for only if the run has
	// none yet: at its first step.
	Header func(ctx context.Context) (cel.Header, error)
}

// Record writes a step's records as one group commit
// (tmpfs.Store.Commit): the Step Block with the evaluator's verdict and
// its checkpoint, the evaluations.jsonl and trace.jsonl lines and the
// artifact index are all in the run's records or none is (a
// call-in-progress record without them is an interrupted step). Each
// journal file is appended, and the evaluator sees the step, not the
// run, so a step costs the same however long the run is. It returns the writes, for
// the live kernel's copies, and the call as the run's feed shows it.
func (j *Journal) Record(ctx context.Context, r Recording) ([]cel.Write, wire.CallEvent, error) {
	s, run := r.Step, r.Step.Run
	j.updateView(ctx, r.Cache, s)
	writes, err := j.start(ctx, run, r.Header)
	if err != nil {
		return nil, wire.CallEvent{}, err
	}
	req := j.request(ctx, r.Cache, s, r.Info)
	verdict := j.grade(ctx, run, req)
	staged, err := j.cel.Stage(ctx, run, stepBlock(s, r.Info, r.N, r.Notes, verdict))
	if err != nil {
		return nil, wire.CallEvent{}, err
	}

	el := EvalLine{Step: r.N, Tool: s.Outcome.Tool(), Verdict: verdict}
	if verdict.Ungraded {
		// Kept so that whichever process holds the run next can grade
		// the step again, after a restart too.
		el.Request = &req
	}
	ev, err := runfiles.Marshal(el)
	if err != nil {
		return nil, wire.CallEvent{}, err
	}
	tr := traceRecord(s, r.Info, r.N, verdict)
	tr.KeyID, tr.Tenant = r.Who.KeyID, r.Who.Tenant
	line, err := runfiles.Marshal(tr)
	if err != nil {
		return nil, wire.CallEvent{}, err
	}
	ev, line = append(ev, '\n'), append(line, '\n')
	changes := append(staged.Changes,
		tmpfs.Change{Path: runfiles.Evaluations, Data: ev},
		tmpfs.Change{Path: runfiles.Trace, Data: line})
	idx, ok, err := j.index(ctx, run, r.N, s.Artifacts)
	if err != nil {
		return nil, wire.CallEvent{}, err
	}
	if ok {
		changes = append(changes, tmpfs.Change{Path: runfiles.Index, Data: idx, Whole: true})
	}
	// The step's one group commit: the Step Block and its checkpoint,
	// the evaluation and trace lines and the artifact index are in the
	// run's records all together or not at all (see "One group commit
	// per step" in docs/DECISIONS.md). A crash before it leaves the
	// call-in-progress record, and the step is recorded as interrupted.
	res, err := j.store.Commit(ctx, run, changes)
	if err != nil {
		return nil, wire.CallEvent{}, err
	}
	n := len(staged.Changes)
	writes = append(writes, staged.Done(res[:n])...)
	writes = append(writes,
		cel.Write{File: res[n].File, Appended: ev, Prev: res[n].Prev.SHA256},
		cel.Write{File: res[n+1].File, Appended: line, Prev: res[n+1].Prev.SHA256})
	if ok {
		writes = append(writes, cel.Write{File: res[n+2].File})
	}
	if rc := r.Info.Receipt; rc != nil {
		rc.Step, rc.Verdict = r.N, verdict
	}
	s.Verdict = &verdict
	return writes, CallEvent(tr), nil
}

// start writes the journal's header if the run has none yet.
func (j *Journal) start(ctx context.Context, run runid.ID, header func(context.Context) (cel.Header, error)) ([]cel.Write, error) {
	if started, err := j.cel.Started(ctx, run); err != nil || started {
		return nil, err
	}
	h, err := header(ctx)
	if err != nil {
		return nil, err
	}
	return j.cel.Start(ctx, h)
}

// Start writes the journal's header if the run has none yet: at its first
// call or note.
func (j *Journal) Start(ctx context.Context, run runid.ID, header func(context.Context) (cel.Header, error)) ([]cel.Write, error) {
	return j.start(ctx, run, header)
}

// updateView applies a step's changes to the run's datasets, if loaded.
func (j *Journal) updateView(ctx context.Context, c *Cache, s *Step) {
	if c.datasets == nil {
		return
	}
	for _, a := range s.Artifacts {
		if runfiles.IsDataset(a.Path) {
			c.datasets[a.Path] = true
		}
	}
	for _, p := range s.Touched {
		_, err := j.store.Stat(ctx, s.Run, p)
		if err == nil && runfiles.IsDataset(p) {
			c.datasets[p] = true
		} else {
			delete(c.datasets, p)
		}
	}
}

// datasets returns the run's datasets, loading them on first use.
func (j *Journal) datasets(ctx context.Context, c *Cache, run runid.ID) ([]string, error) {
	if c.datasets == nil {
		files, err := j.store.List(ctx, run, "")
		if err != nil {
			return nil, err
		}
		c.datasets = map[string]bool{}
		for _, f := range files {
			if runfiles.IsDataset(f.Path) {
				c.datasets[f.Path] = true
			}
		}
	}
	out := make([]string, 0, len(c.datasets))
	for p := range c.datasets {
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

// request is what the evaluator needs to grade s. It holds what the
// step touched and what the rubric reads of the run (datasets for a
// report, the expected artifacts a step did not write itself), never a
// listing of the whole run.
func (j *Journal) request(ctx context.Context, c *Cache, s *Step, si Info) evaluator.Request {
	req := evalRequest(s, si)
	if citesEvidence(s.Artifacts) {
		if ds, err := j.datasets(ctx, c, s.Run); err == nil {
			req.Datasets = ds
		}
		req.FetchedURLs = j.fetchedURLs(ctx, s)
	}
	if len(si.Expected) > 0 {
		req.RunFiles = map[string]evaluator.Artifact{}
		for _, e := range si.Expected {
			if f, err := j.store.Stat(ctx, s.Run, e.Path); err == nil {
				req.RunFiles[f.Path] = wire.Ref(f)
			}
		}
	}
	req.CitationURLs = j.citationURLs(ctx, c, s.Run)
	return req
}

// grade asks the evaluator for a verdict. It never fails: an evaluator
// that cannot answer (it did not answer in time, its interpreter died)
// leaves the step ungraded, never FAIL, since that says nothing of the
// step (only the rubric's own refusal, evaluator.ErrRubric, which grading
// again would repeat, is a FAIL that says so); the step is graded again in the background (Regrade). See
// docs/DECISIONS.md, "Ungraded steps and the regrade".
func (j *Journal) grade(ctx context.Context, run runid.ID, req evaluator.Request) evaluator.Verdict {
	if j.eval == nil {
		return evaluator.Verdict{Critique: "No evaluator is configured."}
	}
	t0 := time.Now()
	v, err := j.eval.Evaluate(ctx, run, req)
	if errors.Is(err, evaluator.ErrRubric) {
		// The rubric's answer, which grading again would repeat.
		j.evaluated("fail", time.Since(t0))
		j.log.ErrorContext(ctx, "evaluator", "run", run, "err", err)
		return evaluator.Verdict{Critique: "The evaluator could not grade this step: " + err.Error()}
	}
	if err != nil {
		j.evaluated("ungraded", time.Since(t0))
		j.log.WarnContext(ctx, "evaluator could not grade a step; it will be graded again", "run", run, "err", err)
		return evaluator.Verdict{Ungraded: true, Critique: "The evaluator could not grade this step: " + err.Error()}
	}
	verdict := "fail"
	if v.Pass {
		verdict = "pass"
	}
	j.evaluated(verdict, time.Since(t0))
	return v
}

func (j *Journal) evaluated(verdict string, d time.Duration) {
	if j.m != nil {
		j.m.Evaluated(verdict, d)
	}
}

// fetchedURLs are the URLs the run's sandbox fetched through the egress
// proxy (allowed connections, as the trace and this step record them),
// which a report may cite as its sources.
func (j *Journal) fetchedURLs(ctx context.Context, s *Step) []string {
	seen := map[string]bool{}
	var out []string
	add := func(cs []wire.Connection) {
		for _, c := range cs {
			if c.Verdict == wire.VerdictAllowed && c.URL != "" && !seen[c.URL] {
				seen[c.URL] = true
				out = append(out, c.URL)
			}
		}
	}
	if tr, err := ReadTrace(ctx, j.store, s.Run); err == nil {
		for _, t := range tr {
			add(t.Egress)
		}
	}
	if nw, ok := s.Outcome.(Networker); ok {
		add(nw.Connections())
	}
	sort.Strings(out)
	return out
}

// citationURLs returns the URLs of the run's recorded searches.
func (j *Journal) citationURLs(ctx context.Context, c *Cache, run runid.ID) []string {
	if c.cites == nil {
		c.cites = map[string]bool{}
		files, _ := j.store.List(ctx, run, runfiles.CitationsDir)
		for _, f := range files {
			b, _, err := j.store.ReadAll(ctx, run, f.Path)
			if err != nil {
				continue
			}
			if rec, err := browser.ParseRecord(b); err == nil {
				for _, r := range rec.Results {
					c.cites[r.URL] = true
				}
			}
		}
	}
	out := make([]string, 0, len(c.cites))
	for u := range c.cites {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// appendLine appends one JSON line to a run file.
func (j *Journal) appendLine(ctx context.Context, run runid.ID, p string, line []byte) (cel.Write, error) {
	prev, err := j.store.Stat(ctx, run, p)
	if err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return cel.Write{}, err
	}
	text := append(line[:len(line):len(line)], '\n')
	f, err := j.store.Append(ctx, run, p, text)
	return cel.Write{File: f, Appended: text, Prev: prev.SHA256}, err
}

// index returns artifacts/index.json with the step's deliverables (files
// under artifacts/) added, or false when the step has none.
func (j *Journal) index(ctx context.Context, run runid.ID, step int, arts []tmpfs.File) ([]byte, bool, error) {
	var add []tmpfs.File
	for _, a := range arts {
		if runfiles.IsDeliverable(a.Path) {
			add = append(add, a)
		}
	}
	if len(add) == 0 {
		return nil, false, nil
	}
	var idx struct {
		Artifacts []wire.IndexEntry `json:"artifacts"`
	}
	old, _, err := j.store.ReadAll(ctx, run, runfiles.Index)
	if err == nil {
		json.Unmarshal(old, &idx)
	} else if !errors.Is(err, tmpfs.ErrNotFound) {
		return nil, false, err
	}
	byPath := map[string]wire.IndexEntry{}
	for _, e := range idx.Artifacts {
		byPath[e.Path] = e
	}
	for _, a := range add {
		byPath[a.Path] = wire.IndexEntry{FileRef: wire.Ref(a), Step: step, URL: "/blobs/" + a.SHA256.String()}
	}
	// Deliverables a later step deleted leave the index too.
	live, err := j.store.List(ctx, run, runfiles.ArtifactsDir)
	if err != nil {
		return nil, false, err
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
	sort.Slice(idx.Artifacts, func(i, k int) bool { return idx.Artifacts[i].Path < idx.Artifacts[k].Path })
	b, err := runfiles.MarshalIndent(idx)
	if err != nil {
		return nil, false, err
	}
	return append(b, '\n'), true, nil
}

// Trace reads the run's trace records as they stand.
func (j *Journal) Trace(ctx context.Context, run runid.ID) ([]TraceRecord, error) {
	return ReadTrace(ctx, j.store, run)
}

// ReadTrace reads a run's trace records from store.
func ReadTrace(ctx context.Context, store *tmpfs.Store, run runid.ID) ([]TraceRecord, error) {
	b, _, err := store.ReadAll(ctx, run, runfiles.Trace)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storeerr.Fault(err, run, runfiles.Trace)
	}
	var out []TraceRecord
	ungraded := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var t TraceRecord
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("trace of run %s: %w", run, err)
		}
		ungraded = ungraded || t.Eval != nil && t.Eval.Ungraded
		out = append(out, t)
	}
	if err := sc.Err(); err != nil || !ungraded {
		return out, err
	}
	// A step ungraded when its trace line was written may have its
	// verdict since, in evaluations.jsonl (the trace is append-only).
	latest, err := readEvaluations(ctx, store, run)
	if err != nil {
		return nil, err
	}
	for i, t := range out {
		if e, ok := latest[t.Step]; ok && t.Eval != nil && t.Eval.Ungraded {
			v := e.Verdict
			out[i].Eval = &v
		}
	}
	return out, nil
}
