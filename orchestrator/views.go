package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// IndexEntry is one deliverable in artifacts/index.json.
type IndexEntry = wire.IndexEntry

// RunsQuery selects a page of a tenant's runs.
type RunsQuery = tenancy.RunsQuery

// ManualRuns is the RunsQuery.Recipe of runs that are not recipe runs.
const ManualRuns = tenancy.ManualRuns

// Runs lists the caller's runs, newest first, a page at a time (see
// tenancy.Tenancy.Runs).
func (o *Orchestrator) Runs(ctx context.Context, q RunsQuery) (wire.RunList, error) {
	return o.t.Runs(ctx, q)
}

// Note appends an operator note to the run's journal; the next Step Block
// records that it saw it.
func (o *Orchestrator) Note(ctx context.Context, run runid.ID, text, author string) error {
	if strings.TrimSpace(text) == "" {
		return fault.New(fault.BadInput, "text is empty", "send the note in text")
	}
	if len(text) > 64<<10 {
		return fault.New(fault.TooLarge, "the note is over 64 KiB", "shorten it, or write a file with tmp.write and mention its path")
	}
	if len(author) > 200 {
		return fault.New(fault.BadInput, "author is over 200 characters", "send a short name")
	}
	if o.j == nil {
		return fault.New(fault.NotConfigured, "the journal is off", "start triad normally; the journal is always on in triad serve")
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, true); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	now := time.Now().UTC()
	return o.appendSection(ctx, r, now, "note", func(ctx context.Context) ([]cel.Write, error) {
		return o.j.CEL().AddNote(ctx, run, cel.Note{When: now, Author: author, Text: text})
	})
}

// appendSection writes a journal section that is no step (an operator
// note, a kernel reclaim) with the run's lock held: the journal's header
// first if the run has none, then the section (add), the live kernel's
// copy and the run's feed (a journal event of kind).
func (o *Orchestrator) appendSection(ctx context.Context, r *run, when time.Time, kind string, add func(context.Context) ([]cel.Write, error)) error {
	files, err := o.j.Start(ctx, r.id, func(ctx context.Context) (cel.Header, error) { return o.setups.header(ctx, r, when) })
	if err != nil {
		return storeErr(err, r.id, cel.Path)
	}
	more, err := add(ctx)
	if err != nil {
		return storeErr(err, r.id, cel.Path)
	}
	r.publishJournal(kind)
	o.files.journal(ctx, r.id, append(files, more...))
	return nil
}

// Finalize appends the summary section to the run's journal, once: a
// journal that already ends with the same summary is left as it is.
func (o *Orchestrator) Finalize(ctx context.Context, run runid.ID, status string) error {
	if o.j == nil {
		return nil
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, true); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	trace, err := o.j.Trace(ctx, run)
	if err != nil {
		return err
	}
	sum := cel.Summary{When: time.Now().UTC(), Status: status, Steps: len(trace)}
	for _, t := range trace {
		switch {
		case t.Eval != nil && t.Eval.Ungraded:
			sum.Ungraded++
		case t.Eval != nil && t.Eval.Pass:
			sum.Passed++
		default:
			sum.Failed++
		}
	}
	arts, _ := o.store.List(ctx, run, runfiles.ArtifactsDir)
	for _, a := range arts {
		if runfiles.IsDeliverable(a.Path) {
			sum.Artifacts = append(sum.Artifacts, wire.Ref(a))
		}
	}
	files, err := o.j.CEL().Finalize(ctx, run, sum)
	if err != nil {
		return storeErr(err, run, cel.Path)
	}
	if len(files) == 0 {
		return nil // summarized already (cel.Finalize)
	}
	r.publishJournal("summary")
	o.files.journal(ctx, run, files)
	return nil
}

