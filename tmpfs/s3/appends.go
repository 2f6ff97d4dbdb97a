package s3

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

// S3 has no append, so an appended blob (tmpfs.Appender) is stored as a
// compacted base plus a tail:
//
//	blobs/sha256/<base>   an ordinary blob: the file as it stood at the last compaction
//	appends/<hex>         the bytes after the base, with metadata naming the base,
//	                      the whole size, the sha256 midstate after the whole and
//	                      the appends since the base
//
// Blob <hex> is then the base's bytes followed by the tail object's. An
// append uploads one tail object holding every byte since the base (at most
// compactEvery appends' worth, or maxTail bytes), so its cost does not grow
// with the file; every compactEvery appends (or past maxTail) the whole
// file is uploaded as an ordinary blob and becomes the next base. A read
// is two GETs at most, streamed one after the other. Tail objects are
// immutable, like blobs, so every earlier version (a journal checkpoint)
// stays readable. See "Appending to a content-addressed store" in
// docs/DECISIONS.md.
const (
	compactEvery = 32
	maxTail      = 1 << 20
)

const appendsPrefix = "appends/"

func appendKey(d tmpfs.Digest) string { return appendsPrefix + d.String() }

// Metadata of a tail object.
const (
	metaBase     = "X-Amz-Meta-Base"
	metaBaseSize = "X-Amz-Meta-Base-Size"
	metaTailSize = "X-Amz-Meta-Size"
	metaState    = "X-Amz-Meta-State"
	metaCount    = "X-Amz-Meta-Count"
)

// chainState is a chain's last append, as this process made or read it.
type chainState struct {
	digest   tmpfs.Digest
	size     int64
	state    []byte       // sha256 midstate after size bytes
	base     tmpfs.Digest // zero: no base, the tail is the whole blob
	baseSize int64
	tail     []byte // the bytes after the base
	count    int    // appends since the base
}

type chains struct {
	mu sync.Mutex
	m  map[string]*chainState
}

var _ tmpfs.Appender = (*Blobs)(nil)

// Append implements tmpfs.Appender.
func (b *Blobs) Append(ctx context.Context, base tmpfs.Digest, baseSize int64, tail []byte, chain string) (tmpfs.Digest, int64, error) {
	if len(tail) == 0 {
		return tmpfs.Digest{}, 0, fmt.Errorf("%w: nothing to append", errors.ErrUnsupported)
	}
	defer b.pins.Write()()
	b.chains.mu.Lock()
	if b.chains.m == nil {
		b.chains.m = map[string]*chainState{}
	}
	st := b.chains.m[chain]
	b.chains.mu.Unlock()
	if st == nil || st.digest != base || st.size != baseSize {
		var err error
		if st, err = b.resumeChain(ctx, base, baseSize); err != nil {
			return tmpfs.Digest{}, 0, err
		}
	}
	h, err := tmpfs.ResumeHash(st.state)
	if err != nil {
		return tmpfs.Digest{}, 0, err
	}
	h.Write(tail)
	next := &chainState{digest: tmpfs.DigestFromHash(h), size: st.size + int64(len(tail)), base: st.base, baseSize: st.baseSize,
		tail: append(append(make([]byte, 0, len(st.tail)+len(tail)), st.tail...), tail...), count: st.count + 1}
	if next.state, err = tmpfs.HashState(h); err != nil {
		return tmpfs.Digest{}, 0, err
	}
	if next.count >= compactEvery || len(next.tail) >= maxTail {
		if err := b.compact(ctx, next); err != nil {
			return tmpfs.Digest{}, 0, err
		}
		next.base, next.baseSize, next.tail, next.count = next.digest, next.size, nil, 0
	}
	if err := b.putTail(ctx, next); err != nil {
		b.chains.mu.Lock()
		delete(b.chains.m, chain)
		b.chains.mu.Unlock()
		return tmpfs.Digest{}, 0, err
	}
	b.chains.mu.Lock()
	b.chains.m[chain] = next
	b.chains.mu.Unlock()
	return next.digest, next.size, nil
}

// compact uploads st's whole content as an ordinary blob. The bytes are
// hashed again on the way (the base is read from the bucket), so a base
// that does not match its digest never becomes part of a new one.
func (b *Blobs) compact(ctx context.Context, st *chainState) error {
	var src io.Reader = bytes.NewReader(st.tail)
	if !st.base.IsZero() {
		o, err := b.openObject(ctx, st.base)
		if err != nil {
			return err
		}
		defer o.Close()
		src = io.MultiReader(io.LimitReader(o, st.baseSize), src)
	}
	d, n, err := b.put(ctx, src, 0, func() func() { return func() {} })
	if err != nil {
		return err
	}
	if d != st.digest || n != st.size {
		return fmt.Errorf("%w: compacting blob %s: its base %s does not match its digest", tmpfs.ErrDigestMismatch, st.digest.Short(), st.base.Short())
	}
	return nil
}

