// Package workspace keeps a kernel's working directory and its run's file index in step, so that both are one namespace.
//
// Before a cell, the run's files are materialised into the directory; after
// it, whatever the cell created, changed or deleted is harvested back into
// the store. The directory is a sandbox.WorkDir, so this package never
// touches a host path: it works the same for a kernel whose files live in a
// container, a wasm instance or a remote pod, and the WorkDir guarantees that
// no symlink or special file a cell plants is followed (they are skipped).
package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"sort"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// Dir is a kernel working directory bound to a run.
type Dir struct {
	store *tmpfs.Store
	run   runid.ID
	wd    sandbox.WorkDir
	log   *slog.Logger
	// Protect, when set, names paths the harvest must not take from the
	// directory (the journal's files): they are reported in Harvest's
	// tampered list and restored from the store instead.
	Protect func(path string) bool
	// Omit, when set, names run paths that are never copied into the
	// directory (journal checkpoints); a cell that creates one has it
	// removed again, as a protected path.
	Omit func(path string) bool

	seen   map[string]synced // what the directory held at the last sync
	losses uint64            // the directory's sandbox.Losable count at the last sync
}

// synced is a path's state at the last sync: the stamp the directory gave
// it and the run file it matched, so unchanged files are not read again.
type synced struct {
	stamp sandbox.Stamp
	file  tmpfs.File
}

// Open binds the working directory wd to run.
func Open(store *tmpfs.Store, run runid.ID, wd sandbox.WorkDir, log *slog.Logger) *Dir {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Dir{store: store, run: run, wd: wd, log: log, seen: map[string]synced{}, losses: lossesOf(wd)}
}

// lossesOf is wd's sandbox.Losable count, 0 for a directory that cannot
// lose its contents.
func lossesOf(wd sandbox.WorkDir) uint64 {
	if l, ok := wd.(sandbox.Losable); ok {
		return l.Losses()
	}
	return 0
}

// Materialize writes every file of the run into the directory, and
// removes regular files the run does not have: a kernel adopted from
// another process (sandbox.Detacher) may hold files the run has deleted
// since, or that a cell wrote in a call that was never recorded. The store
// is the run's record; the directory is made to match it.
func (d *Dir) Materialize(ctx context.Context) error { return d.materialize(ctx, true) }