// SetRecipeState records a recipe run's recipe and status in its index
// entry, for GET /runs, with the objective SetRunInfo gave.
func (o *Orchestrator) SetRecipeState(ctx context.Context, run runid.ID, recipe, status string) {
	r, done := o.runs.use(run)
	defer done()
	ow, ok, err := o.ownerOf(ctx, r)
	if err != nil || !ok {
		o.log.WarnContext(ctx, "record a recipe run's state in the run index: no owner", "run", run, "err", err)
		return
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		o.log.WarnContext(ctx, "record a recipe run's state in the run index", "run", run, "err", err)
		return
	}
	defer held.Unlock()
	r.mu.Lock()
	objective := ""
	if r.header != nil {
		objective = r.header.Objective
	}
	r.mu.Unlock()
	o.t.SetStatus(ctx, ow, recipe, status, objective)
}

// PutInternal writes a file the server keeps in the run for its own
// bookkeeping (a recipe run's state and notebook): not a tool call, so no
// Step Block, but mirrored into the live kernel like every run file.
func (o *Orchestrator) PutInternal(ctx context.Context, run runid.ID, path string, data []byte) (tmpfs.File, error) {
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, true); err != nil {
		return tmpfs.File{}, err
	}
	return o.files.write(ctx, run, path, data)
}

// RunReader reads one run for a caller that may read it: its journal,
// trace, status and files, none of them tool calls, so nothing is
// journaled. Access is checked once, when ReadRun makes it, and every call
// that has answered is recorded by then. It is how the console and the
// API show a run, how a share link serves what it shares, and how the
// recipe runner and a replay read what they need: the one way to read a
// run's files besides tmp.read, checked like every other.
type RunReader struct {
	o     *Orchestrator
	run   runid.ID
	owner tenancy.Owner
}

// ReadRun checks that the caller may read run (it exists, and is its
// tenant's, or the caller is an admin) and returns a reader of it, once
// every call of it that has answered is recorded: it waits for the run's
// pending recording. The first time this process touches the run, or
// when another process may have written it since (a shared RunLock), it
// takes the run's lock instead, which waits for the recording wherever it
// runs, drops what this process caches of the run, and records a crashed
// call as interrupted (lockRun). Never call it with the run locked.
func (o *Orchestrator) ReadRun(ctx context.Context, run runid.ID) (*RunReader, error) {
	r, done := o.runs.use(run)
	defer done()
	ow, err := o.access(ctx, r, auth.Read, false)
	if err != nil {
		return nil, err
	}
	rr := &RunReader{o: o, run: run, owner: ow}
	if o.j == nil {
		if o.lock.Changed(ctx, run) {
			o.forget(r, false)
		}
		return rr, nil
	}
	r.mu.Lock()
	recovered := r.recovered
	r.mu.Unlock()
	if recovered && !o.lock.Changed(ctx, run) {
		if err := r.waitRecording(ctx); err != nil {
			return nil, err
		}
		return rr, nil
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return nil, err
	}
	held.Unlock()
	return rr, nil
}

// Ping checks that the store answers, for a health check.
func (o *Orchestrator) Ping(ctx context.Context) error { return o.store.Ping(ctx) }

// Journal returns the run's CEL.md, with every call that has answered
// recorded in it.
func (o *Orchestrator) Journal(ctx context.Context, run runid.ID) ([]byte, error) {
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		return nil, err
	}
	_, rd, err := rr.OpenJournal(ctx)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, storeErr(err, run, cel.Path)
	}
	return b, nil
}

// Status reports a run from its trace and artifact index (see
// RunReader.Status). A run nobody started, or one of another tenant, is
// not found.
func (o *Orchestrator) Status(ctx context.Context, run runid.ID) (wire.RunView, error) {
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		return wire.RunView{RunID: run.String(), Status: "open", Steps: []wire.StepStatus{}, Artifacts: []wire.IndexEntry{}}, err
	}
	return rr.Status(ctx)
}

// StartedBy returns who started the run, and when.
func (rr *RunReader) StartedBy() (wire.Caller, time.Time) { return rr.owner.Caller(), rr.owner.Created }