// putTail stores st's tail object, unless one is stored already: tail
// objects never change once written (a reader may hold one open), and any
// stored representation of a digest is as good as another.
func (b *Blobs) putTail(ctx context.Context, st *chainState) error {
	base := ""
	if !st.base.IsZero() {
		base = st.base.String()
	}
	opts := minio.PutObjectOptions{
		ContentType: contentTypeBin,
		UserMetadata: map[string]string{
			"sha256": st.digest.String(), "base": base, "base-size": strconv.FormatInt(st.baseSize, 10),
			"size": strconv.FormatInt(st.size, 10), "state": base64.StdEncoding.EncodeToString(st.state),
			"count": strconv.Itoa(st.count),
		},
		DisableContentSha256: true,
	}
	opts.SetMatchETagExcept("*")
	b.pins.Note(st.digest)
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	_, err := b.c.core.PutObject(tctx, b.c.bucket, appendKey(st.digest), bytes.NewReader(st.tail), int64(len(st.tail)), "", "", opts)
	if er := minio.ToErrorResponse(err); er.StatusCode == http.StatusPreconditionFailed {
		sctx, cancel := b.c.withTimeout(ctx)
		info, err := b.c.core.StatObject(sctx, b.c.bucket, appendKey(st.digest), minio.StatObjectOptions{})
		cancel()
		if err != nil {
			return b.c.fail(ctx, "stat appended blob "+st.digest.Short(), err)
		}
		return b.freshen(ctx, appendKey(st.digest), info)
	}
	return b.c.fail(ctx, "upload appended blob "+st.digest.Short(), err)
}

// resumeChain reads where a chain continues from base: base's tail object
// (its base, tail bytes and midstate), or, for an ordinary blob, its
// bytes, hashed once to rebuild the midstate.
func (b *Blobs) resumeChain(ctx context.Context, base tmpfs.Digest, baseSize int64) (*chainState, error) {
	if base.IsZero() {
		h := tmpfs.NewHasher()
		state, err := tmpfs.HashState(h)
		return &chainState{state: state}, err
	}
	if st, err := b.readTail(ctx, base); err == nil && st.size == baseSize {
		return st, nil
	} else if err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return nil, err
	}
	o, err := b.openObject(ctx, base)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	h := tmpfs.NewHasher()
	n, err := io.Copy(h, o)
	if err != nil {
		return nil, err
	}
	if n != baseSize || tmpfs.DigestFromHash(h) != base {
		return nil, fmt.Errorf("%w: blob %s", tmpfs.ErrDigestMismatch, base)
	}
	state, err := tmpfs.HashState(h)
	if err != nil {
		return nil, err
	}
	return &chainState{digest: base, size: baseSize, state: state, base: base, baseSize: baseSize}, nil
}

