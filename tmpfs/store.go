package tmpfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/keyedmutex"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
)

// Store is a run-scoped file space over Blobs and an Index.
type Store struct {
	blobs Blobs
	index Index
	meta  Meta
	log   *slog.Logger
	now   func() time.Time

	locks     keyedmutex.Map[runid.ID] // serializes index mutation per run; empty when idle
	appending keyedmutex.Map[string]   // run + "\x00" + path; serializes appends per path; empty when idle
	usage     usageTable

	mu       sync.Mutex
	verified map[verifyKey]struct{} // whole-blob verifications, by blob version
}

type verifyKey struct {
	d       Digest
	version string
}

// maxVerified bounds the verification cache; past it the cache starts over.
const maxVerified = 4096

// New returns a Store. log may be nil. An index that also implements Meta
// keeps the store's records outside runs (see Store.Meta).
func New(blobs Blobs, index Index, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var meta Meta = noMeta{}
	if m, ok := index.(Meta); ok {
		meta = checkedMeta{m}
	}
	return &Store{blobs: blobs, index: index, meta: meta, log: log, now: time.Now, verified: map[verifyKey]struct{}{}}
}

// Forget drops what the index caches of run, when it caches (Forgetter),
// through any wrapper (metrics): another process wrote the run, and the
// next read must see it.
func (s *Store) Forget(run runid.ID) {
	if f, ok := unwrapIndex[Forgetter](s.index); ok {
		f.Forget(run)
	}
}

// Blobs returns the blob store, for callers that hold digests already.
func (s *Store) Blobs() Blobs { return s.blobs }

func (s *Store) lock(run runid.ID) func() { return s.locks.Lock(run) }

// Cached is how many runs the store holds something of in memory now: an
// index cache (Forgetter indexes report theirs) or a lock in use.
func (s *Store) Cached() int {
	n := s.locks.Len()
	n += s.appending.Len()
	if c, ok := unwrapIndex[interface{ Cached() int }](s.index); ok {
		n += c.Cached()
	}
	return n
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
	return s.link(ctx, run, p, d, n, false)
}

// WriteBytes is Write for bytes already in memory.
func (s *Store) WriteBytes(ctx context.Context, run runid.ID, path string, b []byte) (File, error) {
	return s.Write(ctx, run, path, bytes.NewReader(b), 0)
}

// Link points path in run at an existing blob of the given size, as if its
// bytes had been written. It is how a blob is reused without copying: a file
// named by hash, a journal checkpoint.
func (s *Store) Link(ctx context.Context, run runid.ID, path string, d Digest, size int64) (File, error) {
	return s.link(ctx, run, path, d, size, true)
}

