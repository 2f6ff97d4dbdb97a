package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

// A body too big to keep in memory is uploaded as it arrives, as a
// multipart upload under blobs/uploads/<id>, while it is hashed; once its
// sha256 is known, a manifest is written under blobs/sha256/<hex>: an
// empty object whose metadata names the upload. So the bytes cross the
// network once and are never copied server-side (S3 has no rename, and a
// CopyObject of a large object rewrites every byte). See
// docs/DECISIONS.md, "S3 layout: small blobs whole, large ones as an
// upload and a manifest".
const (
	uploadsPrefix = "blobs/uploads/"
	// Manifest metadata (besides metaSHA256): the blob's size, the upload
	// holding its bytes and that upload's ETag, which every read pins.
	metaSize     = "X-Amz-Meta-Triad-Size"
	metaData     = "X-Amz-Meta-Triad-Data"
	metaDataETag = "X-Amz-Meta-Triad-Data-Etag"

	maxParts    = 10000 // S3's limit per multipart upload
	partBuffers = 2     // one filling while the other uploads
)

// partSizeFor picks the part size for a body of at most limit bytes (0:
// unbounded, which then allows 10000 parts of memMax, about 80 GiB).
func partSizeFor(limit int64) int64 {
	ps := int64(memMax)
	for limit > 0 && ps*maxParts < limit {
		ps *= 2
	}
	return ps
}

// part is one buffer on its way through hashing and upload; it goes back
// to the pool when both are done with it.
type part struct {
	buf  []byte
	n    int
	num  int
	refs atomic.Int32
}

