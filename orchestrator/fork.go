package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Snapshots and forks. A snapshot is a run of the caller's tenant, taken
// from another run, whose index holds the source's files as links to the
// same blobs (content addressing makes it cheap: no bytes are copied) and
// which no tool call may change; a fork is a new run whose index is made
// the same way from a run or a snapshot. Kernel memory is kept by neither:
// a kernel started over the files is fresh. See docs/DECISIONS.md,
// "Snapshots and forks".

// Tool names of the two steps.
const (
	// ToolSnapshot is the source run's step that took a snapshot.
	ToolSnapshot = "run.snapshot"
	// ToolFork is a forked run's first step.
	ToolFork = "run.fork"
)

// snapshotKey is where a snapshot's description is kept (tmpfs.Meta),
// which lists and names it; the snapshot's owner is its run's owner.
func snapshotKey(id runid.ID) string { return "snapshots/" + id.String() }

// ForkOutcome is the part of a run.snapshot or run.fork step.
type ForkOutcome struct {
	Op string // ToolSnapshot or ToolFork
	// Other is the snapshot taken (run.snapshot) or the run or snapshot
	// forked from (run.fork).
	Other runid.ID
	// Step is the step of the source's journal whose files were taken.
	Step  int
	Name  string
	Files int
	Bytes int64
	Done  bool
}

// Tool implements Outcome.
func (f *ForkOutcome) Tool() string { return f.Op }

// Inputs implements Outcome.
func (f *ForkOutcome) Inputs() []Input {
	if f.Op == ToolFork {
		return []Input{{Key: "from", Value: f.Other.String()}}
	}
	return journal.Inputs(Input{Key: "name", Value: f.Name})
}

// Grade implements Outcome.
func (f *ForkOutcome) Grade(req *evaluator.Request) {}

// Describe implements Outcome.
func (f *ForkOutcome) Describe(s *Step) (did, next []string, failed bool) {
	if !f.Done {
		return nil, nil, false
	}
	switch f.Op {
	case ToolSnapshot:
		did = append(did, fmt.Sprintf("Took snapshot %s of the run's %d file(s) (%d bytes), by reference: no bytes copied", f.Other, f.Files, f.Bytes))
		next = append(next, fmt.Sprintf("POST /runs/%s/fork makes a run from it", f.Other))
	case ToolFork:
		from := fmt.Sprintf("run %s as of its step %d", f.Other, f.Step)
		if f.Step == 0 {
			from = "snapshot " + f.Other.String()
		}
		did = append(did, fmt.Sprintf("Forked from %s: %d file(s) (%d bytes), by reference: no bytes copied", from, f.Files, f.Bytes))
	}
	did = append(did, wire.MemoryNote)
	return did, next, false
}

