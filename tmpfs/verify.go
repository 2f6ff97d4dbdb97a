package tmpfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// ErrQuarantined means a blob's stored bytes failed verification (in
// `triad fsck`, the background scrub or a read) and were moved aside, so
// they are never served. Write the file's true bytes again: the same
// content is stored afresh under the same sha256.
var ErrQuarantined = errors.New("tmpfs: blob quarantined: its stored bytes did not match their sha256")

// Fingerprinted is an optional ability of a Blob whose store can tell,
// without reading it, that its bytes are the ones it last verified:
// tmpfs/local compares the file's device, inode, size, mtime and ctime
// with the ones recorded when the file was written or last hashed (see
// docs/DECISIONS.md, "Verified once: a file's fingerprint"). A read of a
// Verified blob skips hashing; any other read hashes and, when the digest
// matches, calls MarkVerified.
type Fingerprinted interface {
	// Verified reports whether the fingerprint taken when the blob was
	// opened is the one recorded at its last verification.
	Verified() bool
	// MarkVerified records the fingerprint taken at open as verified. Call
	// it only after the bytes read through this Blob hashed to its digest.
	// If the file changed since it was opened, nothing is recorded.
	MarkVerified() error
}

// Filer is an optional ability of a Blob stored as a local file. File
// returns the open file (nil if there is none), so a server can hand its
// bytes to the kernel (sendfile). Reads through it are not verified: use
// Reader.File, which hands it out only once the bytes are known good.
type Filer interface {
	File() *os.File
}

// Scrubbable is the optional ability of a Blobs that `triad fsck` and the
// background scrub need: list every blob, and move a bad one aside.
type Scrubbable interface {
	// Walk calls fn for each stored blob, in no set order, until fn
	// returns an error (which Walk returns) or the blobs run out.
	Walk(ctx context.Context, fn func(d Digest, size int64) error) error
	// Quarantine moves blob d aside, with report (JSON) kept beside it, if
	// its stored version is still version (Blob.Version of the copy found
	// bad); if a new copy replaced it meanwhile, that copy stays and
	// Quarantine returns ErrPrecondition. Later opens of d fail with
	// ErrQuarantined until its true bytes are written again.
	Quarantine(ctx context.Context, d Digest, version string, report []byte) error
}

// Sweeper is an optional ability of a Blobs that a crash can leave
// garbage in (a temp file, an S3 upload whose blob was never named):
// Sweep removes such leftovers older than age, which no blob needs, and
// says how many it removed. Fsck calls it after its pass.
type Sweeper interface {
	Sweep(ctx context.Context, age time.Duration) (int, error)
}

// RunLister is an optional ability of an Index: Runs lists every run that
// has an index, so `triad fsck` can say which runs and paths held a bad
// blob.
type RunLister interface {
	Runs(ctx context.Context) ([]runid.ID, error)
}

// unwrapBlobs follows Unwrap() Blobs through wrappers (metrics) until one
// has the ability T.
func unwrapBlobs[T any](b Blobs) (T, bool) {
	for {
		if t, ok := b.(T); ok {
			return t, true
		}
		u, ok := b.(interface{ Unwrap() Blobs })
		if !ok {
			var zero T
			return zero, false
		}
		b = u.Unwrap()
	}
}

// unwrapIndex is unwrapBlobs for an Index.
func unwrapIndex[T any](x Index) (T, bool) {
	for {
		if t, ok := x.(T); ok {
			return t, true
		}
		u, ok := x.(interface{ Unwrap() Index })
		if !ok {
			var zero T
			return zero, false
		}
		x = u.Unwrap()
	}
}

// verified reports whether b's bytes are known good without reading them.
func verified(b Blob) bool {
	f, ok := b.(Fingerprinted)
	return ok && f.Verified()
}

// markVerified records b as verified, if its store keeps fingerprints.
func (s *Store) markVerified(ctx context.Context, b Blob, d Digest) {
	if f, ok := b.(Fingerprinted); ok {
		if err := f.MarkVerified(); err != nil {
			// Only costs a re-hash on the next read.
			s.log.WarnContext(ctx, "could not record a blob's fingerprint", "sha256", d.String(), "err", err)
		}
	}
}

// hashBlob hashes b from its start and fails with ErrDigestMismatch if it
// does not have digest d.
func (s *Store) hashBlob(ctx context.Context, b Blob, d Digest) error {
	return s.hashBlobPaced(ctx, b, d, nil)
}

// hashBlobPaced is hashBlob, reading no faster than p allows (nil: no
// bound).
func (s *Store) hashBlobPaced(ctx context.Context, b Blob, d Digest, p *pacer) error {
	if _, err := b.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := NewHasher()
	n, err := io.CopyBuffer(h, struct{ io.Reader }{p.reader(ctx, b)}, make([]byte, bufFor(b.Size(), chunkSize)))
	if err != nil {
		return fmt.Errorf("verify %s: %w", d.Short(), err)
	}
	if got := DigestFromHash(h); got != d || n != b.Size() {
		s.log.ErrorContext(ctx, "blob does not match its digest", "want", d.String(), "got", got.String(), "size", n, "want_size", b.Size())
		return fmt.Errorf("%w: blob %s", ErrDigestMismatch, d)
	}
	return nil
}

// File returns the blob's file, verified, when the blob is stored as a
// local file, so a server can serve it without copying it through user
// space (http.ServeContent with an *os.File uses sendfile). If the file's
// fingerprint is not the one recorded at its last verification, File hashes
// it whole first and fails with ErrDigestMismatch if it does not match: a
// corrupt blob is refused before a byte is sent. It returns nil, nil when
// the blob is not a local file; read it with Read, which verifies as it
// streams. Call File before any Read or Seek.
func (r *Reader) File(ctx context.Context) (*os.File, error) {
	fl, ok := r.b.(Filer)
	if !ok || r.started || r.direct && !r.trusted {
		return nil, nil
	}
	f := fl.File()
	if f == nil {
		return nil, nil
	}
	if !r.trusted {
		if err := r.store.hashBlob(ctx, r.b, r.want); err != nil {
			return nil, err
		}
		r.store.markVerified(ctx, r.b, r.want)
		r.trusted, r.direct = true, true
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return f, nil
}

// Verify checks the whole blob r reads against its digest, as
// Store.Verify does: for a caller that serves a range or a HEAD, which the
// streaming check does not cover.
func (r *Reader) Verify(ctx context.Context) error { return r.store.Verify(ctx, r.want) }

// Verified reports whether the blob's bytes were known good when it was
// opened (its fingerprint matched), so reads are not hashed.
func (r *Reader) Verified() bool { return r.trusted }

// ctxReader stops a long read when its context ends.
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