// castagnoli is the CRC32C table, built once.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// putLarge stores a body whose first memMax bytes are head, a pooled part
// buffer it takes over (more bytes follow in src): parts go up as they
// fill, hashed in order on a goroutine of their own, with at most
// partBuffers buffers alive.
func (b *Blobs) putLarge(ctx context.Context, head []byte, src io.Reader, limit int64, gate func() func()) (tmpfs.Digest, int64, error) {
	ps := partSizeFor(limit)
	upKey := uploadsPrefix + time.Now().UTC().Format("20060102T150405Z") + "-" + randomHex(8)
	octx, cancel := b.c.withTimeout(ctx)
	uploadID, err := b.c.core.NewMultipartUpload(octx, b.c.bucket, upKey, minio.PutObjectOptions{
		ContentType:  contentTypeBin,
		UserMetadata: map[string]string{"x-amz-checksum-algorithm": "CRC32C"},
	})
	cancel()
	if err != nil {
		return tmpfs.Digest{}, 0, b.c.fail(ctx, "start upload", err)
	}
	done := false
	defer func() {
		if !done {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.c.timeout)
			defer cancel()
			if err := b.c.core.AbortMultipartUpload(actx, b.c.bucket, upKey, uploadID); err != nil {
				b.c.log.WarnContext(ctx, "could not abort a failed upload; the next fsck sweeps it", "key", upKey, "err", err)
			}
		}
	}()

	uctx, stop := context.WithCancel(ctx)
	defer stop()
	pool := make(chan []byte, partBuffers)
	newBuf := func() []byte {
		if ps == memMax {
			return getPart()
		}
		return make([]byte, ps)
	}
	firstBuf := head[:cap(head)]
	if int64(cap(head)) < ps {
		firstBuf = newBuf()
		copy(firstBuf, head)
		putPart(head)
	}
	pool <- firstBuf
	for range partBuffers - 1 {
		pool <- newBuf()
	}
	// Every buffer is back in pool once the uploads and the hashing are
	// done; then they go back to partPool for the next upload.
	defer func() {
		for range partBuffers {
			if b := <-pool; int64(cap(b)) == memMax {
				putPart(b)
			}
		}
	}()
	release := func(p *part) {
		if p.refs.Add(-1) == 0 {
			pool <- p.buf
		}
	}
	var (
		mu        sync.Mutex
		firstErr  error
		completed []minio.CompletePart
		wg        sync.WaitGroup
	)
	failed := make(chan struct{})
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
			close(failed)
			stop()
		}
	}
	hashq := make(chan *part, partBuffers)
	sum := make(chan tmpfs.Digest, 1)
	go func() {
		h := tmpfs.NewHasher()
		for p := range hashq {
			h.Write(p.buf[:p.n])
			release(p)
		}
		sum <- tmpfs.DigestFromHash(h)
	}()

	var total int64
	first := true
	for num := 1; ; num++ {
		var buf []byte
		select {
		case buf = <-pool:
		case <-failed:
		}
		if buf == nil {
			break
		}
		var n int
		var rerr error
		if first {
			// head is the first memMax bytes; a part of ps > memMax
			// takes more from src.
			n = len(head)
			if int64(n) < ps {
				var m int
				m, rerr = io.ReadFull(src, buf[n:ps])
				n += m
			}
			first = false
		} else {
			n, rerr = io.ReadFull(src, buf[:ps])
		}
		if rerr == io.ErrUnexpectedEOF {
			rerr = io.EOF
		}
		if rerr != nil && rerr != io.EOF {
			pool <- buf
			fail(&bodyError{rerr})
			break
		}
		total += int64(n)
		if limit > 0 && total > limit {
			pool <- buf
			fail(fmt.Errorf("%w: more than %d bytes", tmpfs.ErrTooLarge, limit))
			break
		}
		if n == 0 {
			pool <- buf
			break
		}
		if num > maxParts {
			pool <- buf
			fail(fmt.Errorf("%w: more than %d parts of %d bytes", tmpfs.ErrTooLarge, maxParts, ps))
			break
		}
		p := &part{buf: buf, n: n, num: num}
		p.refs.Store(2)
		hashq <- p
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release(p)
			cp, err := b.uploadPart(uctx, upKey, uploadID, p)
			if err != nil {
				fail(err)
				return
			}
			mu.Lock()
			completed = append(completed, cp)
			mu.Unlock()
		}()
		if rerr == io.EOF {
			break
		}
	}
	close(hashq)
	wg.Wait()
	d := <-sum
	if firstErr != nil {
		var be *bodyError
		switch {
		case errors.As(firstErr, &be):
			return tmpfs.Digest{}, 0, fmt.Errorf("read body: %w", be.err)
		case errors.Is(firstErr, tmpfs.ErrTooLarge):
			return tmpfs.Digest{}, 0, firstErr
		}
		return tmpfs.Digest{}, 0, b.c.fail(ctx, "upload blob", firstErr)
	}

	sort.Slice(completed, func(i, j int) bool { return completed[i].PartNumber < completed[j].PartNumber })
	cctx, cancel := b.c.withTimeout(ctx)
	info, err := b.c.core.CompleteMultipartUpload(cctx, b.c.bucket, upKey, uploadID, completed, minio.PutObjectOptions{})
	cancel()
	if err != nil {
		return tmpfs.Digest{}, 0, b.c.fail(ctx, "complete upload of blob "+d.Short(), err)
	}
	done = true
	unlock := gate()
	err = b.name(ctx, d, total, upKey, info.ETag)
	unlock()
	if err != nil {
		b.removeUpload(ctx, upKey)
		return tmpfs.Digest{}, 0, err
	}
	b.c.log.DebugContext(ctx, "blob uploaded", "sha256", d.String(), "size", total, "upload", upKey, "parts", len(completed))
	return d, total, nil
}

// bodyError is a failure to read the caller's body, as opposed to the
// store's: it is the caller's to see, untranslated.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return e.err.Error() }

