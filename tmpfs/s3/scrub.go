package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

var _ tmpfs.RunLister = (*Index)(nil)

const (
	blobsPrefix      = "blobs/sha256/"
	quarantinePrefix = "quarantine/sha256/"
)

func quarantineKey(d tmpfs.Digest) string { return quarantinePrefix + d.String() }

// Walk implements tmpfs.Scrubbable with one listing of blobs/sha256/. The
// size it reports is the object's, which for a manifest is 0; Open tells
// the blob's.
func (b *Blobs) Walk(ctx context.Context, fn func(d tmpfs.Digest, size int64) error) error {
	return b.eachDigest(ctx, blobsPrefix, func(d tmpfs.Digest, obj minio.ObjectInfo) error { return fn(d, obj.Size) })
}

// eachDigest calls fn for each object prefix<hex> named by a sha256, in one
// listing; other keys are skipped. fn's errors are returned as they are.
func (b *Blobs) eachDigest(ctx context.Context, prefix string, fn func(d tmpfs.Digest, obj minio.ObjectInfo) error) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for obj := range b.c.core.ListObjectsIter(lctx, b.c.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return b.c.fail(ctx, "list "+prefix, obj.Err)
		}
		name := strings.TrimPrefix(obj.Key, prefix)
		d, err := tmpfs.ParseDigest(name)
		if err != nil || d.String() != name {
			continue
		}
		if err := fn(d, obj); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Quarantine implements tmpfs.Scrubbable: the object under the blob's
// name (the bytes, or the manifest naming them) is copied to
// quarantine/sha256/<hex>, with the report beside it, and deleted. The
// copy is pinned to the ETag that was checked. A manifest's upload stays
// where it is, named by the quarantined manifest, for the operator to
// inspect.
func (b *Blobs) Quarantine(ctx context.Context, d tmpfs.Digest, ver string, report []byte) error {
	key := blobKey(d)
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		err = b.c.fail(ctx, "stat blob "+d.Short(), err)
		if errors.Is(err, tmpfs.ErrNotFound) {
			return b.missing(ctx, d, err)
		}
		return err
	}
	if versionOf(info) != ver {
		return fmt.Errorf("%w: blob %s was replaced while it was checked", tmpfs.ErrPrecondition, d)
	}
	return b.quarantine(ctx, d, key, info.ETag, report)
}

// quarantine moves the object under key, which holds or names blob d, to
// quarantine/sha256/<hex>, after writing report beside it. The copy is
// pinned to etag, the version that was checked.
func (b *Blobs) quarantine(ctx context.Context, d tmpfs.Digest, key, etag string, report []byte) error {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	sum := sha256.Sum256(report)
	_, err := b.c.core.PutObject(tctx, b.c.bucket, quarantineKey(d)+".json", bytes.NewReader(report), int64(len(report)), "",
		hex.EncodeToString(sum[:]), minio.PutObjectOptions{ContentType: "application/json", DisableContentSha256: true})
	if err != nil {
		return b.c.fail(ctx, "write quarantine report of "+d.Short(), err)
	}
	// The object is copied whole: a manifest is empty, a tail object is
	// at most maxTail bytes, and only blobs written before manifests
	// existed carry their bytes (the copy of a large one takes as long as
	// it takes; quarantine is rare).
	src := minio.CopySrcOptions{Bucket: b.c.bucket, Object: key, MatchETag: etag}
	dst := minio.CopyDestOptions{Bucket: b.c.bucket, Object: quarantineKey(d)}
	if _, err := b.c.core.Client.CopyObject(ctx, dst, src); err != nil {
		if er := minio.ToErrorResponse(err); er.Code == "PreconditionFailed" {
			return fmt.Errorf("%w: blob %s was replaced while it was checked", tmpfs.ErrPrecondition, d)
		}
		return b.c.fail(ctx, "copy blob "+d.Short()+" to quarantine", err)
	}
	if err := b.c.core.RemoveObject(tctx, b.c.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return b.c.fail(ctx, "remove quarantined blob "+d.Short(), err)
	}
	return nil
}

var _ tmpfs.AppendScrubbable = (*Blobs)(nil)

// WalkAppended implements tmpfs.AppendScrubbable with one listing of
// appends/. Each tail object is a group of its own: its base (an ordinary
// blob, which Walk lists and fsck hashes once a pass however many tails
// share it) followed by the tail's bytes, read whole here since a tail
// holds at most maxTail. A tail that marks a compaction is left to Walk,
// and one whose metadata does not parse is a damaged member.
func (b *Blobs) WalkAppended(ctx context.Context, fn func(g tmpfs.AppendedGroup) error) error {
	return b.eachDigest(ctx, appendsPrefix, func(d tmpfs.Digest, _ minio.ObjectInfo) error {
		st, err := b.readTail(ctx, d)
		var g tmpfs.AppendedGroup
		switch {
		case errors.Is(err, tmpfs.ErrNotFound):
			return nil // quarantined since the listing
		case errors.Is(err, tmpfs.ErrDigestMismatch):
			g.Members = []tmpfs.AppendedBlob{{Digest: d, Damaged: err.Error()}}
		case err != nil:
			return err
		case st.base == d:
			return nil // a compaction: the ordinary blob is Walk's
		default:
			tail := st.tail
			g = tmpfs.AppendedGroup{
				Base: st.base, BaseSize: st.baseSize,
				Members: []tmpfs.AppendedBlob{{Digest: d, Size: st.size, State: st.state}},
				Open: func(context.Context, tmpfs.AppendedBlob) (io.ReadCloser, error) {
					return io.NopCloser(bytes.NewReader(tail)), nil
				},
			}
		}
		return fn(g)
	})
}