// materialize puts the run's files, and with prune removes the rest.
func (d *Dir) materialize(ctx context.Context, prune bool) error {
	d.losses = lossesOf(d.wd)
	files, err := d.store.List(ctx, d.run, "")
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(files))
	for _, f := range files {
		want[f.Path] = true
		if err := d.Put(ctx, f); err != nil {
			return err
		}
	}
	if !prune {
		return nil
	}
	l, err := d.wd.Scan(ctx)
	if err != nil {
		return err
	}
	for _, e := range l.Files {
		if !want[e.Path] {
			d.log.InfoContext(ctx, "removing a file the run does not have from the kernel's directory", "run", d.run, "path", e.Path)
			if err := d.wd.Remove(ctx, e.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

// Put writes one run file into the directory (after tmp.write), replacing
// whatever is at its path, including a symlink, without following it; an
// omitted path (Omit) is left out. A
// directory the cell made where the index has a file is the cell's newer
// state: it is left for the harvest, and Put does nothing.
func (d *Dir) Put(ctx context.Context, f tmpfs.File) error {
	if s, ok := d.seen[f.Path]; ok && s.file.SHA256 == f.SHA256 || d.Omit != nil && d.Omit(f.Path) {
		return nil
	}
	r, err := d.store.OpenBlob(ctx, f.SHA256)
	if err != nil {
		return err
	}
	defer r.Close()
	e, err := d.wd.Put(ctx, f.Path, r)
	if errors.Is(err, sandbox.ErrNotRegular) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("materialise %s: %w", f.Path, err)
	}
	d.seen[f.Path] = synced{stamp: e.Stamp, file: f}
	return nil
}

// Append brings the directory's copy of f up to date, where f is the file
// whose previous version prev was extended by data: in place when the
// directory can append (sandbox.Appender) and holds prev as it was last
// synced, so the cost is that of data; otherwise f is written whole.
func (d *Dir) Append(ctx context.Context, f tmpfs.File, prev tmpfs.Digest, data []byte) error {
	s, ok := d.seen[f.Path]
	if a, can := d.wd.(sandbox.Appender); can && ok && !prev.IsZero() && s.file.SHA256 == prev {
		e, err := a.Append(ctx, f.Path, s.stamp, bytes.NewReader(data))
		if err == nil {
			d.seen[f.Path] = synced{stamp: e.Stamp, file: f}
			return nil
		}
		if !errors.Is(err, sandbox.ErrStale) && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("append to %s: %w", f.Path, err)
		}
		// A cell changed the copy: the harvest reports it; write it whole.
	}
	return d.Put(ctx, f)
}

// Remove deletes a path from the directory (after tmp.delete). A missing
// file is not an error.
func (d *Dir) Remove(ctx context.Context, p string) error {
	delete(d.seen, p)
	return d.wd.Remove(ctx, p)
}

// Change is the result of a harvest.
type Change struct {
	// Written are files the cell created or changed, now in the store.
	Written []tmpfs.File
	// Deleted are paths the cell removed, now gone from the index.
	Deleted []string
	// Skipped are entries that were not harvested: symlinks, special
	// files, and names the path validator refuses.
	Skipped []string
	// Tampered are protected paths the cell changed or deleted; they were
	// restored from the store.
	Tampered []string
	// Refused are regular files that were not harvested because they are
	// larger than the directory's disk quota allows (sparse files), with
	// the reason to tell the cell.
	Refused []Refusal
}

// Refusal is a file the harvest would not store, and why.
type Refusal struct {
	Path string `json:"path"`
	// Size is the file's apparent size.
	Size   int64  `json:"size"`
	Reason string `json:"reason"`
}

// ErrIncomplete means a harvest stopped before every change was stored
// (the kernel was closed, the store failed): the Change lists what was,
// and the caller must not report the call as a success.
var ErrIncomplete = errors.New("workspace: harvest incomplete")

// Harvest stores what changed in the directory since the last sync. On
// error the returned Change holds what was stored before it, and the error
// matches ErrIncomplete (and sandbox.ErrClosed when the kernel was closed
// meanwhile).
//
// A file counts against the directory's disk quota at its apparent size: a
// file larger than the quota cannot be real data (the quota bounds what the
// cell could write), so it is sparse and is refused rather than stored at a
// size its blocks never held; and once this harvest has stored a quota's
// worth of bytes, the remaining changed files are refused too, so sparse
// files cannot add up past the quota either.
func (d *Dir) Harvest(ctx context.Context) (Change, error) {
	ch, err := d.harvest(ctx)
	if err != nil {
		err = fmt.Errorf("%w after storing %d files: %w", ErrIncomplete, len(ch.Written), err)
	}
	return ch, err
}

func (d *Dir) harvest(ctx context.Context) (Change, error) {
	var ch Change
	if n := lossesOf(d.wd); n != d.losses {
		// The directory lost its contents with its kernel (an evicted
		// pod): what is missing was not deleted by the cell. Put the
		// run's files back, then harvest what is there on top (what the
		// new kernel's cell wrote).
		d.log.WarnContext(ctx, "the kernel's working directory was lost; putting the run's files back", "run", d.run)
		d.seen = map[string]synced{}
		if err := d.materialize(ctx, false); err != nil {
			return ch, err
		}
	}
	l, err := d.wd.Scan(ctx)
	if err != nil {
		return ch, err
	}
	ch.Skipped = l.Skipped
	now := make(map[string]sandbox.Entry, len(l.Files))
	for _, e := range l.Files {
		now[e.Path] = e
	}
	// Deletions first: a cell that replaced file "a" with directory "a/"
	// must lose "a" from the index before "a/b" can be added.
	var gone []string
	for p := range d.seen {
		if _, ok := now[p]; !ok {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		if d.Protect != nil && d.Protect(p) {
			ch.Tampered = append(ch.Tampered, p)
			continue
		}
		delete(d.seen, p)
		if err := d.store.Delete(ctx, d.run, p); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return ch, err
		}
		ch.Deleted = append(ch.Deleted, p)
	}
	var stored int64
	for _, e := range l.Files { // sorted by path
		if s, ok := d.seen[e.Path]; ok && s.stamp == e.Stamp {
			continue
		}
		if d.Protect != nil && d.Protect(e.Path) {
			ch.Tampered = append(ch.Tampered, e.Path)
			continue
		}
		if r, ok := refuse(e.Path, e.Size, stored, l.Quota); !ok {
			ch.Refused = append(ch.Refused, r)
			continue
		}
		f, size, err := d.harvestFile(ctx, e.Path, stored, l.Quota)
		if err != nil {
			var r Refusal
			switch {
			case errors.Is(err, fs.ErrNotExist), errors.Is(err, sandbox.ErrNotRegular):
				continue // removed or swapped since the scan: the next harvest sees it
			case errors.As(err, &r):
				ch.Refused = append(ch.Refused, r)
				continue
			}
			return ch, err
		}
		stored += size
		ch.Written = append(ch.Written, f)
	}
	// Put the journal back the way the store has it.
	for _, p := range ch.Tampered {
		delete(d.seen, p)
		f, err := d.store.Stat(ctx, d.run, p)
		if errors.Is(err, tmpfs.ErrNotFound) || d.Omit != nil && d.Omit(p) {
			if err := d.wd.Remove(ctx, p); err != nil {
				return ch, err
			}
			continue
		}
		if err != nil {
			return ch, err
		}
		if err := d.Put(ctx, f); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// refuse reports whether a file of size may be stored when this harvest
// has stored already bytes under quota (0: none), and the refusal if not.
func refuse(p string, size, already, quota int64) (Refusal, bool) {
	switch {
	case quota <= 0:
		return Refusal{}, true
	case size > quota:
		return Refusal{Path: p, Size: size, Reason: fmt.Sprintf(
			"its apparent size (%d bytes) is larger than the working directory's disk quota (%d bytes), so it is a sparse file; it was not stored", size, quota)}, false
	case already+size > quota:
		return Refusal{Path: p, Size: size, Reason: fmt.Sprintf(
			"this cell's files already stored %d bytes, and this one would pass the working directory's disk quota (%d bytes); it was not stored", already, quota)}, false
	}
	return Refusal{}, true
}

// Error makes a Refusal usable as an error inside harvestFile.
func (r Refusal) Error() string { return r.Path + ": " + r.Reason }

// harvestFile stores the file at p and returns it with its size. The file
// is checked again as opened (it may have grown since the scan), and no
// more than its opened size is read.
func (d *Dir) harvestFile(ctx context.Context, p string, already, quota int64) (tmpfs.File, int64, error) {
	r, e, err := d.wd.Open(ctx, p)
	if err != nil {
		return tmpfs.File{}, 0, err
	}
	defer r.Close()
	if ref, ok := refuse(p, e.Size, already, quota); !ok {
		return tmpfs.File{}, 0, ref
	}
	f, err := d.store.Write(ctx, d.run, p, io.LimitReader(r, e.Size), 0)
	if err != nil {
		return tmpfs.File{}, 0, fmt.Errorf("harvest %s: %w", p, err)
	}
	d.seen[p] = synced{stamp: e.Stamp, file: f}
	return f, f.Size, nil
}

// Scan lists the directory's regular files as they are now, without
// storing anything or changing what the last sync saw: a read for a
// watcher, safe beside a running cell or command (the directory's Scan
// only walks it).
func (d *Dir) Scan(ctx context.Context) (sandbox.Listing, error) { return d.wd.Scan(ctx) }