// link is Link; touch is false for a blob the caller has just stored.
func (s *Store) link(ctx context.Context, run runid.ID, path string, d Digest, size int64, touch bool) (File, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return File{}, err
	}
	unlock := s.lock(run)
	defer unlock()
	if err := s.checkTree(ctx, run, p); err != nil {
		return File{}, err
	}
	// The blob may be one no run holds (a files_in by hash): touched, a
	// collection keeps it (see Collect).
	if touch {
		if err := s.touch(ctx, d); err != nil {
			return File{}, fmt.Errorf("link %s: %w", p, err)
		}
	}
	f := File{Path: p, Size: size, SHA256: d, ModifiedAt: s.now().UTC()}
	if err := s.putIndex(ctx, run, f); err != nil {
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
	if dc, ok := unwrapIndex[DirCounter](s.index); ok {
		// The common case, no file under p, without a listing.
		if n, err := dc.FilesUnder(ctx, run, p); err != nil || n == 0 {
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
	return s.deleteIndex(ctx, run, p)
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
	// A blob whose fingerprint shows it unchanged since it was verified is
	// read as it is (docs/DECISIONS.md, "Verified once").
	t := verified(b)
	return &Reader{b: b, want: d, store: s, trusted: t, direct: t}, nil
}

// Verify checks that a whole blob matches its digest, and fails with
// ErrDigestMismatch if it does not. A blob whose fingerprint is the one
// recorded at its last verification (tmpfs/local) is not read at all;
// other results are cached per blob version, so repeated ranged reads of
// an unchanged blob cost one pass.
func (s *Store) Verify(ctx context.Context, d Digest) error {
	b, err := s.blobs.Open(ctx, d)
	if err != nil {
		return err
	}
	defer b.Close()
	if verified(b) {
		return nil
	}
	key := verifyKey{d, b.Version()}
	s.mu.Lock()
	_, ok := s.verified[key]
	s.mu.Unlock()
	if ok {
		return nil
	}
	if err := s.hashBlob(ctx, b, d); err != nil {
		return err
	}
	s.markVerified(ctx, b, d)
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
// sequentially from offset 0 reach the end. It reads ahead on its own
// goroutine, hashing as it goes, and always holds the last chunk back until
// the hash is checked: on a mismatch the caller gets ErrDigestMismatch
// instead of the final bytes, so a client never receives a complete body
// that does not match its address. Seeks that return to the hashed position
// before reading (as http.ServeContent does to learn the size) keep the
// check; reads elsewhere are unchecked, so callers serving ranges call
// Store.Verify first. A blob whose store shows it unchanged since it was
// last verified (Fingerprinted) is read directly, without hashing.
type Reader struct {
	b     Blob
	want  Digest
	store *Store
	off   int64 // the caller's offset in the blob

	// The read-ahead pipeline, started by the first read at offset 0.
	pipe    chan chunk
	stop    chan struct{}
	staged  chan struct{} // closed when the reader stage is done with the blob
	stopped sync.Once
	cur     []byte // undelivered rest of the current chunk
	ret     func() // returns cur's buffer to the pool
	perr    error  // the pipeline's final error (io.EOF or a failure)
	direct  bool   // reads go straight to the blob (after a seek away, or trusted)
	started bool
	trusted bool // the blob's fingerprint showed it verified: no hashing
}

type chunk struct {
	b   []byte
	ret func()
	err error
}

const chunkSize = 1 << 20

// bufFor sizes a copy buffer for n bytes still to read: one byte more, so
// one read also finds the end, and at most limit (and at least 512 bytes).
func bufFor(n int64, limit int) int {
	return int(max(min(n+1, int64(limit)), 512))
}

// Size is the blob's length.
func (r *Reader) Size() int64 { return r.b.Size() }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if !r.started && !r.direct {
		if r.off != 0 {
			// A ranged read: the caller verified the blob first.
			if _, err := r.b.Seek(r.off, io.SeekStart); err != nil {
				return 0, err
			}
			r.direct = true
		} else {
			r.start()
		}
	}
	if r.direct {
		n, err := r.b.Read(p)
		r.off += int64(n)
		return n, err
	}
	for len(r.cur) == 0 {
		if r.ret != nil {
			r.ret()
			r.ret = nil
		}
		if r.perr != nil {
			return 0, r.perr
		}
		c, ok := <-r.pipe
		if !ok {
			r.perr = io.ErrUnexpectedEOF
			continue
		}
		if c.err != nil {
			r.perr = c.err
		}
		r.cur, r.ret = c.b, c.ret
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	r.off += int64(n)
	return n, nil
}

// WriteTo implements io.WriterTo. A read that streams from offset 0 hands
// w the read-ahead's chunks whole, with no copy through a caller's buffer
// and one write per chunk; like Read, it fails with ErrDigestMismatch
// instead of writing a corrupt blob's last chunk.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	if r.direct || !r.started && r.off != 0 {
		buf := make([]byte, bufFor(r.b.Size()-r.off, 256<<10))
		return io.CopyBuffer(w, struct{ io.Reader }{r}, buf)
	}
	if !r.started {
		r.start()
	}
	var total int64
	for {
		if len(r.cur) > 0 {
			n, err := w.Write(r.cur)
			total += int64(n)
			r.off += int64(n)
			r.cur = r.cur[n:]
			if err != nil {
				return total, err
			}
			continue
		}
		if r.ret != nil {
			r.ret()
			r.ret = nil
		}
		if r.perr != nil {
			if r.perr == io.EOF {
				return total, nil
			}
			return total, r.perr
		}
		c, ok := <-r.pipe
		if !ok {
			r.perr = io.ErrUnexpectedEOF
			continue
		}
		if c.err != nil {
			r.perr = c.err
		}
		r.cur, r.ret = c.b, c.ret
	}
}

// start runs the read-ahead: a reader stage and a hashing stage, so that
// reading the blob, hashing it and the caller's writes overlap. The hashing
// stage forwards chunk k only once chunk k+1 (or a verified end) is known.
func (r *Reader) start() {
	r.started = true
	r.pipe = make(chan chunk, 2)
	r.stop = make(chan struct{})
	// A large blob's read-ahead holds six chunks. A smaller one gets only
	// what it needs: below a chunk, one buffer a byte longer than the
	// blob reads the bytes and their end at once (a journal line, a small
	// CSV cost 6 MiB of zeroed memory each before).
	s := r.b.Size()
	size, n := bufFor(s, chunkSize), min(6, int(s/chunkSize)+2)
	pool := make(chan []byte, n)
	for range n {
		pool <- make([]byte, size)
	}
	raw := make(chan chunk, 2)
	r.staged = make(chan struct{})
	go func() { // reader stage
		defer close(r.staged)
		defer close(raw)
		for {
			var buf []byte
			select {
			case buf = <-pool:
			case <-r.stop:
				return
			}
			n, err := io.ReadFull(r.b, buf)
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			c := chunk{b: buf[:n], ret: func() { pool <- buf }}
			if n == 0 {
				pool <- buf
				c = chunk{}
			}
			if err != nil {
				c.err = err
			}
			select {
			case raw <- c:
			case <-r.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // hashing stage
		defer close(r.pipe)
		h := NewHasher()
		var held *chunk
		var total int64
		send := func(c chunk) bool {
			select {
			case r.pipe <- c:
				return true
			case <-r.stop:
				return false
			}
		}
		for c := range raw {
			if len(c.b) > 0 {
				h.Write(c.b)
				total += int64(len(c.b))
			}
			if c.err != nil && c.err != io.EOF {
				send(chunk{err: c.err})
				return
			}
			// The last chunk with bytes is held until the end is known
			// and checked; an empty end (the bytes ran out exactly at a
			// chunk's edge) releases nothing.
			if len(c.b) > 0 {
				if held != nil && !send(*held) {
					return
				}
				cc := chunk{b: c.b, ret: c.ret}
				held = &cc
			}
			if c.err == io.EOF {
				if got := DigestFromHash(h); got != r.want || total != r.b.Size() {
					r.store.log.Error("blob does not match its digest; aborting read", "want", r.want.String(), "got", got.String())
					if held != nil {
						held.ret()
					}
					send(chunk{err: fmt.Errorf("%w: blob %s", ErrDigestMismatch, r.want)})
					return
				}
				// Logged only; the context is the caller's, which a
				// goroutine must not keep.
				r.store.markVerified(context.Background(), r.b, r.want)
				if held != nil {
					held.err = io.EOF
					send(*held)
				} else {
					send(chunk{err: io.EOF})
				}
				return
			}
		}
	}()
}

// Seek implements io.Seeker. A seek away from the position the pipeline
// has delivered stops it, and later reads go straight to the blob.
func (r *Reader) Seek(off int64, whence int) (int64, error) {
	abs, err := SeekPosition(r.off, r.b.Size(), off, whence)
	if err != nil {
		return 0, err
	}
	if !r.started && !r.direct {
		// Nothing read yet: remember where the first read starts.
		r.off = abs
		return abs, nil
	}
	if abs == r.off && !r.direct {
		return abs, nil
	}
	if r.started {
		r.halt()
		<-r.staged // a Read it was in moves the blob's offset
	}
	r.direct = true
	n, err := r.b.Seek(abs, io.SeekStart)
	if err == nil {
		r.off = n
	}
	return n, err
}

func (r *Reader) halt() {
	r.stopped.Do(func() {
		if r.stop != nil {
			close(r.stop)
		}
	})
	if r.pipe != nil {
		for range r.pipe { // let the stages finish with the blob
		}
	}
}

// Close implements io.Closer. It closes the blob before it waits for the
// reader stage, because closing is what ends a Read that waits on the
// network; no goroutine of the Reader outlives Close.
func (r *Reader) Close() error {
	if !r.started {
		return r.b.Close()
	}
	r.halt()
	err := r.b.Close()
	<-r.staged
	return err
}
