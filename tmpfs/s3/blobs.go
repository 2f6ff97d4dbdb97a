package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

// Blobs stores blobs as objects under blobs/ in the bucket.
type Blobs struct {
	c      *conn
	chains chains     // appended blobs; see appends.go
	pins   tmpfs.Pins // what a collection must not remove; see collect.go
}

var (
	_ tmpfs.Blobs      = (*Blobs)(nil)
	_ tmpfs.Scrubbable = (*Blobs)(nil)
	_ tmpfs.Sweeper    = (*Blobs)(nil)
)

// memMax is the largest body Put keeps in memory and sends in one PUT;
// bigger ones go up in parts of at least this size as they arrive
// (upload.go), so a 1 GiB upload holds a few parts in memory, never the
// body.
const memMax = 5 << 20

func blobKey(d tmpfs.Digest) string { return "blobs/sha256/" + d.String() }

// metaSHA256 is the header under which Put records a blob's digest in its
// object's metadata. An object under a blob's name without it was not
// written by Put.
const metaSHA256 = "X-Amz-Meta-Sha256"

// Put implements tmpfs.Blobs. The name of an object is the hash of its
// bytes, which is known only at the end of the stream. A body of at most
// memMax bytes is read into memory, hashed, and uploaded in one PUT
// (unless the bucket has it already) signed with that sha256 as its
// payload hash, so the service recomputes it and refuses bytes that
// changed on the way. A bigger body is uploaded in parts as it arrives
// and named by a manifest once its hash is known (putLarge).
func (b *Blobs) Put(ctx context.Context, r io.Reader, limit int64) (tmpfs.Digest, int64, error) {
	return b.put(ctx, r, limit, b.pins.Write)
}

// put is Put; gate holds off a collection's removals while the blob is
// looked for and stored (a no-op when the caller holds it already: an
// Append's compaction). A body still arriving holds nothing.
func (b *Blobs) put(ctx context.Context, r io.Reader, limit int64, gate func() func()) (tmpfs.Digest, int64, error) {
	src := io.Reader(ctxReader{ctx, r})
	if limit > 0 {
		src = io.LimitReader(src, limit+1)
	}
	head, pooled, eof, err := readHead(src)
	if err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("read body: %w", err)
	}
	if !eof {
		return b.putLarge(ctx, head, src, limit, gate)
	}
	if pooled {
		defer putPart(head)
	}
	if limit > 0 && int64(len(head)) > limit {
		return tmpfs.Digest{}, 0, fmt.Errorf("%w: more than %d bytes", tmpfs.ErrTooLarge, limit)
	}
	d, size := tmpfs.DigestOf(head), int64(len(head))
	key := blobKey(d)
	defer gate()()
	b.pins.Note(d)

	sctx, cancel := b.c.withTimeout(ctx)
	info, err := b.c.core.StatObject(sctx, b.c.bucket, key, minio.StatObjectOptions{})
	cancel()
	hexsum := d.String()
	switch err := b.c.fail(ctx, "stat blob "+d.Short(), err); {
	case err == nil && b.intact(ctx, info, d, size):
		// Content addressing makes a second copy redundant.
		b.c.log.DebugContext(ctx, "blob already stored", "sha256", hexsum, "size", size)
		if err := b.freshen(ctx, key, info); err != nil {
			return tmpfs.Digest{}, 0, err
		}
		return d, size, nil
	case err == nil:
		// The object under this name was not written by Put (it lacks the
		// digest Put records, or has the wrong size): it was replaced or
		// damaged behind our back. Heal it with bytes that really have
		// this digest.
		b.c.log.WarnContext(ctx, "replacing a stored blob that was not written by this store",
			"sha256", hexsum, "stored_size", info.Size, "size", size)
	case !errors.Is(err, tmpfs.ErrNotFound):
		return tmpfs.Digest{}, 0, err
	}
	opts := minio.PutObjectOptions{
		ContentType:          contentTypeBin,
		UserMetadata:         map[string]string{"sha256": hexsum},
		DisableContentSha256: true, // the payload hash is given, not recomputed
	}
	if _, err := b.c.core.PutObject(ctx, b.c.bucket, key, bytes.NewReader(head), size, "", hexsum, opts); err != nil {
		return tmpfs.Digest{}, 0, b.c.fail(ctx, "upload blob "+d.Short(), err)
	}
	b.c.log.DebugContext(ctx, "blob uploaded", "sha256", hexsum, "size", size)
	return d, size, nil
}

