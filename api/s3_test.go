package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
	"github.com/triadhq/triad/wire"
)

func init() {
	extraBackends = func(t *testing.T) []backend { return []backend{s3Backend(t, miniotest.Shared(t))} }
}

// s3Backend opens stores over one bucket; each open is a fresh client with
// an empty local spool directory, as after a restart on a new machine.
func s3Backend(t *testing.T, srv *miniotest.Server) backend {
	return backend{
		name: "s3",
		open: func(t *testing.T) *tmpfs.Store {
			b, x, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket,
				AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { x.Close(); b.Close() })
			return tmpfs.New(b, x, nil)
		},
		blobCount: func(t *testing.T) int {
			n := 0
			for o := range srv.Client().ListObjects(t.Context(), srv.Bucket, minio.ListObjectsOptions{Prefix: "blobs/sha256/", Recursive: true}) {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				n++
			}
			return n
		},
		stop:    srv.Stop,
		start:   srv.Start,
		corrupt: func(t *testing.T, d tmpfs.Digest) { srv.CorruptBlob(t, d.String()) },
	}
}

// With MinIO down, writes get 503 store_unavailable with a suggestion, the
// server stays up, and after MinIO returns everything written before is
// intact.
func TestS3Outage(t *testing.T) {
	srv := miniotest.New(t)
	b := s3Backend(t, srv)
	c := newServer(t, b.open(t), orchestrator.Limits{})
	const run = "r-outage"
	before := c.write(run, "kept.csv", "a,b\n1,2\n")
	c.do(http.MethodPut, "/tmp/files/big.bin", run, strings.NewReader(strings.Repeat("x", 1<<20)))

	b.stop()
	for name, a := range map[string]answer{
		"write":   c.post("/tmp/write", run, map[string]string{"path": "new.txt", "text": "x"}),
		"put":     c.do(http.MethodPut, "/tmp/files/new.bin", run, strings.NewReader("x")),
		"healthz": c.do(http.MethodGet, "/healthz", "", nil),
	} {
		if a.status != 503 || a.errKind(t) != "store_unavailable" {
			t.Errorf("%s with MinIO down: got %d %s, want 503 store_unavailable", name, a.status, a.body)
		}
	}
	// The server itself still answers.
	if a := c.do(http.MethodGet, "/version", "", nil); a.status != 200 {
		t.Fatalf("version with MinIO down: %d", a.status)
	}

	b.start()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if a := c.do(http.MethodGet, "/healthz", "", nil); a.status == 200 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var rd wire.ReadResponse
	a := c.do(http.MethodGet, "/tmp/read?path=kept.csv", run, nil)
	a.json(t, &rd)
	if a.status != 200 || rd.Text == nil || *rd.Text != "a,b\n1,2\n" || rd.SHA256 != before.SHA256 {
		t.Fatalf("after MinIO returned: got %d %s", a.status, a.body)
	}
	if a := c.do(http.MethodGet, "/tmp/files/big.bin", run, nil); a.status != 200 || len(a.body) != 1<<20 {
		t.Fatalf("streamed file after MinIO returned: %d, %d bytes", a.status, len(a.body))
	}
	// And a fresh triad over the bucket, with an empty local directory,
	// still lists every file.
	files := newServer(t, b.open(t), orchestrator.Limits{}).list(run, "")
	if len(files) != 2 {
		t.Fatalf("fresh server after outage: got %+v, want kept.csv and big.bin", files)
	}
}
