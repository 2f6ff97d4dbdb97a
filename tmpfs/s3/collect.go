package s3

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

var _ tmpfs.Collectable = (*Blobs)(nil)

// A blob's stored time is its object's LastModified: the bytes' object,
// or a large blob's manifest, or an appended blob's tail object. A write
// that finds the blob stored already (Put, a manifest that exists, a tail
// that exists), and Touch, copy the object onto itself when its
// LastModified is older than tmpfs.FreshenAge, which sets it to now and
// keeps its bytes, metadata and ETag; so a replica's collection, which
// reads only the bucket, keeps a blob another replica has just found and
// is about to link. See docs/DECISIONS.md, "Deleting runs and collecting
// blobs".

// WalkStored implements tmpfs.Collectable with one listing of blobs and
// one of tail objects.
func (b *Blobs) WalkStored(ctx context.Context, fn func(tmpfs.StoredBlob) error) error {
	err := b.eachDigest(ctx, blobsPrefix, func(d tmpfs.Digest, obj minio.ObjectInfo) error {
		return fn(tmpfs.StoredBlob{Digest: d, Stored: obj.LastModified})
	})
	if err != nil {
		return err
	}
	return b.eachDigest(ctx, appendsPrefix, func(d tmpfs.Digest, obj minio.ObjectInfo) error {
		return fn(tmpfs.StoredBlob{Digest: d, Stored: obj.LastModified, Appended: true})
	})
}

// Needs implements tmpfs.Collectable: an appended blob reads its base.
func (b *Blobs) Needs(ctx context.Context, d tmpfs.Digest) ([]tmpfs.Digest, error) {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, appendKey(d), minio.StatObjectOptions{})
	if err := b.c.fail(ctx, "stat appended blob "+d.Short(), err); err != nil {
		return nil, err
	}
	st, err := parseTail(d, info)
	if err != nil {
		// A damaged tail names no base that can be trusted; fsck reports it.
		return nil, nil
	}
	if st.base.IsZero() || st.base == d {
		return nil, nil
	}
	return []tmpfs.Digest{st.base}, nil
}

// Remove implements tmpfs.Collectable: the blob's object (and, for a
// manifest, the upload it names) and its tail object, each if its
// LastModified is before the cutoff and this process has not stored or
// touched the blob since. A crash between a manifest and its upload
// leaves an upload no manifest names, which Sweep removes.
func (b *Blobs) Remove(ctx context.Context, d tmpfs.Digest, before time.Time) (bool, error) {
	recent, done := b.pins.Removing(d, before)
	defer done()
	if recent {
		return false, nil
	}
	removed := false
	for _, key := range []string{blobKey(d), appendKey(d)} {
		tctx, cancel := b.c.withTimeout(ctx)
		info, err := b.c.core.StatObject(tctx, b.c.bucket, key, minio.StatObjectOptions{})
		cancel()
		err = b.c.fail(ctx, "stat "+key, err)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return removed, err
		}
		if !info.LastModified.Before(before) {
			continue
		}
		rctx, cancel := b.c.withTimeout(ctx)
		err = b.c.core.RemoveObject(rctx, b.c.bucket, key, minio.RemoveObjectOptions{})
		cancel()
		if err := b.c.fail(ctx, "remove "+key, err); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return removed, err
		}
		removed = true
		if data := info.Metadata.Get(metaData); data != "" {
			b.removeUpload(ctx, data)
		}
	}
	return removed, nil
}

// Touch implements tmpfs.Collectable.
func (b *Blobs) Touch(ctx context.Context, d tmpfs.Digest) error {
	defer b.pins.Write()()
	if b.pins.Noted(d) {
		return nil
	}
	for _, key := range []string{blobKey(d), appendKey(d)} {
		tctx, cancel := b.c.withTimeout(ctx)
		info, err := b.c.core.StatObject(tctx, b.c.bucket, key, minio.StatObjectOptions{})
		cancel()
		err = b.c.fail(ctx, "stat "+key, err)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if err := b.freshen(ctx, key, info); err != nil {
			return err
		}
		b.pins.Note(d)
		return nil
	}
	return fmt.Errorf("%w: blob %s", tmpfs.ErrNotFound, d)
}

// freshen copies the object at key onto itself, with the same metadata,
// when its LastModified (info) is older than tmpfs.FreshenAge: its
// LastModified becomes now. Its bytes and ETag stay, so readers pinned to
// the ETag read on.
func (b *Blobs) freshen(ctx context.Context, key string, info minio.ObjectInfo) error {
	if time.Since(info.LastModified) < tmpfs.FreshenAge {
		return nil
	}
	md := map[string]string{"x-amz-metadata-directive": "REPLACE", "Content-Type": info.ContentType}
	for k, v := range info.Metadata {
		if strings.HasPrefix(strings.ToLower(k), "x-amz-meta-") && len(v) > 0 {
			md[k] = v[0]
		}
	}
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	_, err := b.c.core.CopyObject(tctx, b.c.bucket, key, b.c.bucket, key, md,
		minio.CopySrcOptions{Bucket: b.c.bucket, Object: key, MatchETag: info.ETag}, minio.PutObjectOptions{})
	return b.c.fail(ctx, "touch "+key, err)
}

// Tidy implements tmpfs.Collectable: removals leave nothing behind here
// but uploads of removed manifests that a crash kept, which Sweep finds.
func (b *Blobs) Tidy(context.Context, time.Time) (int, error) { return 0, nil }
