package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

// Blobs stores blobs as objects under blobs/sha256/ in the bucket.
type Blobs struct {
	c      *conn
	spool  string
	chains chains // appended blobs; see appends.go
}

var _ tmpfs.Blobs = (*Blobs)(nil)

// memMax is the largest body Put keeps in memory; bigger ones spool to a temp
// file, so a 1 GiB upload costs a few MiB of memory, not a gigabyte.
const memMax = 8 << 20

func blobKey(d tmpfs.Digest) string { return "blobs/sha256/" + d.String() }

// metaSHA256 is the header under which Put records a blob's digest in its
// object's metadata. An object under a blob's name without it was not
// written by Put.
const metaSHA256 = "X-Amz-Meta-Sha256"

// Put implements tmpfs.Blobs. The name of an object is the hash of its
// bytes, which is known only at the end of the stream, so the body is
// hashed while it is spooled (in memory up to memMax, else to an unlinked
// temp file in SpoolDir) and uploaded afterwards, unless the bucket has it
// already. The upload is signed with that sha256 as its payload hash, so
// the service recomputes it and refuses bytes that changed on the way.
func (b *Blobs) Put(ctx context.Context, r io.Reader, limit int64) (tmpfs.Digest, int64, error) {
	sp, err := b.spoolBody(ctx, r, limit)
	if err != nil {
		return tmpfs.Digest{}, 0, err
	}
	defer sp.close()
	key := blobKey(sp.digest)

	sctx, cancel := b.c.withTimeout(ctx)
	info, err := b.c.core.StatObject(sctx, b.c.bucket, key, minio.StatObjectOptions{})
	cancel()
	hexsum := sp.digest.String()
	switch err := b.c.fail(ctx, "stat blob "+sp.digest.Short(), err); {
	case err == nil && info.Size == sp.size && info.Metadata.Get(metaSHA256) == hexsum:
		// Content addressing makes a second copy redundant.
		b.c.log.DebugContext(ctx, "blob already stored", "sha256", hexsum, "size", sp.size)
		return sp.digest, sp.size, nil
	case err == nil:
		// The object under this name was not written by Put (it lacks the
		// digest Put records, or has the wrong size): it was replaced or
		// damaged behind our back. Heal it with bytes that really have
		// this digest.
		b.c.log.WarnContext(ctx, "replacing a stored blob that was not written by this store",
			"sha256", hexsum, "stored_size", info.Size, "size", sp.size)
	case !errors.Is(err, tmpfs.ErrNotFound):
		return tmpfs.Digest{}, 0, err
	}

	opts := minio.PutObjectOptions{
		ContentType:  contentTypeBin,
		UserMetadata: map[string]string{"sha256": hexsum},
	}
	if sp.size <= maxSinglePut {
		opts.DisableContentSha256 = true // the payload hash is given, not recomputed
		_, err = b.c.core.PutObject(ctx, b.c.bucket, key, sp.reader(), sp.size, "", hexsum, opts)
	} else {
		// Past S3's single-PUT limit. Multipart cannot carry a whole-object
		// sha256, so this path relies on the per-part checks and on reads
		// verifying the digest.
		opts.NumThreads = 2
		_, err = b.c.core.Client.PutObject(ctx, b.c.bucket, key, sp.reader(), sp.size, opts)
	}
	if err != nil {
		return tmpfs.Digest{}, 0, b.c.fail(ctx, "upload blob "+sp.digest.Short(), err)
	}
	b.c.log.DebugContext(ctx, "blob uploaded", "sha256", sp.digest.String(), "size", sp.size)
	return sp.digest, sp.size, nil
}

// spooled is a body that has been read to the end and hashed.
type spooled struct {
	digest tmpfs.Digest
	size   int64
	mem    []byte   // the body, when it fit in memory
	file   *os.File // else the body, in an unlinked temp file
	name   string   // file's name while it could not be unlinked (not on unix)
}

// reader returns the body from the start. It is not an io.Closer, because
// minio-go closes bodies that are, and it is seekable, so minio-go can
// rewind it to retry.
func (s *spooled) reader() io.ReadSeeker {
	if s.file != nil {
		return io.NewSectionReader(s.file, 0, s.size)
	}
	return bytes.NewReader(s.mem)
}

func (s *spooled) close() {
	if s.file != nil {
		s.file.Close()
		if s.name != "" {
			os.Remove(s.name)
		}
	}
}

