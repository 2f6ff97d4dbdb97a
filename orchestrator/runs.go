package orchestrator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

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
	if _, err := o.access(ctx, run, auth.Runs, true); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return err
	}
	defer held.Unlock()
	files, err := o.startJournal(ctx, run, time.Now().UTC())
	if err != nil {
		return storeErr(err, run, cel.Path)
	}
	more, err := o.j.cel.AddNote(ctx, run, cel.Note{When: time.Now().UTC(), Author: author, Text: text})
	if err != nil {
		return storeErr(err, run, cel.Path)
	}
	o.publishJournal(run, "note")
	o.mirrorJournal(ctx, run, append(files, more...))
	return nil
}

// Journal returns the run's CEL.md, with every call that has answered
// recorded in it.
func (o *Orchestrator) Journal(ctx context.Context, run runid.ID) ([]byte, error) {
	_, r, err := o.OpenJournal(ctx, run)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, storeErr(err, run, cel.Path)
	}
	return b, nil
}

// OpenJournal opens the run's CEL.md for streaming, verified as it
// streams, once every call that has answered is recorded in it.
func (o *Orchestrator) OpenJournal(ctx context.Context, run runid.ID) (tmpfs.File, *tmpfs.Reader, error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		return tmpfs.File{}, nil, err
	}
	if err := o.settle(ctx, run); err != nil {
		return tmpfs.File{}, nil, err
	}
	f, r, err := o.store.Open(ctx, run, cel.Path)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return f, nil, fault.Wrap(fault.NotFound, err, fmt.Sprintf("run %s has no journal yet", run),
			"the journal starts with the run's first tool call; make one, or check the run id")
	}
	if err != nil {
		return f, nil, storeErr(err, run, cel.Path)
	}
	return f, r, nil
}

// Finalize appends the summary section to the run's journal.
func (o *Orchestrator) Finalize(ctx context.Context, run runid.ID, status string) error {
	if o.j == nil {
		return nil
	}
	if _, err := o.access(ctx, run, auth.Runs, true); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return err
	}
	defer held.Unlock()
	trace, err := o.trace(ctx, run)
	if err != nil {
		return err
	}
	sum := cel.Summary{When: time.Now().UTC(), Status: status, Steps: len(trace)}
	for _, t := range trace {
		if t.Eval != nil && t.Eval.Pass {
			sum.Passed++
		} else {
			sum.Failed++
		}
	}
	arts, _ := o.store.List(ctx, run, runfiles.ArtifactsDir)
	for _, a := range arts {
		if runfiles.IsDeliverable(a.Path) {
			sum.Artifacts = append(sum.Artifacts, wire.Ref(a))
		}
	}
	files, err := o.j.cel.Finalize(ctx, run, sum)
	if err != nil {
		return storeErr(err, run, cel.Path)
	}
	o.publishJournal(run, "summary")
	o.mirrorJournal(ctx, run, files)
	return nil
}

// Trace returns the run's trace records, with every call that has
// answered recorded in it.
func (o *Orchestrator) Trace(ctx context.Context, run runid.ID) ([]TraceRecord, error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		return nil, err
	}
	if err := o.settle(ctx, run); err != nil {
		return nil, err
	}
	return o.trace(ctx, run)
}

// trace reads the run's trace records as they stand.
func (o *Orchestrator) trace(ctx context.Context, run runid.ID) ([]TraceRecord, error) {
	b, _, err := o.store.ReadAll(ctx, run, runfiles.Trace)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, storeErr(err, run, runfiles.Trace)
	}
	var out []TraceRecord
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var t TraceRecord
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("trace of run %s: %w", run, err)
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

// Status reports a run from its trace and artifact index: the journal's
// part of the run view (runner.View adds a recipe run's part), with who
// started it. A run nobody started, or one of another tenant, is not
// found.
func (o *Orchestrator) Status(ctx context.Context, run runid.ID) (wire.RunView, error) {
	st := wire.RunView{RunID: run.String(), Status: "open", Steps: []wire.StepStatus{}, Artifacts: []wire.IndexEntry{}}
	ow, err := o.access(ctx, run, auth.Read, false)
	if err != nil {
		return st, err
	}
	by := ow.caller()
	st.StartedBy, st.Created = &by, &ow.Created
	if err := o.settle(ctx, run); err != nil {
		return st, err
	}
	trace, err := o.trace(ctx, run)
	if err != nil {
		return st, err
	}
	for _, t := range trace {
		ss := wire.StepStatus{Step: t.Step, Tool: t.Tool, OK: t.OK, DurationMs: t.ElapsedMs, Label: t.Label, Evaluation: "FAIL"}
		if t.Eval != nil {
			ss.Score = t.Eval.Score
			if t.Eval.Pass {
				ss.Evaluation = "PASS"
			}
		}
		st.Steps = append(st.Steps, ss)
	}
	if s, ok, err := o.recordedSetup(ctx, run); err == nil && ok {
		st.Template, st.ImageDigest, st.Egress = s.Template, s.ImageDigest, s.Egress
	}
	if b, _, err := o.store.ReadAll(ctx, run, runfiles.Index); err == nil {
		var idx struct {
			Artifacts []IndexEntry `json:"artifacts"`
		}
		if json.Unmarshal(b, &idx) == nil && idx.Artifacts != nil {
			st.Artifacts = idx.Artifacts
		}
	}
	return st, nil
}

// PutInternal writes a file the server keeps in the run for its own
// bookkeeping (a recipe run's state and notebook): not a tool call, so no
// Step Block, but mirrored into the live kernel like every run file.
func (o *Orchestrator) PutInternal(ctx context.Context, run runid.ID, path string, data []byte) (tmpfs.File, error) {
	if _, err := o.access(ctx, run, auth.Runs, true); err != nil {
		return tmpfs.File{}, err
	}
	f, err := o.store.WriteBytes(ctx, run, path, data)
	if err != nil {
		return f, storeErr(err, run, path)
	}
	return f, o.mirrorPut(ctx, run, f)
}