// QuarantineAppended implements tmpfs.AppendScrubbable: the tail object
// is copied to quarantine/sha256/<hex>, beside its report, and deleted.
// Its base is an ordinary blob, checked and quarantined on its own.
func (b *Blobs) QuarantineAppended(ctx context.Context, d tmpfs.Digest, report []byte) error {
	tctx, cancel := b.c.withTimeout(ctx)
	defer cancel()
	info, err := b.c.core.StatObject(tctx, b.c.bucket, appendKey(d), minio.StatObjectOptions{})
	if err != nil {
		err = b.c.fail(ctx, "stat appended blob "+d.Short(), err)
		if errors.Is(err, tmpfs.ErrNotFound) {
			return b.missing(ctx, d, err)
		}
		return err
	}
	return b.quarantine(ctx, d, appendKey(d), info.ETag, report)
}

// Sweep implements tmpfs.Sweeper. It aborts multipart uploads under
// blobs/uploads/ started more than age ago (a process that crashed
// mid-upload), and removes completed uploads older than age that no
// manifest names (a crash between an upload and its manifest, or a
// duplicate whose removal failed). Manifests are read only when there is
// an old upload to judge.
func (b *Blobs) Sweep(ctx context.Context, age time.Duration) (int, error) {
	cutoff := time.Now().Add(-age)
	n := 0
	for u := range b.c.core.Client.ListIncompleteUploads(ctx, b.c.bucket, uploadsPrefix, true) {
		if u.Err != nil {
			return n, b.c.fail(ctx, "list incomplete uploads", u.Err)
		}
		if u.Initiated.Before(cutoff) {
			if err := b.c.core.AbortMultipartUpload(ctx, b.c.bucket, u.Key, u.UploadID); err != nil {
				return n, b.c.fail(ctx, "abort upload "+u.Key, err)
			}
			n++
		}
	}
	var old []string
	for obj := range b.c.core.ListObjectsIter(ctx, b.c.bucket, minio.ListObjectsOptions{Prefix: uploadsPrefix, Recursive: true}) {
		if obj.Err != nil {
			return n, b.c.fail(ctx, "list uploads", obj.Err)
		}
		if obj.LastModified.Before(cutoff) {
			old = append(old, obj.Key)
		}
	}
	if len(old) == 0 {
		return n, nil
	}
	named := map[string]bool{}
	for _, prefix := range []string{blobsPrefix, quarantinePrefix} {
		for obj := range b.c.core.ListObjectsIter(ctx, b.c.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if obj.Err != nil {
				return n, b.c.fail(ctx, "list blobs", obj.Err)
			}
			if obj.Size != 0 {
				continue // bytes, not a manifest
			}
			tctx, cancel := b.c.withTimeout(ctx)
			info, err := b.c.core.StatObject(tctx, b.c.bucket, obj.Key, minio.StatObjectOptions{})
			cancel()
			if err != nil {
				if errors.Is(b.c.fail(ctx, "", err), tmpfs.ErrNotFound) {
					continue
				}
				return n, b.c.fail(ctx, "stat "+obj.Key, err)
			}
			if data := info.Metadata.Get(metaData); data != "" {
				named[data] = true
			}
		}
	}
	for _, key := range old {
		if named[key] {
			continue
		}
		if err := b.c.core.RemoveObject(ctx, b.c.bucket, key, minio.RemoveObjectOptions{}); err != nil {
			return n, b.c.fail(ctx, "remove upload "+key, err)
		}
		b.c.log.InfoContext(ctx, "removed an upload no blob names", "key", key)
		n++
	}
	return n, nil
}

// Runs implements tmpfs.RunLister with a delimited listing of runs/.
func (x *Index) Runs(ctx context.Context) ([]runid.ID, error) {
	var out []runid.ID
	for obj := range x.c.core.ListObjectsIter(ctx, x.c.bucket, minio.ListObjectsOptions{Prefix: "runs/"}) {
		if obj.Err != nil {
			return nil, x.c.fail(ctx, "list runs", obj.Err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(obj.Key, "runs/"), "/")
		if id, err := runid.Parse(name); err == nil {
			out = append(out, id)
		}
	}
	return out, nil
}