// smallMax is how far readHead grows a buffer of its own before it moves
// to a pooled part buffer.
const smallMax = 256 << 10

// partPool recycles memMax-sized part buffers across uploads, so a steady
// stream of large writes allocates nothing per write.
var partPool = sync.Pool{New: func() any { b := make([]byte, memMax); return &b }}

func getPart() []byte  { return *partPool.Get().(*[]byte) }
func putPart(b []byte) { b = b[:cap(b)]; partPool.Put(&b) }

// readHead reads r until EOF or until it holds memMax bytes. A small body
// costs a small buffer; past smallMax the bytes move to a pooled part
// buffer (pooled reports it: hand it back with putPart). eof reports
// whether r ended.
func readHead(r io.Reader) (buf []byte, pooled, eof bool, err error) {
	buf = make([]byte, 0, 32<<10)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= memMax {
				return buf, pooled, false, nil
			}
			var grown []byte
			if 2*cap(buf) > smallMax {
				grown, pooled = getPart()[:len(buf)], true
			} else {
				grown = make([]byte, len(buf), 2*cap(buf))
			}
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, pooled, true, nil
		}
		if err != nil {
			if pooled {
				putPart(buf)
			}
			return nil, false, false, err
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
// is reported here and a full read costs one request (two for a blob
// stored as an upload and a manifest).
func (b *Blobs) Open(ctx context.Context, d tmpfs.Digest) (tmpfs.Blob, error) {
	o, err := b.openObject(ctx, d)
	if errors.Is(err, tmpfs.ErrNotFound) {
		blob, aerr := b.openAppended(ctx, d)
		if errors.Is(aerr, tmpfs.ErrNotFound) {
			return nil, b.missing(ctx, d, aerr)
		}
		return blob, aerr
	}
	if err != nil {
		return nil, err
	}
	return o, nil
}

// openObject opens a blob stored whole under its name: an ordinary object,
// or a manifest and the upload it names. It fails with ErrNotFound when
// there is no such object (the blob may be an appended one).
func (b *Blobs) openObject(ctx context.Context, d tmpfs.Digest) (*object, error) {
	o := newObject(ctx, b.c, blobKey(d), d.Short())
	info, err := o.get(minio.GetObjectOptions{})
	if err != nil {
		o.Close()
		return nil, err
	}
	o.size, o.etag, o.version = info.Size, info.ETag, info.ETag
	data := info.Metadata.Get(metaData)
	if data == "" {
		return o, nil
	}
	// A manifest: the bytes are in the upload it names, pinned to the
	// ETag the upload had when the manifest was written.
	o.drop()
	size, err := strconv.ParseInt(info.Metadata.Get(metaSize), 10, 64)
	if err != nil || size < 0 {
		o.Close()
		return nil, fmt.Errorf("%w: blob %s: its manifest has no valid size", tmpfs.ErrDigestMismatch, d)
	}
	o.key, o.size, o.etag = data, size, info.Metadata.Get(metaDataETag)
	o.version = "manifest:" + data + ":" + o.etag
	var opts minio.GetObjectOptions
	if o.etag != "" {
		opts.SetMatchETag(o.etag)
	}
	if _, err := o.get(opts); err != nil {
		switch {
		case errors.Is(err, tmpfs.ErrNotFound):
			o.lost = fmt.Errorf("%w: blob %s: the upload holding its bytes (%s) is gone", tmpfs.ErrDigestMismatch, d, data)
		case errors.Is(err, errReplaced):
			o.lost = fmt.Errorf("%w: blob %s: the upload holding its bytes (%s) was replaced", tmpfs.ErrDigestMismatch, d, data)
		default:
			o.Close()
			return nil, err
		}
		// The manifest names bytes that are not the ones written: the
		// blob is corrupt, and every read says so; fsck quarantines it by
		// its manifest.
	}
	return o, nil
}

// errReplaced means a GET pinned to an ETag found another object there.
var errReplaced = fmt.Errorf("%w; open it again", tmpfs.ErrReplaced)

// versionOf names the state of the object stored under a blob's name, as
// Open's Blob.Version does.
func versionOf(info minio.ObjectInfo) string {
	if data := info.Metadata.Get(metaData); data != "" {
		return "manifest:" + data + ":" + info.Metadata.Get(metaDataETag)
	}
	return info.ETag
}

// missing is the error for a blob with no object: ErrQuarantined if fsck
// moved it aside, else notFound.
func (b *Blobs) missing(ctx context.Context, d tmpfs.Digest, notFound error) error {
	sctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	if _, err := b.c.core.StatObject(sctx, b.c.bucket, quarantineKey(d), minio.StatObjectOptions{}); err == nil {
		return fmt.Errorf("%w: blob %s", tmpfs.ErrQuarantined, d)
	}
	return notFound
}

// Stat implements tmpfs.Blobs.
func (b *Blobs) Stat(ctx context.Context, d tmpfs.Digest) (int64, error) {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, blobKey(d), minio.StatObjectOptions{})
	if err = b.c.fail(ctx, "stat blob "+d.Short(), err); errors.Is(err, tmpfs.ErrNotFound) {
		n, aerr := b.statAppended(ctx, d)
		if errors.Is(aerr, tmpfs.ErrNotFound) {
			return 0, b.missing(ctx, d, aerr)
		}
		return n, aerr
	}
	if err != nil {
		return 0, err
	}
	if info.Metadata.Get(metaData) != "" {
		n, err := strconv.ParseInt(info.Metadata.Get(metaSize), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: blob %s: its manifest has no valid size", tmpfs.ErrDigestMismatch, d)
		}
		return n, nil
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
// replaced mid-read fails instead of splicing two versions together. A
// large blob read from its start is fetched as ranged GETs in parallel
// (parallel.go), pinned alike.
//
// Read, Seek and Close hold mu, and Close may be called while a Read on
// another goroutine waits for bytes: it cancels ctx first, which ends
// that Read (tmpfs.Reader closes its blob under its read-ahead so). The
// prefetch goroutines touch only their own segments and the fields Open
// set.
type object struct {
	// ctx is the Open call's, made cancellable by Close (abort). Read and
	// Seek take no context, yet a Read after a Seek must issue a request
	// on behalf of that same caller, who owns this reader for its
	// lifetime.
	ctx   context.Context
	abort context.CancelFunc
	mu    sync.Mutex
	c     *conn
	key   string
	short string
	size  int64
	etag  string // pinned on every GET after the first
	// version is Blob.Version: the ETag, or for a manifest the upload it
	// names and that upload's ETag.
	version string
	// lost, when set, fails every read: the manifest names bytes that
	// are gone.
	lost error

	body    io.ReadCloser      // nil when no stream is open
	cancel  context.CancelFunc // ends body's request
	bodyOff int64              // offset of body's next byte
	bodyEnd int64              // offset past body's last byte, if below size
	off     int64              // logical offset
	closed  bool

	pf     *prefetch // segments fetched ahead in parallel; nil when none
	par    parState  // whether a read from the start goes parallel
	probed time.Duration
}

// newObject returns an object of key read on behalf of ctx. Close it.
func newObject(ctx context.Context, c *conn, key, short string) *object {
	ctx, abort := context.WithCancel(ctx)
	return &object{ctx: ctx, abort: abort, c: c, key: key, short: short}
}

// noEnd is bodyEnd for a stream that runs to the object's end.
const noEnd = math.MaxInt64

// request starts a GET under ctx, a child of o.ctx, and returns its body
// and the function that ends it. The response must start within the
// store's timeout, retries included; after that the body streams for as
// long as ctx allows. It reads only what Open set, so prefetch goroutines
// may call it.
func (o *object) request(ctx context.Context, opts minio.GetObjectOptions) (io.ReadCloser, context.CancelFunc, minio.ObjectInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(o.c.timeout, cancel)
	body, info, _, err := o.c.core.GetObject(ctx, o.c.bucket, o.key, opts)
	if !timer.Stop() && o.ctx.Err() == nil {
		cancel()
		if body != nil {
			body.Close()
		}
		return nil, nil, minio.ObjectInfo{}, fmt.Errorf("%w: read blob %s: no response within %s", tmpfs.ErrUnavailable, o.short, o.c.timeout)
	}
	if err != nil {
		cancel()
		if er := minio.ToErrorResponse(err); er.StatusCode == http.StatusPreconditionFailed {
			return nil, nil, minio.ObjectInfo{}, fmt.Errorf("read blob %s: %w", o.short, errReplaced)
		}
		return nil, nil, minio.ObjectInfo{}, o.c.fail(o.ctx, "read blob "+o.short, err)
	}
	return body, cancel, info, nil
}

// get starts a GET at o.off and makes it the open stream, to the object's
// end unless the caller sets bodyEnd.
func (o *object) get(opts minio.GetObjectOptions) (minio.ObjectInfo, error) {
	body, cancel, info, err := o.request(o.ctx, opts)
	if err != nil {
		return info, err
	}
	o.body, o.cancel, o.bodyOff, o.bodyEnd = body, cancel, o.off, noEnd
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
func (o *object) Version() string { return o.version }

func (o *object) Read(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return 0, os.ErrClosed
	}
	if o.lost != nil {
		return 0, o.lost
	}
	if o.off >= o.size {
		return 0, io.EOF
	}
	if o.body != nil && (o.bodyOff != o.off || o.off >= o.bodyEnd) {
		o.drop()
	}
	if o.body == nil && o.pf != nil {
		if o.off == o.pf.pos() {
			return o.readAhead(p)
		}
		// A seek away: back to one stream.
		o.stopPrefetch()
	}
	switch {
	case o.par == parUnknown && o.off == 0:
		o.par = parOff
		if o.size >= parallelMin && o.etag != "" {
			o.par = parProbing
		}
	case o.par == parProbing && o.body == nil:
		o.par = parOff // a seek while probing
	}
	if o.body == nil {
		// Reopen at o.off, pinned to the version first opened, up to
		// where a prefetch takes over if one runs.
		end := o.size
		if o.pf != nil && o.off < o.pf.pos() {
			end = o.pf.pos()
		}
		var opts minio.GetObjectOptions
		if o.etag != "" {
			opts.SetMatchETag(o.etag)
		}
		if o.off > 0 || end < o.size {
			opts.SetRange(o.off, end-1)
		}
		if _, err := o.get(opts); err != nil {
			o.stopPrefetch()
			return 0, err
		}
		if end < o.size {
			o.bodyEnd = end
		}
	}
	if rest := o.bodyEnd - o.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	var t0 time.Time
	if o.par == parProbing {
		t0 = time.Now()
	}
	n, err := o.body.Read(p)
	if o.par == parProbing {
		o.probed += time.Since(t0)
	}
	o.off += int64(n)
	o.bodyOff = o.off
	switch {
	case o.off >= o.size && (err == nil || err == io.EOF):
		// Report the end with the last bytes, as files do, so a reader
		// that checks at the end (tmpfs.Reader) sees it at once.
		err = io.EOF
	case o.off >= o.bodyEnd && (err == nil || err == io.EOF):
		// This stream's range is done; the next Read moves on.
		err = nil
		o.drop()
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		o.drop()
		o.stopPrefetch()
		return n, o.c.fail(o.ctx, "read blob "+o.short, err)
	}
	if o.par == parProbing && o.off >= probeBytes {
		o.decide()
	}
	return n, err
}

func (o *object) Seek(offset int64, whence int) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return 0, os.ErrClosed
	}
	abs, err := tmpfs.SeekPosition(o.off, o.size, offset, whence)
	if err != nil {
		return 0, fmt.Errorf("blob %s: %w", o.short, err)
	}
	o.off = abs
	return abs, nil
}

// Close ends the stream and any prefetch, waiting for its goroutines. It
// is safe to call twice, and while a Read waits on another goroutine.
func (o *object) Close() error {
	o.abort() // first, without mu: it ends a Read in progress
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	o.drop()
	o.stopPrefetch()
	return nil
}
