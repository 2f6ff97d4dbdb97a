package tmpfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
)

// Batcher is an Index that puts several entries of a run as one durable
// record: after a crash, either every entry of the batch is in the index
// or none is (tmpfs/local writes them as one line of the run's log, with
// one fsync). Store.Commit uses it when the index has it; without it
// (tmpfs/s3, one object per entry), a commit puts its entries one by one.
// See "One group commit per step" in docs/DECISIONS.md.
type Batcher interface {
	PutAll(ctx context.Context, run runid.ID, files []File) error
}

// Change is one file a Commit changes. With Link set, Path becomes a
// second name for that blob (a journal checkpoint); with Whole set, Data
// replaces the file; otherwise Data is appended to it (Append).
type Change struct {
	Path  string
	Data  []byte
	Whole bool
	Link  *File
}

// Committed is what a Commit did to one file: the file as it now stands,
// and the version it replaced (zero when it did not exist).
type Committed struct {
	File
	Prev File
}

// Commit makes changes to a run's files as one group: their bytes are
// stored first, then the index takes every new entry at once (Batcher),
// so a reader, or a store reopened after a crash at any point, sees all of
// the changes or none of them. Like Append, it never loses a concurrent
// write to one of its paths: if a path no longer holds the version its
// change started from, the whole group starts over from the new versions.
// It is the journal's one write per step.
func (s *Store) Commit(ctx context.Context, run runid.ID, changes []Change) ([]Committed, error) {
	cs := make([]Change, len(changes))
	paths := make([]string, len(changes))
	for i, c := range changes {
		p, err := safepath.Clean(c.Path)
		if err != nil {
			return nil, err
		}
		if slices.Contains(paths[:i], p) {
			return nil, fmt.Errorf("commit: %s changed twice", p)
		}
		c.Path, cs[i], paths[i] = p, c, p
	}
	// Appends to each path are serialized with Store.Append's, taken in
	// path order so that two commits never wait on each other.
	sorted := slices.Clone(paths)
	slices.Sort(sorted)
	for _, p := range sorted {
		defer s.appending.Lock(run.String() + "\x00" + p)()
	}
	for {
		bases, err := s.commitBases(ctx, run, paths)
		if err != nil {
			return nil, err
		}
		out := make([]Committed, len(cs))
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i], errs[i] = s.commitBlob(ctx, run, c, bases[i])
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		ok, err := s.commitIndex(ctx, run, out)
		if ok || err != nil {
			return out, err
		}
	}
}

// commitBases returns the version of each path a commit starts from.
func (s *Store) commitBases(ctx context.Context, run runid.ID, paths []string) ([]File, error) {
	unlock := s.lock(run)
	defer unlock()
	out := make([]File, len(paths))
	for i, p := range paths {
		f, err := s.index.Get(ctx, run, p)
		switch {
		case err == nil:
			out[i] = f
		case !errors.Is(err, ErrNotFound):
			return nil, err
		default:
			if err := s.checkTree(ctx, run, p); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// commitBlob stores one change's bytes and returns its new entry.
func (s *Store) commitBlob(ctx context.Context, run runid.ID, c Change, base File) (Committed, error) {
	var (
		d   Digest
		n   int64
		err error
	)
	switch {
	case c.Link != nil:
		d, n = c.Link.SHA256, c.Link.Size
	case c.Whole:
		d, n, err = s.blobs.Put(ctx, bytes.NewReader(c.Data), 0)
	case len(c.Data) == 0 && !base.SHA256.IsZero():
		d, n = base.SHA256, base.Size
	default:
		d, n, err = s.appendBlob(ctx, run, c.Path, base, c.Data)
	}
	if err != nil {
		return Committed{}, fmt.Errorf("commit %s: %w", c.Path, err)
	}
	return Committed{File: File{Path: c.Path, Size: n, SHA256: d, ModifiedAt: s.now().UTC()}, Prev: base}, nil
}

// commitIndex puts every new entry in the index at once if each path
// still holds the version its change started from, and reports whether it
// did.
func (s *Store) commitIndex(ctx context.Context, run runid.ID, cs []Committed) (bool, error) {
	unlock := s.lock(run)
	defer unlock()
	files := make([]File, len(cs))
	for i, c := range cs {
		now, err := s.index.Get(ctx, run, c.Path)
		switch {
		case errors.Is(err, ErrNotFound):
			if !c.Prev.SHA256.IsZero() {
				return false, nil
			}
			if err := s.checkTree(ctx, run, c.Path); err != nil {
				return false, err
			}
		case err != nil:
			return false, err
		case now.SHA256 != c.Prev.SHA256 || now.Size != c.Prev.Size:
			return false, nil
		}
		files[i] = c.File
	}
	if err := s.putAllIndex(ctx, run, files); err != nil {
		return false, fmt.Errorf("index: %w", err)
	}
	return true, nil
}