func (b *Blobs) spoolBody(ctx context.Context, r io.Reader, limit int64) (*spooled, error) {
	src := io.Reader(ctxReader{ctx, r})
	if limit > 0 {
		src = io.LimitReader(src, limit+1)
	}
	tooLarge := func(n int64) bool { return limit > 0 && n > limit }
	h := tmpfs.NewHasher()
	head, eof, err := readUpTo(src, memMax)
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if eof {
		if tooLarge(int64(len(head))) {
			return nil, fmt.Errorf("%w: more than %d bytes", tmpfs.ErrTooLarge, limit)
		}
		h.Write(head)
		return &spooled{digest: tmpfs.DigestFromHash(h), size: int64(len(head)), mem: head}, nil
	}

	f, err := os.CreateTemp(b.spool, "put-*")
	if err != nil {
		return nil, fmt.Errorf("spool upload: %w", err)
	}
	sp := &spooled{file: f}
	// Unlinked at once, the file vanishes with the process even on a crash;
	// the open descriptor keeps its bytes until close.
	if os.Remove(f.Name()) != nil {
		sp.name = f.Name()
	}
	ok := false
	defer func() {
		if !ok {
			sp.close()
		}
	}()
	if _, err := f.Write(head); err != nil {
		return nil, fmt.Errorf("spool upload: %w", err)
	}
	h.Write(head)
	n := int64(len(head))
	head = nil // let the collector have it during a long copy
	m, err := spoolCopy(f, h, src)
	n += m
	if err != nil {
		return nil, fmt.Errorf("spool upload: %w", err)
	}
	if tooLarge(n) {
		return nil, fmt.Errorf("%w: more than %d bytes", tmpfs.ErrTooLarge, limit)
	}
	sp.digest, sp.size = tmpfs.DigestFromHash(h), n
	ok = true
	return sp, nil
}

// spoolCopy copies src to dst and into h, hashing on a second goroutine so
// that sha256 (the costliest step) overlaps reading and writing. Chunks
// circulate through a fixed set of buffers, so memory stays at 1 MiB.
func spoolCopy(dst io.Writer, h hash.Hash, src io.Reader) (int64, error) {
	const nbuf, size = 4, 256 << 10
	free := make(chan []byte, nbuf)
	for range nbuf {
		free <- make([]byte, size)
	}
	full := make(chan []byte, nbuf)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range full {
			h.Write(b)
			free <- b[:cap(b)]
		}
	}()
	var n int64
	var err error
	for {
		buf := <-free
		m, rerr := io.ReadFull(src, buf)
		if m > 0 {
			if _, werr := dst.Write(buf[:m]); werr != nil {
				err = werr
				break
			}
			n += int64(m)
			full <- buf[:m]
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			err = rerr
			break
		}
	}
	close(full)
	<-done
	return n, err
}

// readUpTo reads r until EOF or until it holds max bytes, growing its buffer
// as data arrives so a small body costs a small buffer. eof reports whether r
// ended.
func readUpTo(r io.Reader, max int) (buf []byte, eof bool, err error) {
	buf = make([]byte, 0, min(32<<10, max))
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= max {
				return buf, false, nil
			}
			grown := make([]byte, len(buf), min(2*cap(buf), max))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, true, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
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

// Open implements tmpfs.Blobs. It starts the GET at once, so a missing blob
// is reported here and a full read costs one request.
func (b *Blobs) Open(ctx context.Context, d tmpfs.Digest) (tmpfs.Blob, error) {
	o := &object{ctx: ctx, c: b.c, key: blobKey(d), short: d.Short()}
	info, err := o.get(minio.GetObjectOptions{})
	if errors.Is(err, tmpfs.ErrNotFound) {
		return b.openAppended(ctx, d)
	}
	if err != nil {
		return nil, err
	}
	o.size, o.etag = info.Size, info.ETag
	return o, nil
}

// Stat implements tmpfs.Blobs.
func (b *Blobs) Stat(ctx context.Context, d tmpfs.Digest) (int64, error) {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, blobKey(d), minio.StatObjectOptions{})
	if err = b.c.fail(ctx, "stat blob "+d.Short(), err); errors.Is(err, tmpfs.ErrNotFound) {
		return b.statAppended(ctx, d)
	}
	if err != nil {
		return 0, err
	}
	return info.Size, nil
}

// Ping implements tmpfs.Blobs: the bucket must exist and answer within a
// few seconds.
func (b *Blobs) Ping(ctx context.Context) error {
	tctx, cancel := context.WithTimeout(ctx, min(pingTimeout, b.c.timeout))
	defer cancel()
	ok, err := b.c.core.BucketExists(tctx, b.c.bucket)
	if err != nil {
		return b.c.fail(ctx, "ping bucket "+b.c.bucket, err)
	}
	if !ok {
		return fmt.Errorf("%w: bucket %s does not exist (it was deleted after startup)", tmpfs.ErrUnavailable, b.c.bucket)
	}
	return nil
}