// OpenJournal opens the run's CEL.md for streaming, verified as it
// streams.
func (rr *RunReader) OpenJournal(ctx context.Context) (tmpfs.File, *tmpfs.Reader, error) {
	f, rd, err := rr.o.store.Open(ctx, rr.run, cel.Path)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return f, nil, fault.Wrap(fault.NotFound, err, fmt.Sprintf("run %s has no journal yet", rr.run),
			"the journal starts with the run's first tool call; make one, or check the run id")
	}
	if err != nil {
		return f, nil, storeErr(err, rr.run, cel.Path)
	}
	return f, rd, nil
}

// Trace returns the run's trace records.
func (rr *RunReader) Trace(ctx context.Context) ([]TraceRecord, error) {
	return journal.ReadTrace(ctx, rr.o.store, rr.run)
}

// Status reports the run from its trace and artifact index: the
// journal's part of the run view (runner.View adds a recipe run's part),
// with who started it.
func (rr *RunReader) Status(ctx context.Context) (wire.RunView, error) {
	st := wire.RunView{RunID: rr.run.String(), Status: "open", Steps: []wire.StepStatus{}, Artifacts: []wire.IndexEntry{}}
	by := rr.owner.Caller()
	created := rr.owner.Created
	st.StartedBy, st.Created = &by, &created
	st.Name, st.Tags = rr.o.t.Labels(ctx, rr.owner)
	u := rr.Usage(ctx)
	st.Usage = &u
	trace, err := rr.Trace(ctx)
	if err != nil {
		return st, err
	}
	for _, t := range trace {
		ss := wire.StepStatus{Step: t.Step, Tool: t.Tool, OK: t.OK, DurationMs: t.ElapsedMs, Label: t.Label, Evaluation: "FAIL"}
		if t.Eval != nil {
			ss.Score, ss.Evaluation = t.Eval.Score, t.Eval.Word()
			if t.Eval.Ungraded {
				rr.o.regrade.add(rr.run)
			}
		}
		st.Steps = append(st.Steps, ss)
	}
	if s, ok, err := rr.Setup(ctx); err == nil && ok {
		st.Template, st.ImageDigest, st.Egress = s.Template, s.ImageDigest, s.Egress
		if s.Backend != "" {
			st.Sandbox = &wire.RunSandbox{Backend: s.Backend, Runtime: s.Runtime, Image: s.Image}
		}
	}
	if b, _, err := rr.o.store.ReadAll(ctx, rr.run, runfiles.Index); err == nil {
		var idx struct {
			Artifacts []IndexEntry `json:"artifacts"`
		}
		if json.Unmarshal(b, &idx) == nil && idx.Artifacts != nil {
			st.Artifacts = idx.Artifacts
		}
	}
	return st, nil
}

// Setup returns the run's setup as recorded, and false when the run has
// no record (it has made no call, or predates run.setup.json).
func (rr *RunReader) Setup(ctx context.Context) (wire.RunSetup, bool, error) {
	return recordedSetup(ctx, rr.o.store, rr.run)
}

// Calls returns the run's journaled calls so far, in order, as its feed
// shows them.
func (rr *RunReader) Calls(ctx context.Context) ([]wire.CallEvent, error) {
	trace, err := rr.Trace(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]wire.CallEvent, 0, len(trace))
	for _, tr := range trace {
		out = append(out, journal.CallEvent(tr))
	}
	return out, nil
}

// Files lists every file of the run with the call that produced each
// one's current bytes (from the trace's outputs): how a person looks at a
// run (the console).
func (rr *RunReader) Files(ctx context.Context) (wire.RunFiles, error) {
	out := wire.RunFiles{Files: []wire.RunFile{}}
	trace, err := rr.Trace(ctx)
	if err != nil {
		return out, err
	}
	type producer struct {
		step int
		tool string
	}
	by := map[wire.FileRef]producer{}
	for _, tr := range trace {
		for _, f := range tr.Outputs {
			by[wire.FileRef{Path: f.Path, Size: f.Size, SHA256: f.SHA256}] = producer{tr.Step, tr.Tool}
		}
	}
	files, err := rr.o.store.List(ctx, rr.run, "")
	if err != nil {
		return out, storeErr(err, rr.run, "")
	}
	for _, f := range files {
		rf := wire.RunFile{FileInfo: wire.Info(f)}
		if p, ok := by[rf.FileRef]; ok {
			rf.Step, rf.Tool = p.step, p.tool
		}
		out.Files = append(out.Files, rf)
	}
	sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Path < out.Files[j].Path })
	return out, nil
}

