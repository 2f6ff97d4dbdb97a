package s3_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
)

const benchSize = 64 << 20

var stamp atomic.Uint64

// benchData returns 64 MiB of random bytes. Each write stamps a fresh
// number from stamp into the first bytes, so none is deduplicated away, even
// across -count repetitions.
func benchData() []byte {
	data := make([]byte, benchSize)
	rand.NewChaCha8([32]byte{64}).Read(data)
	return data
}

// BenchmarkPut64MiB compares Blobs.Put (spool, hash, dedup check, signed
// single PUT) with minio-go's PutObject of the same bytes from memory on the
// same server, the baseline. Report the ratio of the two MB/s figures.
func BenchmarkPut64MiB(b *testing.B) {
	srv := miniotest.Shared(b)
	_, blobs := open(b, srv)
	raw := srv.Client()
	data := benchData()
	b.Run("raw-PutObject", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			i := stamp.Add(1)
			binary.BigEndian.PutUint64(data, i)
			key := fmt.Sprintf("raw/%d", i)
			if _, err := raw.PutObject(b.Context(), srv.Bucket, key, bytes.NewReader(data), benchSize,
				minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			remove(b, raw, srv.Bucket, key)
			b.StartTimer()
		}
	})
	b.Run("Blobs.Put", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			binary.BigEndian.PutUint64(data, stamp.Add(1))
			d, _, err := blobs.Put(b.Context(), bytes.NewReader(data), 0)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			remove(b, raw, srv.Bucket, "blobs/sha256/"+d.String())
			b.StartTimer()
		}
	})
}

// remove deletes what an iteration wrote, untimed, so every iteration
// meets the same amount of stored data and disk pressure.
func remove(b *testing.B, c *minio.Client, bucket, key string) {
	if err := c.RemoveObject(b.Context(), bucket, key, minio.RemoveObjectOptions{}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGet64MiB compares a verified read through tmpfs.Store.OpenBlob
// with minio-go's GetObject of the same object, the baseline.
func BenchmarkGet64MiB(b *testing.B) {
	srv := miniotest.Shared(b)
	s, blobs := open(b, srv)
	data := benchData()
	f, err := s.WriteBytes(b.Context(), runid.New(), "get.bin", data)
	if err != nil {
		b.Fatal(err)
	}
	raw := srv.Client()
	// A 64 MiB blob is a manifest naming the upload that holds its bytes:
	// the baseline reads that upload.
	key := "blobs/sha256/" + f.SHA256.String()
	info, err := raw.StatObject(b.Context(), srv.Bucket, key, minio.StatObjectOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if data := info.Metadata.Get("X-Amz-Meta-Triad-Data"); data != "" {
		key = data
	}
	buf := make([]byte, 1<<20)
	b.Run("raw-GetObject", func(b *testing.B) {
		drain(b, buf, func() (io.ReadCloser, error) {
			return raw.GetObject(b.Context(), srv.Bucket, key, minio.GetObjectOptions{})
		})
	})
	b.Run("Blobs.Open", func(b *testing.B) {
		// The adapter alone, without the digest check.
		drain(b, buf, func() (io.ReadCloser, error) { return blobs.Open(b.Context(), f.SHA256) })
	})
	b.Run("Store.OpenBlob", func(b *testing.B) {
		drain(b, buf, func() (io.ReadCloser, error) { return s.OpenBlob(b.Context(), f.SHA256) })
	})
}

// drain times one whole read of a benchSize blob per iteration: open, read
// through buf, check the length, close.
func drain(b *testing.B, buf []byte, open func() (io.ReadCloser, error)) {
	b.SetBytes(benchSize)
	for b.Loop() {
		r, err := open()
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, buf); err != nil || n != benchSize {
			b.Fatalf("got %d, %v", n, err)
		}
		r.Close()
	}
}

// BenchmarkGet64MiBCappedConn is BenchmarkGet64MiB through a proxy that
// sends each connection at 128 MiB/s, as S3 serves one connection: raw
// GetObject (one connection, the baseline) against a verified read
// through Store.OpenBlob, whose probe finds the stream slow and goes
// parallel, and the same read kept to one stream. Report the ratios of the
// MB/s figures.
func BenchmarkGet64MiBCappedConn(b *testing.B) {
	srv := miniotest.Shared(b)
	s, _ := open(b, srv)
	data := benchData()
	f, err := s.WriteBytes(b.Context(), runid.New(), "get.bin", data)
	if err != nil {
		b.Fatal(err)
	}
	cfg := config(b, srv)
	cfg.Endpoint = throttle(b, srv.Endpoint, 128<<20)
	cb, cx, err := s3.New(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cb.Close(); cx.Close() })
	capped := tmpfs.New(cb, cx, nil)
	raw, err := minio.New(strings.TrimPrefix(cfg.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		b.Fatal(err)
	}
	info, err := raw.StatObject(b.Context(), srv.Bucket, "blobs/sha256/"+f.SHA256.String(), minio.StatObjectOptions{})
	if err != nil {
		b.Fatal(err)
	}
	key := info.Metadata.Get("X-Amz-Meta-Triad-Data")
	buf := make([]byte, 1<<20)
	b.Run("raw-GetObject", func(b *testing.B) {
		drain(b, buf, func() (io.ReadCloser, error) {
			return raw.GetObject(b.Context(), srv.Bucket, key, minio.GetObjectOptions{})
		})
	})
	read := func(b *testing.B) {
		drain(b, buf, func() (io.ReadCloser, error) { return capped.OpenBlob(b.Context(), f.SHA256) })
	}
	b.Run("Store.OpenBlob", read)
	b.Run("Store.OpenBlob-one-stream", func(b *testing.B) {
		defer s3.ForceParallel(false)()
		read(b)
	})
}
