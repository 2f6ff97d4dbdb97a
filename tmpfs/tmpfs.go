// Package tmpfs is the per-run file space: paths mapped to immutable, sha256-addressed blobs.
//
// A Store joins two seams. Blobs holds bytes by content address, shared and
// deduplicated across every run. Index maps each run's paths to blobs. The
// implementations live in tmpfs/local (the embedded default) and tmpfs/s3.
//
// Reads never hand out bytes that do not match their digest: Open returns a
// reader that hashes as it streams and fails at the end on a mismatch, and
// Verify checks a whole blob before a ranged read.
package tmpfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// File is one entry of a run's index.
type File struct {
	Path       string    `json:"path"`
	Size       int64     `json:"size"`
	SHA256     Digest    `json:"sha256"`
	ModifiedAt time.Time `json:"modified_at"`
}

// Errors. Implementations translate their backends' errors into these at the
// adapter, so no minio or os error type leaves them.
var (
	// ErrNotFound means no such path in the run, or no such blob. List the
	// run's files to see what it has, or write the file first.
	ErrNotFound = errors.New("tmpfs: not found")
	// ErrBadDigest means a string is not a sha256 digest.
	ErrBadDigest = errors.New("tmpfs: malformed digest")
	// ErrDigestMismatch means stored bytes no longer hash to their address:
	// the blob is corrupt and must not be served. It is logged loudly.
	ErrDigestMismatch = errors.New("tmpfs: blob does not match its digest")
	// ErrTooLarge means a write went past its size limit; nothing was stored.
	ErrTooLarge = errors.New("tmpfs: too large")
	// ErrConflict means a path clashes with the run's tree: a file where a
	// directory is needed or the reverse ("a" and "a/b" cannot both exist,
	// because the run's files are also a kernel's working directory).
	ErrConflict = errors.New("tmpfs: path conflicts with an existing file or directory")
	// ErrUnavailable means the backing store does not answer. Retry later;
	// nothing was changed.
	ErrUnavailable = errors.New("tmpfs: store unavailable")
	// ErrReplaced means the object holding a blob was stored again while
	// it was being read (another writer of the same bytes, a repair), so
	// the read stopped rather than splice two objects together. Read it
	// again.
	ErrReplaced = errors.New("tmpfs: the stored object was replaced while it was being read")
)

// Blobs stores immutable bytes by sha256.
type Blobs interface {
	// Put stores everything r yields and returns its digest and size. If
	// more than limit bytes arrive (limit > 0), it stores nothing and
	// returns ErrTooLarge. Storing bytes that already exist is cheap and
	// leaves one copy.
	Put(ctx context.Context, r io.Reader, limit int64) (Digest, int64, error)
	// Open opens a blob. Its bytes are NOT verified: use Store.Open or
	// Store.OpenBlob, which are.
	Open(ctx context.Context, d Digest) (Blob, error)
	// Stat returns a blob's size, or ErrNotFound.
	Stat(ctx context.Context, d Digest) (int64, error)
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// Blob is an open blob. It is read by one goroutine at a time, but Close
// may be called while a Read on another goroutine is in progress (a
// Reader's read-ahead), and must end that Read soon: an S3 GET waiting on
// the network is cancelled.
type Blob interface {
	io.ReadSeekCloser
	// Size is the blob's length in bytes.
	Size() int64
	// Version changes whenever the stored object is replaced (a file's
	// inode and mtime, an S3 ETag), so verification results can be cached.
	Version() string
}

// DirCounter is an Index that counts the files under each directory of a
// run, so that a write can check the run's tree (no file where a
// directory is needed) without listing the run. Store uses it when the
// index has it.
type DirCounter interface {
	// FilesUnder returns how many of the run's files have paths starting
	// with dir + "/".
	FilesUnder(ctx context.Context, run runid.ID, dir string) (int, error)
}

// Index maps each run's paths to files. Implementations are safe for
// concurrent use; the Store serializes mutations per run.
type Index interface {
	// Get returns the entry at path, or ErrNotFound.
	Get(ctx context.Context, run runid.ID, path string) (File, error)
	// Put adds or replaces the entry at f.Path. It is durable when it returns.
	Put(ctx context.Context, run runid.ID, f File) error
	// Delete removes the entry at path, or returns ErrNotFound.
	Delete(ctx context.Context, run runid.ID, path string) error
	// List returns the run's entries whose path starts with prefix, sorted
	// by path. A run never written to has no entries.
	List(ctx context.Context, run runid.ID, prefix string) ([]File, error)
}

// DirCounts counts a run's files under each of their directories: the
// bookkeeping of a DirCounter. The zero value is not usable; make one
// with make(DirCounts).
type DirCounts map[string]int

// Add counts path's file in (delta 1) or out (delta -1) of each directory
// above it.
func (c DirCounts) Add(path string, delta int) {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] != '/' {
			continue
		}
		d := path[:i]
		if c[d] += delta; c[d] <= 0 {
			delete(c, d)
		}
	}
}

// Forgetter is an Index that caches runs (tmpfs/s3, tmpfs/local): Forget drops what it
// holds of run, so that the next read loads it from the backing store,
// where another process may have written since. The orchestrator also
// calls it for each run gone idle, to bound what the index keeps.
type Forgetter interface {
	Forget(run runid.ID)
}

// SeekPosition is where a Seek of a blob of size bytes, now at cur, lands:
// io.Seeker's arithmetic for a Blob that only records its offset.
func SeekPosition(cur, size, offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = cur + offset
	case io.SeekEnd:
		abs = size + offset
	default:
		return 0, fmt.Errorf("tmpfs: seek: invalid whence %d", whence)
	}
	if abs < 0 {
		return 0, fmt.Errorf("tmpfs: seek: negative position %d", abs)
	}
	return abs, nil
}