// Stat returns a file's metadata.
func (rr *RunReader) Stat(ctx context.Context, path string) (tmpfs.File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return tmpfs.File{}, err
	}
	fi, err := rr.o.store.Stat(ctx, rr.run, p)
	return fi, storeErr(err, rr.run, p)
}

// List lists the files under prefix ("" for all).
func (rr *RunReader) List(ctx context.Context, prefix string) ([]tmpfs.File, error) {
	p, err := safepath.CleanPrefix(prefix)
	if err != nil {
		return nil, err
	}
	files, err := rr.o.store.List(ctx, rr.run, p)
	return files, storeErr(err, rr.run, p)
}

// Open opens a file; the reader verifies the bytes against their sha256
// as they stream.
func (rr *RunReader) Open(ctx context.Context, path string) (tmpfs.File, *tmpfs.Reader, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return tmpfs.File{}, nil, err
	}
	fi, rd, err := rr.o.store.Open(ctx, rr.run, p)
	if err != nil {
		return fi, nil, storeErr(err, rr.run, p)
	}
	return fi, rd, nil
}

// ReadAll reads a small file whole, verified.
func (rr *RunReader) ReadAll(ctx context.Context, path string) ([]byte, tmpfs.File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return nil, tmpfs.File{}, err
	}
	b, fi, err := rr.o.store.ReadAll(ctx, rr.run, p)
	return b, fi, storeErr(err, rr.run, p)
}

// OpenBlob opens blob d, which the run must hold as one of its files:
// every other case (a blob the run does not hold, one that does not
// exist) is the same not_found, so the answer says nothing about whether
// the blob exists. Membership is checked before the blob store is
// touched.
func (rr *RunReader) OpenBlob(ctx context.Context, d tmpfs.Digest) (*tmpfs.Reader, error) {
	files, err := rr.o.store.List(ctx, rr.run, "")
	if err != nil {
		return nil, storeErr(err, rr.run, "")
	}
	held := false
	for _, fi := range files {
		held = held || fi.SHA256 == d
	}
	if !held {
		return nil, blobNotFound(d)
	}
	rd, err := rr.o.store.OpenBlob(ctx, d)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, blobNotFound(d)
	}
	if err != nil {
		return nil, storeErr(err, rr.run, "")
	}
	return rd, nil
}

// OpenTraced opens a blob the run's trace names: a cell's kept source
// (code_sha256) or the bytes a call produced (its outputs), for a replay,
// which needs them even when the run's files have changed since; any other
// hash is not found.
func (rr *RunReader) OpenTraced(ctx context.Context, d tmpfs.Digest) (*tmpfs.Reader, error) {
	if err := rr.traced(ctx, d); err != nil {
		return nil, err
	}
	rd, err := rr.o.store.OpenBlob(ctx, d)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, blobNotFound(d)
	}
	if err != nil {
		return nil, storeErr(err, rr.run, "")
	}
	return rd, nil
}

// StatTraced checks that a blob the run's trace names is in the store.
func (rr *RunReader) StatTraced(ctx context.Context, d tmpfs.Digest) error {
	if err := rr.traced(ctx, d); err != nil {
		return err
	}
	if _, err := rr.o.store.Blobs().Stat(ctx, d); errors.Is(err, tmpfs.ErrNotFound) {
		return blobNotFound(d)
	} else if err != nil {
		return storeErr(err, rr.run, "")
	}
	return nil
}

// traced is not_found unless the run's trace names d.
func (rr *RunReader) traced(ctx context.Context, d tmpfs.Digest) error {
	trace, err := rr.Trace(ctx)
	if err != nil {
		return err
	}
	for _, tr := range trace {
		if tr.CodeSHA256 == d {
			return nil
		}
		for _, f := range tr.Outputs {
			if f.SHA256 == d {
				return nil
			}
		}
	}
	return blobNotFound(d)
}
