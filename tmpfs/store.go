package tmpfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
)

// Store is a run-scoped file space over Blobs and an Index.
type Store struct {
	blobs Blobs
	index Index
	log   *slog.Logger
	now   func() time.Time

	locks sync.Map // runid.ID -> *sync.Mutex; serializes index mutation per run

	mu       sync.Mutex
	verified map[verifyKey]struct{} // whole-blob verifications, by blob version
}

type verifyKey struct {
	d       Digest
	version string
}

// maxVerified bounds the verification cache; past it the cache starts over.
const maxVerified = 4096

// New returns a Store. log may be nil.
func New(blobs Blobs, index Index, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{blobs: blobs, index: index, log: log, now: time.Now, verified: map[verifyKey]struct{}{}}
}

// Blobs returns the blob store, for callers that hold digests already.
func (s *Store) Blobs() Blobs { return s.blobs }

func (s *Store) lock(run runid.ID) func() {
	m, _ := s.locks.LoadOrStore(run, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// Write stores r at path in run, replacing any file there. limit > 0 caps the
// size (ErrTooLarge). The bytes are streamed and hashed on the fly, never held
// whole in memory.
func (s *Store) Write(ctx context.Context, run runid.ID, path string, r io.Reader, limit int64) (File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return File{}, err
	}
	d, n, err := s.blobs.Put(ctx, r, limit)
	if err != nil {
		return File{}, fmt.Errorf("store %s: %w", p, err)
	}
	return s.Link(ctx, run, p, d, n)
}

// WriteBytes is Write for bytes already in memory.
func (s *Store) WriteBytes(ctx context.Context, run runid.ID, path string, b []byte) (File, error) {
	return s.Write(ctx, run, path, bytes.NewReader(b), 0)
}

// Link points path in run at an existing blob of the given size, as if its
// bytes had been written. It is how a blob is reused without copying: a file
// named by hash, a journal checkpoint.
func (s *Store) Link(ctx context.Context, run runid.ID, path string, d Digest, size int64) (File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return File{}, err
	}
	unlock := s.lock(run)
	defer unlock()
	if err := s.checkTree(ctx, run, p); err != nil {
		return File{}, err
	}
	f := File{Path: p, Size: size, SHA256: d, ModifiedAt: s.now().UTC()}
	if err := s.index.Put(ctx, run, f); err != nil {
		return File{}, fmt.Errorf("index %s: %w", p, err)
	}
	return f, nil
}

