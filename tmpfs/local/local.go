// Package local keeps a tmpfs store on local disk: blobs as files named by sha256, each run's index as an append-only log.
//
// Layout under the data directory:
//
//	blobs/sha256/ab/abcdef…        immutable blob files, written atomically
//	fingerprints/ab/abcdef…        each blob file's fingerprint at its last verification
//	quarantine/sha256/abcdef…      blobs that failed verification, moved aside,
//	quarantine/sha256/abcdef….json with what was found and which runs held them
//	runs/<run>/index.jsonl         the run's index: one put or del record a line
//	extents/                       appended blobs (tmpfs.Appender): see extents.go
//	meta/<key>!                    Triad's records outside runs (tmpfs.Meta)
//	tmp/                           temp files for writes in flight
//
// Every write is durable when it returns: blobs are written to a temp file,
// fsynced and renamed into place; index records are appended and fsynced.
// A blob is hashed as it is written; later reads hash it again only when
// the file's fingerprint has changed since (see fingerprint.go).
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/triadhq/triad/tmpfs"
)

// Blobs stores blobs as files.
type Blobs struct {
	dir  string
	fps  *fingerprints
	ext  extents    // appended blobs; see extents.go
	pins tmpfs.Pins // what a collection must not remove; see collect.go
}

var (
	_ tmpfs.Blobs         = (*Blobs)(nil)
	_ tmpfs.Scrubbable    = (*Blobs)(nil)
	_ tmpfs.Fingerprinted = (*fileBlob)(nil)
	_ tmpfs.Filer         = (*fileBlob)(nil)
)

// copyBufs holds Put's copy buffers: a small file's Put no longer zeroes
// a fresh MiB.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// NewBlobs returns a blob store rooted at dataDir, creating its directories.
func NewBlobs(dataDir string) (*Blobs, error) {
	b := &Blobs{dir: dataDir}
	for _, d := range []string{b.tmpDir(), filepath.Join(dataDir, "blobs", "sha256")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	fps, err := newFingerprints(dataDir, b.tmpDir())
	if err != nil {
		return nil, err
	}
	b.fps = fps
	return b, nil
}

func (b *Blobs) tmpDir() string { return filepath.Join(b.dir, "tmp") }

func (b *Blobs) path(d tmpfs.Digest) string {
	h := d.String()
	return filepath.Join(b.dir, "blobs", "sha256", h[:2], h)
}

// Put implements tmpfs.Blobs.
func (b *Blobs) Put(ctx context.Context, r io.Reader, limit int64) (tmpfs.Digest, int64, error) {
	tmp, err := os.CreateTemp(b.tmpDir(), "put-*")
	if err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("temp file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := tmpfs.NewAsyncHasher()
	hashed := false
	defer func() {
		if !hashed {
			h.Digest() // end the hashing goroutine
		}
	}()
	src := r
	if limit > 0 {
		src = io.LimitReader(r, limit+1)
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	n, err := io.CopyBuffer(io.MultiWriter(tmp, h), ctxReader{ctx, src}, *buf)
	if err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("write blob: %w", err)
	}
	if limit > 0 && n > limit {
		return tmpfs.Digest{}, 0, fmt.Errorf("%w: more than %d bytes", tmpfs.ErrTooLarge, limit)
	}
	hashed = true
	d := h.Digest()
	dst := b.path(d)
	// Even when the blob exists, the verified new copy replaces it: one
	// file per digest either way, and a blob damaged on disk is repaired by
	// writing its true bytes again instead of being trusted for its size.
	if err := tmp.Sync(); err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("fsync blob: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("close blob: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o400); err != nil {
		return tmpfs.Digest{}, 0, err
	}
	// A collection's removals wait while the blob is put in place and
	// noted (see collect.go); the body, written before, held nothing.
	defer b.pins.Write()()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return tmpfs.Digest{}, 0, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("rename blob into place: %w", err)
	}
	done = true
	b.pins.Note(d)
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return tmpfs.Digest{}, 0, err
	}
	// The bytes were hashed as they were written: the file as it now
	// stands is verified.
	if st, err := os.Stat(dst); err == nil {
		if fp, ok := fingerprintOf(st); ok {
			b.fps.put(d, fp) // on failure, the first read hashes
		}
	}
	return d, n, nil
}