// snapshotName is what a snapshot may be named: E2B's names
// (team/name:tag) fit.
var snapshotName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$`)

// frozen is the one answer for a tool call on a snapshot.
func frozen(ow tenancy.Owner) error {
	return fault.New(fault.Conflict, fmt.Sprintf("run %s is a snapshot of run %s: its files never change", ow.Run, ow.SnapshotOf),
		fmt.Sprintf("read its files with GET /runs/%s/files; POST /runs/%s/fork makes a run to work on them", ow.Run, ow.Run))
}

// Snapshot takes a snapshot of run: a step of run's that records the run's
// files (Triad's records aside, but for its setup) as a new read-only run
// of the caller's tenant, by reference.
func (o *Orchestrator) Snapshot(ctx context.Context, run runid.ID, in wire.SnapshotRequest) (wire.Snapshot, error) {
	var out wire.Snapshot
	if in.Name != "" && !snapshotName.MatchString(in.Name) {
		return out, fault.Badf("use up to 200 letters, digits and . _ : / -, starting with a letter or digit", "snapshot name %q is not valid", in.Name)
	}
	id := runid.New()
	oc := &ForkOutcome{Op: ToolSnapshot, Other: id, Name: in.Name}
	err := o.call(ctx, run, oc, nil, func(ctx context.Context, c *call) error {
		files, count, bytes, err := o.runFiles(ctx, run, true)
		if err != nil {
			return err
		}
		// The snapshot's owner is decided here, once, before its id is
		// handed out: the caller's tenant.
		rs, done := o.runs.use(id)
		defer done()
		ow, won, err := o.t.CreateSnapshot(ctx, id, c.who, run)
		if err != nil {
			return storeErr(err, id, "")
		}
		rs.setOwner(ow)
		if !won {
			return fault.New(fault.Conflict, fmt.Sprintf("run id %s is already in use", id), "take the snapshot again")
		}
		if err := o.linkAll(ctx, id, files); err != nil {
			return err
		}
		out = wire.Snapshot{ID: id.String(), Of: run.String(), Step: c.n, Name: in.Name, Files: count, Bytes: bytes,
			Created: ow.Created, Note: wire.MemoryNote}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		if _, err := o.store.Meta().PutMeta(ctx, snapshotKey(id), b, tmpfs.Cond{IfAbsent: true}); err != nil {
			return storeErr(err, id, "")
		}
		oc.Files, oc.Bytes, oc.Step, oc.Done = count, bytes, c.n, true
		return nil
	})
	return out, err
}

// Fork makes run into (a fresh id; zero mints one), a run of the caller's
// tenant, from run or snapshot from: its files are from's (Triad's records
// aside), linked to the same blobs, and its setup (template, egress, seed)
// is from's. from is read between its calls, under its lock. The fork's
// first step records where it came from. Kernel memory is not kept.
func (o *Orchestrator) Fork(ctx context.Context, from, into runid.ID) (wire.Fork, error) {
	var out wire.Fork
	if into.IsZero() {
		into = runid.New()
	}
	// from must be the caller's to read, and a snapshot must not be
	// deleted: checked before the new run exists, so a refused fork
	// leaves nothing behind.
	rs, done := o.runs.use(from)
	defer done()
	src, err := o.access(ctx, rs, auth.Read, false)
	if err != nil {
		return out, err
	}
	if src.SnapshotOf != "" {
		if _, err := o.SnapshotInfo(ctx, from); err != nil {
			return out, err
		}
	}
	if err := o.Create(ctx, into); err != nil {
		return out, err
	}
	oc := &ForkOutcome{Op: ToolFork, Other: from}
	err = o.call(ctx, into, oc, nil, func(ctx context.Context, c *call) error {
		held, err := o.lockRun(ctx, rs)
		if err != nil {
			return err
		}
		defer held.Unlock()
		step := 0
		if o.j != nil && src.SnapshotOf == "" {
			n, _, err := o.j.Next(ctx, from)
			if err != nil {
				return storeErr(err, from, runfiles.Journal)
			}
			step = n - 1
		}
		files, count, bytes, err := o.runFiles(ctx, from, false)
		if err != nil {
			return err
		}
		setup, recorded, err := recordedSetup(ctx, o.store, from)
		if err != nil {
			return err
		}
		if recorded {
			setup.RunID = into.String()
			if err := o.setups.write(ctx, into, setup); err != nil {
				return storeErr(err, into, runfiles.Setup)
			}
			c.r.cacheSetup(setup)
		}
		if err := o.linkAll(ctx, into, files); err != nil {
			return err
		}
		out = wire.Fork{RunID: into.String(), From: from.String(), Step: step, Files: count, Bytes: bytes, Note: wire.MemoryNote}
		oc.Step, oc.Files, oc.Bytes, oc.Done = step, count, bytes, true
		return nil
	})
	if err != nil {
		return wire.Fork{}, err
	}
	return out, nil
}

// runFiles lists a run's own files: everything but Triad's records, and
// (withSetup) its run.setup.json, which a snapshot keeps for its forks.
func (o *Orchestrator) runFiles(ctx context.Context, run runid.ID, withSetup bool) ([]tmpfs.File, int, int64, error) {
	all, err := o.store.List(ctx, run, "")
	if err != nil {
		return nil, 0, 0, storeErr(err, run, "")
	}
	var files []tmpfs.File
	var n int64
	count := 0
	for _, f := range all {
		if runfiles.IsKept(f.Path) && !(withSetup && f.Path == runfiles.Setup) {
			continue
		}
		files = append(files, f)
		if f.Path != runfiles.Setup {
			n += f.Size
			count++
		}
	}
	return files, count, n, nil
}

// linkAll points run's paths at files' blobs, as one group commit: a
// crash leaves all of them or none.
func (o *Orchestrator) linkAll(ctx context.Context, run runid.ID, files []tmpfs.File) error {
	if len(files) == 0 {
		return nil
	}
	changes := make([]tmpfs.Change, len(files))
	for i := range files {
		changes[i] = tmpfs.Change{Path: files[i].Path, Link: &files[i]}
	}
	if _, err := o.store.Commit(ctx, run, changes); err != nil {
		return storeErr(err, run, "")
	}
	return nil
}

// SnapshotInfo describes snapshot id, which the caller must be able to
// see; anything else (a run that is no snapshot, a deleted one, another
// tenant's) is not found.
func (o *Orchestrator) SnapshotInfo(ctx context.Context, id runid.ID) (wire.Snapshot, error) {
	var out wire.Snapshot
	r, done := o.runs.use(id)
	defer done()
	ow, err := o.access(ctx, r, auth.Read, false)
	if err != nil {
		return out, snapshotNotFound(id)
	}
	if ow.SnapshotOf == "" {
		return out, snapshotNotFound(id)
	}
	b, _, err := o.store.Meta().GetMeta(ctx, snapshotKey(id))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return out, snapshotNotFound(id)
	}
	if err != nil {
		return out, storeErr(err, id, "")
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fault.Wrap(fault.Internal, err, fmt.Sprintf("snapshot %s: its record does not parse", id), "report this with the snapshot id")
	}
	return out, nil
}

func snapshotNotFound(id runid.ID) error {
	return fault.New(fault.NotFound, fmt.Sprintf("no snapshot %s", id), "check the id; GET /snapshots (E2B) lists your snapshots")
}

// SnapshotQuery narrows Snapshots.
type SnapshotQuery struct {
	// Of keeps the snapshots of one run; zero keeps all.
	Of runid.ID
	// Name keeps the snapshots with this name (or this id); "" keeps all.
	Name string
}

// Snapshots lists the snapshots the caller may see, newest first.
func (o *Orchestrator) Snapshots(ctx context.Context, q SnapshotQuery) ([]wire.Snapshot, error) {
	keys, err := o.store.Meta().ListMeta(ctx, "snapshots/", "", 0)
	if err != nil {
		return nil, storeErr(err, runid.ID{}, "")
	}
	out := []wire.Snapshot{}
	for _, k := range keys {
		id, err := runid.Parse(strings.TrimPrefix(k, "snapshots/"))
		if err != nil {
			continue
		}
		sn, err := o.SnapshotInfo(ctx, id)
		if fault.As(err) != nil && fault.As(err).Kind == fault.NotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !q.Of.IsZero() && sn.Of != q.Of.String() {
			continue
		}
		if q.Name != "" && sn.Name != q.Name && sn.ID != q.Name {
			continue
		}
		out = append(out, sn)
	}
	slices.SortStableFunc(out, func(a, b wire.Snapshot) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// DeleteSnapshot deletes snapshot id: it is no longer listed or forked,
// and its files leave its index (their blobs stay while any run links
// them). The runs forked from it keep their files.
func (o *Orchestrator) DeleteSnapshot(ctx context.Context, id runid.ID) error {
	if _, err := o.SnapshotInfo(ctx, id); err != nil {
		return err
	}
	r, done := o.runs.use(id)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, false); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	if err := o.store.Meta().DeleteMeta(ctx, snapshotKey(id)); errors.Is(err, tmpfs.ErrNotFound) {
		return snapshotNotFound(id)
	} else if err != nil {
		return storeErr(err, id, "")
	}
	files, err := o.store.List(ctx, id, "")
	if err != nil {
		return storeErr(err, id, "")
	}
	for _, f := range files {
		if err := o.store.Delete(ctx, id, f.Path); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return storeErr(err, id, f.Path)
		}
	}
	return nil
}