// checkTree refuses a file whose ancestor is a file, or which is itself an
// ancestor of files. Called with the run locked.
func (s *Store) checkTree(ctx context.Context, run runid.ID, p string) error {
	for i := strings.IndexByte(p, '/'); i >= 0; i = next(p, i) {
		if _, err := s.index.Get(ctx, run, p[:i]); err == nil {
			return fmt.Errorf("%w: %q is a file, so %q cannot be created under it", ErrConflict, p[:i], p)
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	under, err := s.index.List(ctx, run, p+"/")
	if err != nil {
		return err
	}
	if len(under) > 0 {
		return fmt.Errorf("%w: %q is a directory holding %q", ErrConflict, p, under[0].Path)
	}
	return nil
}

func next(p string, i int) int {
	j := strings.IndexByte(p[i+1:], '/')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// Stat returns the entry at path.
func (s *Store) Stat(ctx context.Context, run runid.ID, path string) (File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return File{}, err
	}
	return s.index.Get(ctx, run, p)
}

// List returns the run's files under prefix ("" for all), sorted by path.
func (s *Store) List(ctx context.Context, run runid.ID, prefix string) ([]File, error) {
	p, err := safepath.CleanPrefix(prefix)
	if err != nil {
		return nil, err
	}
	return s.index.List(ctx, run, p)
}

// Delete removes path from run. The blob stays: other paths and runs may
// share it, and downloads by hash keep working.
func (s *Store) Delete(ctx context.Context, run runid.ID, path string) error {
	p, err := safepath.Clean(path)
	if err != nil {
		return err
	}
	unlock := s.lock(run)
	defer unlock()
	return s.index.Delete(ctx, run, p)
}

// Open opens the file at path for a full, sequential read that is verified
// as it streams.
func (s *Store) Open(ctx context.Context, run runid.ID, path string) (File, *Reader, error) {
	f, err := s.Stat(ctx, run, path)
	if err != nil {
		return File{}, nil, err
	}
	r, err := s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		return File{}, nil, err
	}
	return f, r, nil
}

// ReadAll reads a whole file, verified. Meant for small files (journals,
// records); stream large ones with Open.
func (s *Store) ReadAll(ctx context.Context, run runid.ID, path string) ([]byte, File, error) {
	f, r, err := s.Open(ctx, run, path)
	if err != nil {
		return nil, File{}, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, File{}, err
	}
	return b, f, nil
}

// OpenBlob opens a blob by digest. The Reader verifies the digest as it
// streams: if the bytes do not match, the read that would reach the end
// fails with ErrDigestMismatch instead of io.EOF, and the mismatch is logged.
// A reader used with Seek (ranged reads) must be checked with Verify first.
func (s *Store) OpenBlob(ctx context.Context, d Digest) (*Reader, error) {
	if d.IsZero() {
		return nil, ErrBadDigest
	}
	b, err := s.blobs.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	return &Reader{b: b, want: d, h: NewHasher(), store: s}, nil
}

// Verify hashes a whole blob and fails with ErrDigestMismatch if it does not
// match. Results are cached per blob version, so repeated ranged reads of an
// unchanged blob cost one pass.
func (s *Store) Verify(ctx context.Context, d Digest) error {
	b, err := s.blobs.Open(ctx, d)
	if err != nil {
		return err
	}
	defer b.Close()
	key := verifyKey{d, b.Version()}
	s.mu.Lock()
	_, ok := s.verified[key]
	s.mu.Unlock()
	if ok {
		return nil
	}
	h := NewHasher()
	if _, err := io.Copy(h, b); err != nil {
		return fmt.Errorf("verify %s: %w", d.Short(), err)
	}
	if got := DigestFromHash(h); got != d {
		s.log.ErrorContext(ctx, "blob does not match its digest", "want", d.String(), "got", got.String())
		return fmt.Errorf("%w: blob %s", ErrDigestMismatch, d)
	}
	s.mu.Lock()
	if len(s.verified) >= maxVerified {
		clear(s.verified)
	}
	s.verified[key] = struct{}{}
	s.mu.Unlock()
	return nil
}

// Ping checks the blob store.
func (s *Store) Ping(ctx context.Context) error { return s.blobs.Ping(ctx) }

// Reader reads a blob and checks its digest when reads that run
// sequentially from offset 0 reach the end. Seeks that return to the hashed
// position before reading (as http.ServeContent does to learn the size) keep
// the check; reads elsewhere are unchecked, so callers serving ranges call
// Store.Verify first.
type Reader struct {
	b      Blob
	want   Digest
	h      hash.Hash
	store  *Store
	off    int64 // current offset in the blob
	pos    int64 // bytes hashed so far
	broken bool  // a read happened away from pos: no end-of-stream check
}

// Size is the blob's length.
func (r *Reader) Size() int64 { return r.b.Size() }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.b.Read(p)
	if r.off != r.pos {
		r.broken = true
	}
	r.off += int64(n)
	if r.broken {
		return n, err
	}
	r.h.Write(p[:n])
	r.pos += int64(n)
	if err == io.EOF || (err == nil && r.pos == r.b.Size()) {
		if got := DigestFromHash(r.h); got != r.want || r.pos != r.b.Size() {
			r.store.log.Error("blob does not match its digest; aborting read", "want", r.want.String(), "got", got.String())
			return n, fmt.Errorf("%w: blob %s", ErrDigestMismatch, r.want)
		}
	}
	return n, err
}

// Seek implements io.Seeker.
func (r *Reader) Seek(off int64, whence int) (int64, error) {
	n, err := r.b.Seek(off, whence)
	if err == nil {
		r.off = n
	}
	return n, err
}

// Close implements io.Closer.
func (r *Reader) Close() error { return r.b.Close() }