// Open implements tmpfs.Blobs.
func (b *Blobs) Open(ctx context.Context, d tmpfs.Digest) (tmpfs.Blob, error) {
	f, err := os.Open(b.path(d))
	if errors.Is(err, os.ErrNotExist) {
		blob, err := b.openExtent(d)
		if errors.Is(err, tmpfs.ErrNotFound) {
			return nil, b.missing(d)
		}
		return blob, err
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %s: %w", d.Short(), err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	fb := &fileBlob{f: f, b: b, d: d, size: st.Size(), version: fileVersion(st)}
	fb.fp, fb.hasFP = fingerprintOf(st)
	return fb, nil
}

// fileVersion names a blob file's state: its fingerprint, where there is one.
func fileVersion(st os.FileInfo) string {
	if fp, ok := fingerprintOf(st); ok {
		return fp.String()
	}
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	return fmt.Sprintf("%d-%d-%d", ino, st.ModTime().UnixNano(), st.Size())
}

// quarantined reports whether fsck moved a copy of blob d aside (a true
// copy may have been written since).
func (b *Blobs) quarantined(d tmpfs.Digest) bool {
	_, err := os.Stat(b.quarantinePath(d))
	return err == nil
}

// missing is the error for a blob with no file: ErrQuarantined if fsck
// moved it aside, else ErrNotFound.
func (b *Blobs) missing(d tmpfs.Digest) error {
	if b.quarantined(d) {
		return fmt.Errorf("%w: blob %s", tmpfs.ErrQuarantined, d)
	}
	return fmt.Errorf("%w: blob %s", tmpfs.ErrNotFound, d)
}

// Stat implements tmpfs.Blobs.
func (b *Blobs) Stat(ctx context.Context, d tmpfs.Digest) (int64, error) {
	st, err := os.Stat(b.path(d))
	if errors.Is(err, os.ErrNotExist) {
		n, err := b.statExtent(d)
		if errors.Is(err, tmpfs.ErrNotFound) {
			return 0, b.missing(d)
		}
		return n, err
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Ping implements tmpfs.Blobs: the data directory must be writable.
func (b *Blobs) Ping(ctx context.Context) error {
	f, err := os.CreateTemp(b.tmpDir(), "ping-*")
	if err != nil {
		return fmt.Errorf("%w: %v", tmpfs.ErrUnavailable, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// fileBlob is an open blob file and the fingerprint it had when opened.
type fileBlob struct {
	f       *os.File
	b       *Blobs
	d       tmpfs.Digest
	size    int64
	version string
	fp      fingerprint
	hasFP   bool
}

func (f *fileBlob) Read(p []byte) (int, error)                { return f.f.Read(p) }
func (f *fileBlob) ReadAt(p []byte, off int64) (int, error)   { return f.f.ReadAt(p, off) }
func (f *fileBlob) Seek(off int64, whence int) (int64, error) { return f.f.Seek(off, whence) }
func (f *fileBlob) Close() error                              { return f.f.Close() }
func (f *fileBlob) Size() int64                               { return f.size }
func (f *fileBlob) Version() string                           { return f.version }

// File implements tmpfs.Filer.
func (f *fileBlob) File() *os.File { return f.f }

// Verified implements tmpfs.Fingerprinted.
func (f *fileBlob) Verified() bool {
	if !f.hasFP {
		return false
	}
	rec, ok := f.b.fps.get(f.d)
	return ok && rec == f.fp
}

// MarkVerified implements tmpfs.Fingerprinted: the fingerprint taken at
// open is recorded if the file still has it, so bytes that changed while
// they were hashed are never vouched for.
func (f *fileBlob) MarkVerified() error {
	if !f.hasFP {
		return nil
	}
	st, err := f.f.Stat()
	if err != nil {
		return err
	}
	if now, ok := fingerprintOf(st); !ok || now != f.fp {
		return nil
	}
	return f.b.fps.put(f.d, f.fp)
}

// ctxReader stops a long copy when its context ends (a client hung up).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
