package tmpfs

import (
	"bytes"
	"context"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
)

// Appender is a Blobs that can store a blob as an earlier blob followed by
// more bytes, at a cost that depends on the new bytes only: neither the
// earlier blob's bytes nor its hash are read again. The result is an
// ordinary blob: its digest is the sha256 of its whole content, and Open,
// Stat and every verified read treat it like any other. It is what keeps
// a run's journal (CEL.md, trace.jsonl, evaluations.jsonl) at a constant
// cost per step (see "Appending to a content-addressed store" in
// docs/DECISIONS.md).
type Appender interface {
	// Append stores the blob whose bytes are those of base (baseSize
	// bytes; the zero Digest for none) followed by tail, and returns its
	// digest and size. chain names the sequence of appends (a run and a
	// path): an implementation may keep state per chain to append in
	// place, and must stay correct when a chain's base is not its last
	// append (a file rewritten, or a restart). It returns an error
	// matching errors.ErrUnsupported when it cannot append at all, and
	// the Store then writes the whole blob instead.
	Append(ctx context.Context, base Digest, baseSize int64, tail []byte, chain string) (Digest, int64, error)
}

// Append adds data to the end of the file at path in run, creating it if
// it does not exist, and returns the file as it now stands. Its digest is
// that of the whole content, as if it had been written whole; the earlier
// content stays stored under its own digest (a journal checkpoint can
// Link it). With a Blobs that implements Appender the cost is that of data
// alone; otherwise the file is read (verified) and written whole.
//
// Appends to one path are serialized; appends to different paths of a run
// run in parallel. The index entry is replaced only if the path still
// holds the version the append started from, so an Append never loses a
// concurrent write, link or delete of its path: it starts over from the
// new version instead.
func (s *Store) Append(ctx context.Context, run runid.ID, path string, data []byte) (File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return File{}, err
	}
	defer s.appending.Lock(run.String() + "\x00" + p)()
	for {
		cur, exists, err := s.appendBase(ctx, run, p)
		if err != nil {
			return File{}, err
		}
		if exists && len(data) == 0 {
			return cur, nil
		}
		d, n, err := s.appendBlob(ctx, run, p, cur, data)
		if err != nil {
			return File{}, fmt.Errorf("append to %s: %w", p, err)
		}
		f := File{Path: p, Size: n, SHA256: d, ModifiedAt: s.now().UTC()}
		ok, err := s.commitAppend(ctx, run, cur, exists, f)
		if ok || err != nil {
			return f, err
		}
	}
}

// appendBase returns the file an append to p starts from, checking that
// a new file fits the run's tree.
func (s *Store) appendBase(ctx context.Context, run runid.ID, p string) (File, bool, error) {
	unlock := s.lock(run)
	defer unlock()
	cur, err := s.index.Get(ctx, run, p)
	if err == nil {
		return cur, true, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return File{}, false, err
	}
	return File{}, false, s.checkTree(ctx, run, p)
}

// commitAppend puts f in the index if p still holds cur (or, for a new
// file, still nothing), and reports whether it did.
func (s *Store) commitAppend(ctx context.Context, run runid.ID, cur File, existed bool, f File) (bool, error) {
	unlock := s.lock(run)
	defer unlock()
	now, err := s.index.Get(ctx, run, f.Path)
	switch {
	case errors.Is(err, ErrNotFound):
		if existed {
			return false, nil
		}
		if err := s.checkTree(ctx, run, f.Path); err != nil {
			return false, err
		}
	case err != nil:
		return false, err
	case !existed || now.SHA256 != cur.SHA256 || now.Size != cur.Size:
		return false, nil
	}
	if err := s.putIndex(ctx, run, f); err != nil {
		return false, fmt.Errorf("index %s: %w", f.Path, err)
	}
	return true, nil
}

// appendBlob stores cur's bytes followed by data (cur is the zero File for
// a new file).
func (s *Store) appendBlob(ctx context.Context, run runid.ID, p string, cur File, data []byte) (Digest, int64, error) {
	if a, ok := unwrapBlobs[Appender](s.blobs); ok && len(data) > 0 {
		d, n, err := a.Append(ctx, cur.SHA256, cur.Size, data, run.String()+"/"+p)
		if !errors.Is(err, errors.ErrUnsupported) {
			return d, n, err
		}
	}
	var old []byte
	if !cur.SHA256.IsZero() {
		r, err := s.OpenBlob(ctx, cur.SHA256)
		if err != nil {
			return Digest{}, 0, err
		}
		old, err = io.ReadAll(r)
		r.Close()
		if err != nil {
			return Digest{}, 0, err
		}
	}
	return s.blobs.Put(ctx, io.MultiReader(bytes.NewReader(old), bytes.NewReader(data)), 0)
}

// HashState returns the midstate of h, a hash from NewHasher, from which
// ResumeHash continues: an Appender keeps it beside each blob it appends
// so that the next append hashes only the new bytes.
func HashState(h hash.Hash) ([]byte, error) {
	m, ok := h.(encoding.BinaryMarshaler)
	if !ok {
		return nil, errors.New("tmpfs: hash has no midstate")
	}
	return m.MarshalBinary()
}

// ResumeHash returns a hash that continues from a midstate HashState
// returned, as if every byte hashed before had been written to it again.
// An empty state starts a new hash.
func ResumeHash(state []byte) (hash.Hash, error) {
	h := NewHasher()
	if len(state) == 0 {
		return h, nil
	}
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
		return nil, fmt.Errorf("tmpfs: bad hash midstate: %w", err)
	}
	return h, nil
}
