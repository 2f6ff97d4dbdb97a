package miniotest_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/miniotest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	miniotest.StopShared()
	os.Exit(code)
}

// A dedicated server keeps its data across Stop and Start, and refuses
// connections while stopped.
func TestStopStartKeepsData(t *testing.T) {
	s := miniotest.New(t)
	ctx := t.Context()
	c := s.Client()
	if err := c.MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutObject(ctx, s.Bucket, "k", bytes.NewReader([]byte("kept")), 4, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if _, err := c.BucketExists(ctx, s.Bucket); err == nil {
		t.Fatal("BucketExists on a stopped server: got no error, want one")
	}
	s.Start()
	o, err := s.Client().GetObject(ctx, s.Bucket, "k", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	b, err := io.ReadAll(o)
	if err != nil || string(b) != "kept" {
		t.Fatalf("after restart: got %q, %v, want kept", b, err)
	}
}

// A frozen server holds connections without answering; a thawed one answers.
func TestFreezeThaw(t *testing.T) {
	s := miniotest.New(t)
	client := &http.Client{Timeout: time.Second}
	live := func() error {
		res, err := client.Get(s.Endpoint + "/minio/health/live")
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	s.Freeze()
	if err := live(); err == nil {
		t.Fatal("frozen server answered, want a timeout")
	}
	s.Thaw()
	if err := live(); err != nil {
		t.Fatalf("thawed server: %v", err)
	}
}

// Shared hands every caller the same server and a bucket of its own.
func TestShared(t *testing.T) {
	a, b := miniotest.Shared(t), miniotest.Shared(t)
	if a.Endpoint != b.Endpoint {
		t.Fatalf("got endpoints %s and %s, want one server", a.Endpoint, b.Endpoint)
	}
	if a.Bucket == b.Bucket {
		t.Fatalf("got bucket %s twice, want a fresh one per call", a.Bucket)
	}
	for _, s := range []*miniotest.Server{a, b} {
		if err := s.Client().MakeBucket(t.Context(), s.Bucket, minio.MakeBucketOptions{}); err != nil {
			t.Fatalf("make bucket %s: %v", s.Bucket, err)
		}
	}
}

// scripts/minio.sh and this package pin the same MinIO version, so the
// binary the script caches is the one the helper finds.
func TestScriptPinsSameVersion(t *testing.T) {
	b, err := os.ReadFile("../../scripts/minio.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MINIO_VERSION=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("scripts/minio.sh sets no MINIO_VERSION")
	}
	if got := string(m[1]); got != miniotest.Version {
		t.Fatalf("got %s in scripts/minio.sh, want %s (miniotest.Version)", got, miniotest.Version)
	}
}