// readTail reads d's tail object whole: its bytes are bounded by maxTail.
func (b *Blobs) readTail(ctx context.Context, d tmpfs.Digest) (*chainState, error) {
	o := newObject(ctx, b.c, appendKey(d), d.Short())
	defer o.Close()
	info, err := o.get(minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	o.size, o.etag = info.Size, info.ETag
	st, err := parseTail(d, info)
	if err != nil {
		return nil, err
	}
	if st.tail, err = io.ReadAll(io.LimitReader(o, maxTail+1)); err != nil {
		return nil, err
	}
	if int64(len(st.tail)) != st.size-st.baseSize {
		return nil, fmt.Errorf("%w: appended blob %s: tail object has %d bytes, want %d", tmpfs.ErrDigestMismatch, d.Short(), len(st.tail), st.size-st.baseSize)
	}
	return st, nil
}

// parseTail reads a tail object's metadata. A base equal to d itself
// marks a compaction: the blob is the ordinary blob of that name.
func parseTail(d tmpfs.Digest, info minio.ObjectInfo) (*chainState, error) {
	md := info.Metadata
	bad := func(what string) error {
		return fmt.Errorf("%w: appended blob %s: %s", tmpfs.ErrDigestMismatch, d.Short(), what)
	}
	if md.Get(metaSHA256) != d.String() {
		return nil, bad("tail object does not name its digest")
	}
	st := &chainState{digest: d}
	var err error
	if s := md.Get(metaBase); s != "" {
		if st.base, err = tmpfs.ParseDigest(s); err != nil {
			return nil, bad("bad base")
		}
	}
	st.baseSize, err = strconv.ParseInt(md.Get(metaBaseSize), 10, 64)
	if err != nil || st.baseSize < 0 || st.base.IsZero() && st.baseSize != 0 {
		return nil, bad("bad base size")
	}
	if st.size, err = strconv.ParseInt(md.Get(metaTailSize), 10, 64); err != nil || st.size != st.baseSize+info.Size {
		return nil, bad("bad size")
	}
	if st.state, err = base64.StdEncoding.DecodeString(md.Get(metaState)); err != nil {
		return nil, bad("bad midstate")
	}
	if st.count, err = strconv.Atoi(md.Get(metaCount)); err != nil {
		return nil, bad("bad count")
	}
	return st, nil
}

// openAppended opens an appended blob: its base (if any) and its tail
// object, read one after the other.
func (b *Blobs) openAppended(ctx context.Context, d tmpfs.Digest) (tmpfs.Blob, error) {
	tailObj := newObject(ctx, b.c, appendKey(d), d.Short())
	info, err := tailObj.get(minio.GetObjectOptions{})
	if err != nil {
		tailObj.Close()
		return nil, err
	}
	tailObj.size, tailObj.etag = info.Size, info.ETag
	st, err := parseTail(d, info)
	if err == nil && st.base == d {
		err = fmt.Errorf("%w: blob %s", tmpfs.ErrNotFound, d) // compacted, and the compacted blob is gone
	}
	if err != nil {
		tailObj.Close()
		return nil, err
	}
	if st.base.IsZero() {
		return tailObj, nil
	}
	baseObj, err := b.openObject(ctx, st.base)
	if errors.Is(err, tmpfs.ErrNotFound) {
		// Blobs are never deleted, so a base that is gone was quarantined
		// (or lost): the appended blob is corrupt, not missing.
		err = fmt.Errorf("%w: appended blob %s: its base %s is gone", tmpfs.ErrDigestMismatch, d.Short(), st.base.Short())
	}
	if err != nil {
		tailObj.Close()
		return nil, err
	}
	if baseObj.size != st.baseSize {
		tailObj.Close()
		baseObj.Close()
		return nil, fmt.Errorf("%w: appended blob %s: its base has %d bytes, want %d", tmpfs.ErrDigestMismatch, d.Short(), baseObj.size, st.baseSize)
	}
	return &catBlob{parts: []*object{baseObj, tailObj}, size: st.size, version: baseObj.version + "+" + info.ETag}, nil
}

// statAppended returns an appended blob's size.
func (b *Blobs) statAppended(ctx context.Context, d tmpfs.Digest) (int64, error) {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, appendKey(d), minio.StatObjectOptions{})
	if err != nil {
		return 0, b.c.fail(ctx, "stat blob "+d.Short(), err)
	}
	st, err := parseTail(d, info)
	if err == nil && st.base == d {
		err = fmt.Errorf("%w: blob %s", tmpfs.ErrNotFound, d)
	}
	if err != nil {
		return 0, err
	}
	return st.size, nil
}

// catBlob reads its parts one after the other, as one blob.
type catBlob struct {
	parts   []*object
	size    int64
	version string
	off     int64
}

func (c *catBlob) Size() int64     { return c.size }
func (c *catBlob) Version() string { return c.version }

func (c *catBlob) Read(p []byte) (int, error) {
	if c.off >= c.size {
		return 0, io.EOF
	}
	start := int64(0)
	for i, part := range c.parts {
		if c.off < start+part.size {
			if _, err := part.Seek(c.off-start, io.SeekStart); err != nil {
				return 0, err
			}
			n, err := part.Read(p)
			c.off += int64(n)
			if err == io.EOF {
				err = nil
				if i == len(c.parts)-1 || c.off >= c.size {
					err = io.EOF
				}
			}
			return n, err
		}
		start += part.size
	}
	return 0, io.EOF
}

func (c *catBlob) Seek(offset int64, whence int) (int64, error) {
	abs, err := tmpfs.SeekPosition(c.off, c.size, offset, whence)
	if err != nil {
		return 0, err
	}
	c.off = abs
	return abs, nil
}

func (c *catBlob) Close() error {
	for _, p := range c.parts {
		p.Close()
	}
	return nil
}