// uploadPart sends one part with its CRC32C, which the service checks, so
// bytes damaged on the way are refused (the sha256 is checked on every
// read). The payload is not signed by hash: that would hash it twice more.
func (b *Blobs) uploadPart(ctx context.Context, key, uploadID string, p *part) (minio.CompletePart, error) {
	crc := crc32.Checksum(p.buf[:p.n], castagnoli)
	sum := base64.StdEncoding.EncodeToString([]byte{byte(crc >> 24), byte(crc >> 16), byte(crc >> 8), byte(crc)})
	hdr := http.Header{}
	hdr.Set("x-amz-checksum-crc32c", sum)
	hdr.Set("x-amz-checksum-algorithm", "CRC32C")
	op, err := b.c.core.PutObjectPart(ctx, b.c.bucket, key, uploadID, p.num, bytes.NewReader(p.buf[:p.n]), int64(p.n),
		minio.PutObjectPartOptions{DisableContentSha256: true, CustomHeader: hdr})
	if err != nil {
		return minio.CompletePart{}, err
	}
	return minio.CompletePart{PartNumber: p.num, ETag: op.ETag, ChecksumCRC32C: op.ChecksumCRC32C}, nil
}

// name makes blob d (size bytes, held by the upload at upKey) reachable by
// its sha256: a manifest under blobs/sha256/<hex>, unless a good copy is
// there already, in which case the upload is removed.
func (b *Blobs) name(ctx context.Context, d tmpfs.Digest, size int64, upKey, upETag string) error {
	key := blobKey(d)
	b.pins.Note(d)
	sctx, cancel := b.c.withTimeout(ctx)
	info, err := b.c.core.StatObject(sctx, b.c.bucket, key, minio.StatObjectOptions{})
	cancel()
	cond := minio.PutObjectOptions{}
	switch err := b.c.fail(ctx, "stat blob "+d.Short(), err); {
	case err == nil && b.intact(ctx, info, d, size):
		b.c.log.DebugContext(ctx, "blob already stored", "sha256", d.String(), "size", size)
		b.removeUpload(ctx, upKey)
		return b.freshen(ctx, key, info)
	case err == nil:
		b.c.log.WarnContext(ctx, "replacing a stored blob that was not written by this store, or whose bytes are gone",
			"sha256", d.String(), "stored_size", info.Size, "size", size)
	case errors.Is(err, tmpfs.ErrNotFound):
		cond.SetMatchETagExcept("*") // lose to a concurrent writer of the same bytes
	default:
		return err
	}
	cond.ContentType = contentTypeBin
	cond.DisableContentSha256 = true
	cond.UserMetadata = map[string]string{
		"sha256":          d.String(),
		"triad-size":      strconv.FormatInt(size, 10),
		"triad-data":      upKey,
		"triad-data-etag": upETag,
	}
	pctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	_, err = b.c.core.PutObject(pctx, b.c.bucket, key, bytes.NewReader(nil), 0, "", emptySHA256, cond)
	if er := minio.ToErrorResponse(err); err != nil && (er.StatusCode == http.StatusPreconditionFailed || er.Code == "PreconditionFailed") {
		b.removeUpload(ctx, upKey)
		return nil
	}
	if err != nil {
		return b.c.fail(ctx, "name blob "+d.Short(), err)
	}
	return nil
}

// emptySHA256 is the sha256 of no bytes: a manifest's payload hash.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// intact reports whether the object stored under blob d's name was
// written by this store for d with this size, and, for a manifest, that
// the upload it names is still there.
func (b *Blobs) intact(ctx context.Context, info minio.ObjectInfo, d tmpfs.Digest, size int64) bool {
	if info.Metadata.Get(metaSHA256) != d.String() {
		return false
	}
	data := info.Metadata.Get(metaData)
	if data == "" {
		return info.Size == size
	}
	if info.Metadata.Get(metaSize) != strconv.FormatInt(size, 10) {
		return false
	}
	sctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	di, err := b.c.core.StatObject(sctx, b.c.bucket, data, minio.StatObjectOptions{})
	return err == nil && di.Size == size && di.ETag == info.Metadata.Get(metaDataETag)
}

// removeUpload deletes an upload no blob names. A failure leaves garbage
// for Sweep, never a wrong blob.
func (b *Blobs) removeUpload(ctx context.Context, key string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.c.timeout)
	defer cancel()
	if err := b.c.core.RemoveObject(rctx, b.c.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		b.c.log.WarnContext(ctx, "could not remove an unneeded upload; the next fsck sweeps it", "key", key, "err", err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
