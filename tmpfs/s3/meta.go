package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/tmpfs"
)

// The Index keeps the store's records outside runs (tmpfs.Meta) as objects
// under meta/ in the bucket, read through on every call (no cache: a
// replica must see another's write at once). A record's version is its
// ETag; conditional writes use If-None-Match: * (create) and If-Match
// (replace), which MinIO and S3 evaluate atomically.
//
// A key's object is meta/<key>! : the "!" sorts below every byte a key may
// hold and below "/", so object names sort as their keys do (listings and
// StartAfter need no translation), and a key and a key below it ("a",
// "a/b") are never object and "directory" at once, which MinIO refuses.
var _ tmpfs.Meta = (*Index)(nil)

const metaPrefix = "meta/"

func metaObject(key string) string { return metaPrefix + key + "!" }

// GetMeta implements tmpfs.Meta.
func (x *Index) GetMeta(ctx context.Context, key string) ([]byte, string, error) {
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	body, info, _, err := x.c.core.GetObject(tctx, x.c.bucket, metaObject(key), minio.GetObjectOptions{})
	if err != nil {
		return nil, "", x.c.fail(ctx, "read meta "+key, err)
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, tmpfs.MaxMetaValue+1))
	if err != nil {
		return nil, "", x.c.fail(ctx, "read meta "+key, err)
	}
	return b, info.ETag, nil
}

// PutMeta implements tmpfs.Meta.
func (x *Index) PutMeta(ctx context.Context, key string, value []byte, cond tmpfs.Cond) (string, error) {
	opts := minio.PutObjectOptions{ContentType: "application/json", DisableContentSha256: true}
	switch {
	case cond.IfAbsent:
		opts.SetMatchETagExcept("*")
	case cond.IfVersion != "":
		opts.SetMatchETag(cond.IfVersion)
	}
	sum := sha256.Sum256(value)
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	info, err := x.c.core.PutObject(tctx, x.c.bucket, metaObject(key), bytes.NewReader(value), int64(len(value)), "", hex.EncodeToString(sum[:]), opts)
	if err != nil {
		if er := minio.ToErrorResponse(err); er.StatusCode == http.StatusPreconditionFailed || er.Code == "PreconditionFailed" ||
			er.Code == "ConditionalRequestConflict" || (er.StatusCode == http.StatusNotFound && cond.IfVersion != "") {
			return "", fmt.Errorf("%w: meta %s: %s", tmpfs.ErrPrecondition, key, er.Code)
		}
		return "", x.c.fail(ctx, "write meta "+key, err)
	}
	return info.ETag, nil
}

// DeleteMeta implements tmpfs.Meta. S3 deletes are idempotent, so the
// record is looked up first to answer ErrNotFound for a missing one.
func (x *Index) DeleteMeta(ctx context.Context, key string) error {
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	if _, err := x.c.core.StatObject(tctx, x.c.bucket, metaObject(key), minio.StatObjectOptions{}); err != nil {
		return x.c.fail(ctx, "stat meta "+key, err)
	}
	if err := x.c.core.RemoveObject(tctx, x.c.bucket, metaObject(key), minio.RemoveObjectOptions{}); err != nil {
		return x.c.fail(ctx, "delete meta "+key, err)
	}
	return nil
}

// ListMeta implements tmpfs.Meta with one paged listing (StartAfter), so
// a page costs one request however many records precede it.
func (x *Index) ListMeta(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	opts := minio.ListObjectsOptions{Prefix: metaPrefix + prefix, Recursive: true}
	if after != "" {
		opts.StartAfter = metaObject(after)
	}
	if limit > 0 && limit < 1000 {
		opts.MaxKeys = limit
	}
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	var keys []string
	for obj := range x.c.core.ListObjectsIter(tctx, x.c.bucket, opts) {
		if obj.Err != nil {
			return nil, x.c.fail(ctx, "list meta "+prefix, obj.Err)
		}
		k, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, metaPrefix), "!")
		if !ok || k <= after {
			continue
		}
		keys = append(keys, k)
		if limit > 0 && len(keys) == limit {
			break
		}
	}
	return keys, nil
}