// Close drops the client's idle connections. It is safe to call twice, and
// the store stays usable (it reconnects).
func (b *Blobs) Close() error {
	b.c.closeIdle()
	return nil
}

// object is an open blob: a GET streamed as it is read. A Seek only moves
// the offset; the next Read that needs other bytes closes the stream and
// issues a ranged GET pinned to the first response's ETag, so a blob
// replaced mid-read fails instead of splicing two versions together.
type object struct {
	// ctx is the Open call's. Read and Seek take no context, yet a Read
	// after a Seek must issue a request on behalf of that same caller, who
	// owns this reader for its lifetime.
	ctx   context.Context
	c     *conn
	key   string
	short string
	size  int64
	etag  string

	body    io.ReadCloser      // nil when no stream is open
	cancel  context.CancelFunc // ends body's request
	bodyOff int64              // offset of body's next byte
	off     int64              // logical offset
	closed  bool
}

// get starts a GET and makes it the open stream. The response must start
// within the store's timeout, retries included; after that the body streams
// for as long as the caller's context allows.
func (o *object) get(opts minio.GetObjectOptions) (minio.ObjectInfo, error) {
	ctx, cancel := context.WithCancel(o.ctx)
	timer := time.AfterFunc(o.c.timeout, cancel)
	body, info, _, err := o.c.core.GetObject(ctx, o.c.bucket, o.key, opts)
	if !timer.Stop() && o.ctx.Err() == nil {
		cancel()
		if body != nil {
			body.Close()
		}
		return minio.ObjectInfo{}, fmt.Errorf("%w: read blob %s: no response within %s", tmpfs.ErrUnavailable, o.short, o.c.timeout)
	}
	if err != nil {
		cancel()
		if er := minio.ToErrorResponse(err); er.StatusCode == http.StatusPreconditionFailed {
			return minio.ObjectInfo{}, fmt.Errorf("read blob %s: the stored object was replaced while it was being read; open it again", o.short)
		}
		return minio.ObjectInfo{}, o.c.fail(o.ctx, "read blob "+o.short, err)
	}
	o.body, o.cancel, o.bodyOff = body, cancel, o.off
	return info, nil
}

// drop closes the open stream, if any.
func (o *object) drop() {
	if o.body != nil {
		o.body.Close()
		o.cancel()
		o.body, o.cancel = nil, nil
	}
}

func (o *object) Size() int64     { return o.size }
func (o *object) Version() string { return o.etag }

func (o *object) Read(p []byte) (int, error) {
	if o.closed {
		return 0, os.ErrClosed
	}
	if o.off >= o.size {
		return 0, io.EOF
	}
	if o.body != nil && o.bodyOff != o.off {
		o.drop()
	}
	if o.body == nil {
		// Reopen at o.off, pinned to the version first opened.
		var opts minio.GetObjectOptions
		if o.etag != "" {
			opts.SetMatchETag(o.etag)
		}
		if o.off > 0 {
			opts.SetRange(o.off, 0)
		}
		if _, err := o.get(opts); err != nil {
			return 0, err
		}
	}
	n, err := o.body.Read(p)
	o.off += int64(n)
	o.bodyOff = o.off
	switch {
	case err == io.EOF && o.off < o.size:
		err = io.ErrUnexpectedEOF
	case err == nil && o.off >= o.size:
		// Report the end with the last bytes, as files do, so a reader
		// that checks at the end (tmpfs.Reader) sees it at once.
		err = io.EOF
	}
	if err != nil && err != io.EOF {
		o.drop()
		return n, o.c.fail(o.ctx, "read blob "+o.short, err)
	}
	return n, err
}

func (o *object) Seek(offset int64, whence int) (int64, error) {
	if o.closed {
		return 0, os.ErrClosed
	}
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = o.off + offset
	case io.SeekEnd:
		abs = o.size + offset
	default:
		return 0, fmt.Errorf("seek blob %s: invalid whence %d", o.short, whence)
	}
	if abs < 0 {
		return 0, fmt.Errorf("seek blob %s: negative position %d", o.short, abs)
	}
	o.off = abs
	return abs, nil
}

// Close ends the stream. It is safe to call twice.
func (o *object) Close() error {
	if o.closed {
		return nil
	}
	o.closed = true
	o.drop()
	return nil
}
