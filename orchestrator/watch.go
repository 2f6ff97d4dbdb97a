package orchestrator

import (
	"context"
	"strings"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// FileState is one file of a run's working directory as a watcher sees it
// at one moment.
type FileState struct {
	// File is the run file at the path in the store's index; its
	// zero value when only the live kernel's directory has it (a cell or a
	// command wrote it, and the call is not yet harvested).
	File tmpfs.File
	// Stamp is the live kernel's change token for the file (see
	// sandbox.Stamp), empty when no kernel is live or it lacks the file.
	Stamp sandbox.Stamp
	// Size is the file's size where it was seen (the kernel's copy first).
	Size int64
}

// WorkingFiles lists the files of a run's working directory under prefix
// as they are now, from every source at once: the store's index (what
// calls recorded: tmp.write, harvested cells and commands) and, when the
// run has a live kernel, its working directory as scanned this moment, so
// a command still running is seen writing. It is a read for a watcher, not
// a tool call: it is not journaled (a watcher polls it; see
// docs/DECISIONS.md, "E2B surface: watchDir"), takes no run lock, and
// checks the caller may read the run as every read does.
//
// A path the kernel's directory lacks while the store has it is gone,
// unless it is a file Triad never copies into kernels (a journal
// checkpoint). The scan ends when the kernel is closed meanwhile; the
// store's index then stands alone.
func (o *Orchestrator) WorkingFiles(ctx context.Context, run runid.ID, prefix string) (map[string]FileState, error) {
	p, err := safepath.CleanPrefix(prefix)
	if err != nil {
		return nil, err
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Read, false); err != nil {
		return nil, err
	}
	files, err := o.store.List(ctx, run, p)
	if err != nil {
		return nil, storeErr(err, run, p)
	}
	out := make(map[string]FileState, len(files))
	for _, f := range files {
		out[f.Path] = FileState{File: f, Size: f.Size}
	}
	if o.kernels == nil {
		return out, nil
	}
	sess := o.kernels.Peek(run)
	if sess == nil {
		return out, nil
	}
	l, err := sess.Dir.Scan(ctx)
	if err != nil {
		// Closed or unreachable meanwhile: the index stands alone.
		o.log.DebugContext(ctx, "scan a live kernel's directory for a watcher", "run", run, "err", err)
		return out, nil
	}
	inDir := make(map[string]bool, len(l.Files))
	for _, e := range l.Files {
		if p != "" && !strings.HasPrefix(e.Path, p) {
			continue
		}
		inDir[e.Path] = true
		s := out[e.Path]
		s.Stamp, s.Size = e.Stamp, e.Size
		out[e.Path] = s
	}
	for path := range out {
		if !inDir[path] && !runfiles.IsCheckpoint(path) {
			delete(out, path)
		}
	}
	return out, nil
}
