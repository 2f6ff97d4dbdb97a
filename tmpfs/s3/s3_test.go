package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
	"github.com/triadhq/triad/tmpfs/tmpfstest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	miniotest.StopShared()
	os.Exit(code)
}

func config(t testing.TB, srv *miniotest.Server) s3.Config {
	return s3.Config{
		Endpoint:  srv.Endpoint,
		Bucket:    srv.Bucket,
		AccessKey: srv.AccessKey,
		SecretKey: srv.SecretKey,
	}
}

// open builds a Store as a freshly started triad would: a new client, an
// empty cache and a new, empty spool directory.
func open(t testing.TB, srv *miniotest.Server) (*tmpfs.Store, *s3.Blobs) {
	t.Helper()
	b, x, err := s3.New(t.Context(), config(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(); x.Close() })
	return tmpfs.New(b, x, nil), b
}

// Every store newStore returns shares only the bucket, so the suite's
// restart checks prove the bucket alone holds the data.
func TestConformance(t *testing.T) {
	srv := miniotest.Shared(t)
	tmpfstest.Run(t, func(t *testing.T) *tmpfs.Store {
		s, _ := open(t, srv)
		return s
	})
}

func TestNewCreatesBucket(t *testing.T) {
	srv := miniotest.Shared(t)
	c := srv.Client()
	if ok, err := c.BucketExists(t.Context(), srv.Bucket); err != nil || ok {
		t.Fatalf("before New: got exists=%v, %v, want a missing bucket", ok, err)
	}
	open(t, srv)
	if ok, err := c.BucketExists(t.Context(), srv.Bucket); err != nil || !ok {
		t.Fatalf("after New: got exists=%v, %v, want the bucket", ok, err)
	}
	open(t, srv) // and an existing bucket is fine
}

func TestConfigErrors(t *testing.T) {
	ok := s3.Config{Endpoint: "http://127.0.0.1:1", Bucket: "b", AccessKey: "a", SecretKey: "s"}
	for _, tc := range []struct {
		name string
		edit func(*s3.Config)
		want string
	}{
		{"no scheme", func(c *s3.Config) { c.Endpoint = "127.0.0.1:9000" }, "http:// or https://"},
		{"ftp", func(c *s3.Config) { c.Endpoint = "ftp://127.0.0.1:9000" }, "http:// or https://"},
		{"path", func(c *s3.Config) { c.Endpoint = "http://127.0.0.1:9000/bucket" }, "must not have a path"},
		{"no bucket", func(c *s3.Config) { c.Bucket = "" }, "bucket"},
		{"no secret", func(c *s3.Config) { c.SecretKey = "" }, "secret key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := ok
			tc.edit(&cfg)
			_, _, err := s3.New(t.Context(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// listKeys lists the bucket under prefix with a raw client.
func listKeys(t *testing.T, srv *miniotest.Server, prefix string) []string {
	t.Helper()
	var keys []string
	for o := range srv.Client().ListObjectsIter(t.Context(), srv.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys
}

// The same bytes written in two runs, by two processes, are one blob. The
// sizes cover both the in-memory path (one object) and the large path (an
// upload and the manifest naming it; the duplicate's upload is removed).
func TestDedupStoresOneObject(t *testing.T) {
	for _, size := range []int{3 << 10, 12 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			srv := miniotest.Shared(t)
			data := make([]byte, size)
			rand.NewChaCha8([32]byte{byte(size)}).Read(data)
			s1, _ := open(t, srv)
			s2, _ := open(t, srv)
			f1, err := s1.WriteBytes(t.Context(), runid.New(), "a.bin", data)
			if err != nil {
				t.Fatal(err)
			}
			f2, err := s2.Write(t.Context(), runid.New(), "b/c.bin", bytes.NewReader(data), 0)
			if err != nil {
				t.Fatal(err)
			}
			if f1.SHA256 != f2.SHA256 || f1.SHA256 != tmpfs.DigestOf(data) {
				t.Fatalf("got digests %s and %s, want %s twice", f1.SHA256, f2.SHA256, tmpfs.DigestOf(data))
			}
			want := []string{"blobs/sha256/" + f1.SHA256.String()}
			if got := listKeys(t, srv, "blobs/sha256/"); !slicesEqual(got, want) {
				t.Fatalf("got blob objects %v, want %v", got, want)
			}
			wantUploads := 0
			if size > 5<<20 {
				wantUploads = 1
			}
			if got := listKeys(t, srv, "blobs/uploads/"); len(got) != wantUploads {
				t.Fatalf("got uploads %v, want %d", got, wantUploads)
			}
			if got := listKeys(t, srv, "runs/"); len(got) != 2 {
				t.Fatalf("got index objects %v, want one per run", got)
			}
		})
	}
}

func slicesEqual(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// hashingReader yields n pseudo-random bytes and hashes them as it goes, so a
// big body is checked without being held.
type hashingReader struct {
	src  *rand.ChaCha8
	left int64
	h    interface{ Write([]byte) (int, error) }
}

func (r *hashingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	r.src.Read(p)
	r.h.Write(p)
	r.left -= int64(len(p))
	return len(p), nil
}

// A 100 MiB body is streamed: its digest is crypto/sha256's, it reads back
// identical, and Put allocates a fraction of it (a few parts).
func TestStreamed100MiB(t *testing.T) {
	srv := miniotest.Shared(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	const size = 100 << 20
	h := sha256.New()
	body := &hashingReader{src: rand.NewChaCha8([32]byte{50}), left: size, h: h}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, err := s.Write(ctx, run, "big.bin", body, 0)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	want := tmpfs.DigestFromHash(h)
	if f.SHA256 != want || f.Size != size {
		t.Fatalf("got %s size %d, want %s size %d", f.SHA256, f.Size, want, size)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/2 {
		t.Errorf("Write allocated %d MiB for a %d MiB body, want it streamed (under half)", alloc>>20, size>>20)
	} else {
		t.Logf("Write allocated %.1f MiB for a %d MiB body", float64(alloc)/(1<<20), size>>20)
	}
	if n, err := blobs.Stat(ctx, f.SHA256); err != nil || n != size {
		t.Fatalf("Stat: got %d, %v, want %d", n, err, size)
	}

	_, r, err := s.Open(ctx, run, "big.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h2 := sha256.New()
	if n, err := io.Copy(h2, r); err != nil || n != size {
		t.Fatalf("read back: got %d bytes, %v, want %d", n, err, size)
	}
	if got := tmpfs.DigestFromHash(h2); got != want {
		t.Fatalf("read back: got %s, want %s", got, want)
	}
}

// An empty file is a blob like any other: stored, listed and read back.
func TestEmptyFile(t *testing.T) {
	srv := miniotest.Shared(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	f, err := s.Write(ctx, run, "empty", strings.NewReader(""), 0)
	if err != nil {
		t.Fatal(err)
	}
	if f.Size != 0 || f.SHA256 != tmpfs.DigestOf(nil) {
		t.Fatalf("got %+v, want size 0 and the empty digest", f)
	}
	if n, err := blobs.Stat(ctx, f.SHA256); err != nil || n != 0 {
		t.Fatalf("Stat: got %d, %v, want 0", n, err)
	}
	b, _, err := s.ReadAll(ctx, run, "empty")
	if err != nil || len(b) != 0 {
		t.Fatalf("got %q, %v, want empty", b, err)
	}
	if err := s.Verify(ctx, f.SHA256); err != nil {
		t.Fatal(err)
	}
}

// A bucket deleted under a running store makes it unavailable, not a source
// of "not found" answers.
func TestBucketDeleted(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	if err := srv.Client().RemoveBucket(ctx, srv.Bucket); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, tmpfs.ErrUnavailable) {
		t.Errorf("Ping: got %v, want ErrUnavailable", err)
	}
	if _, err := s.WriteBytes(ctx, runid.New(), "x", []byte("x")); !errors.Is(err, tmpfs.ErrUnavailable) {
		t.Errorf("write: got %v, want ErrUnavailable", err)
	}
}

// Ranged reads go through Seek: each lands on the right bytes, and a seek
// back to the start still yields the whole, verified blob.
func TestSeek(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	data := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{7}).Read(data)
	f, err := s.WriteBytes(ctx, runid.New(), "r.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, off := range []int64{1000, 10, 700_000, 1<<20 - 5} {
		if _, err := r.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 5)
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatalf("at %d: %v", off, err)
		}
		if !bytes.Equal(got, data[off:off+5]) {
			t.Fatalf("at %d: got %x, want %x", off, got, data[off:off+5])
		}
	}
	if end, err := r.Seek(0, io.SeekEnd); err != nil || end != int64(len(data)) {
		t.Fatalf("seek end: got %d, %v, want %d", end, err, len(data))
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read at end: got %d, %v, want 0, EOF", n, err)
	}
	r2, err := s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.Seek(0, io.SeekEnd) // as http.ServeContent does to learn the size
	r2.Seek(0, io.SeekStart)
	got, err := io.ReadAll(r2)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("whole read after seeks: got %d bytes, %v, want the %d written", len(got), err, len(data))
	}
}

// With MinIO down every call fails fast with ErrUnavailable; once it is
// back, everything written before is intact.
func TestMinIODown(t *testing.T) {
	srv := miniotest.New(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	before := map[string][]byte{"a.txt": []byte("alpha"), "d/b.bin": bytes.Repeat([]byte{7}, 9<<20)}
	var files []tmpfs.File
	for p, b := range before {
		f, err := s.WriteBytes(ctx, run, p, b)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}

	srv.Stop()
	// Generous bound: the store should answer in about a second; this only
	// turns a hang into a failure instead of a stuck test.
	down, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	checks := []struct {
		name string
		call func() error
	}{
		{"write", func() error { _, err := s.WriteBytes(down, run, "new.txt", []byte("new")); return err }},
		{"write big", func() error {
			_, err := s.Write(down, run, "new.bin", bytes.NewReader(make([]byte, 10<<20)), 0)
			return err
		}},
		{"read", func() error { _, _, err := s.ReadAll(down, run, "a.txt"); return err }},
		{"verify", func() error { return s.Verify(down, files[0].SHA256) }},
		{"stat blob", func() error { _, err := blobs.Stat(down, files[0].SHA256); return err }},
		{"ping", func() error { return s.Ping(down) }},
		{"list after restart", func() error {
			// A triad started while MinIO is down: its index cache is
			// empty, so the list must reach the bucket.
			b, x, err := s3.New(down, config(t, srv))
			if err != nil {
				return err
			}
			_, err = tmpfs.New(b, x, nil).List(down, run, "")
			return err
		}},
		{"list fresh index", func() error {
			_, err := s.List(down, runid.New(), "")
			return err
		}},
	}
	for _, c := range checks {
		start := time.Now()
		err := c.call()
		if !errors.Is(err, tmpfs.ErrUnavailable) {
			t.Errorf("%s with MinIO down: got %v, want ErrUnavailable", c.name, err)
		}
		t.Logf("%s with MinIO down failed after %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
	}
	if down.Err() != nil {
		t.Fatal("the store hung until the test's bound")
	}
	// The failed writes left no entry behind in the cache.
	if _, err := s.Stat(ctx, run, "new.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Errorf("failed write: got %v, want no entry", err)
	}

	srv.Start()
	// Both the store that saw the outage and a fresh one find everything.
	fresh, _ := open(t, srv)
	for i, st := range []*tmpfs.Store{s, fresh} {
		list, err := st.List(ctx, run, "")
		if err != nil || len(list) != len(before) {
			t.Fatalf("store %d after MinIO restart: got %v, %v, want %d files", i, list, err, len(before))
		}
		for p, want := range before {
			got, f, err := st.ReadAll(ctx, run, p)
			if err != nil || !bytes.Equal(got, want) || f.SHA256 != tmpfs.DigestOf(want) {
				t.Fatalf("store %d after MinIO restart, %s: got %d bytes, %v, want %d", i, p, len(got), err, len(want))
			}
		}
	}
	if _, err := s.WriteBytes(ctx, run, "after.txt", []byte("up again")); err != nil {
		t.Fatalf("write after MinIO restart: %v", err)
	}
}

// A MinIO that accepts connections but never answers (frozen) makes calls
// fail with ErrUnavailable after Config.Timeout instead of hanging, and the
// store recovers when it answers again.
func TestMinIOHung(t *testing.T) {
	srv := miniotest.New(t)
	cfg := config(t, srv)
	cfg.Timeout = time.Second
	b, x, err := s3.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s := tmpfs.New(b, x, nil)
	ctx := t.Context()
	run := runid.New()
	if _, err := s.WriteBytes(ctx, run, "a.txt", []byte("alpha")); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	t.Cleanup(srv.Thaw) // before the server's own cleanup stops it
	down, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"write", func() error { _, err := s.WriteBytes(down, run, "new.txt", []byte("new")); return err }},
		{"read", func() error { _, _, err := s.ReadAll(down, run, "a.txt"); return err }},
		{"list fresh run", func() error { _, err := s.List(down, runid.New(), ""); return err }},
		{"ping", func() error { return s.Ping(down) }},
	} {
		start := time.Now()
		err := c.call()
		if !errors.Is(err, tmpfs.ErrUnavailable) {
			t.Errorf("%s with MinIO hung: got %v, want ErrUnavailable", c.name, err)
		}
		t.Logf("%s with MinIO hung failed after %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
	}
	if down.Err() != nil {
		t.Fatal("the store hung until the test's bound")
	}
	srv.Thaw()
	if got, _, err := s.ReadAll(ctx, run, "a.txt"); err != nil || string(got) != "alpha" {
		t.Fatalf("after thaw: got %q, %v, want alpha", got, err)
	}
	if _, err := s.WriteBytes(ctx, run, "new.txt", []byte("new")); err != nil {
		t.Fatalf("write after thaw: %v", err)
	}
}

// A blob overwritten in the bucket behind the store's back is never served,
// and writing its true bytes again repairs it.
func TestTamperedBlob(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	for _, tc := range []struct{ name, orig, tampered string }{
		{"same size", "original bytes", "tampered bytes"},
		{"other size", "original", "a longer replacement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := s.WriteBytes(ctx, run, tc.name, []byte(tc.orig))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(ctx, f.SHA256); err != nil {
				t.Fatalf("before tampering: %v", err)
			}
			key := "blobs/sha256/" + f.SHA256.String()
			if _, err := srv.Client().PutObject(ctx, srv.Bucket, key, strings.NewReader(tc.tampered), int64(len(tc.tampered)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrDigestMismatch) {
				t.Fatalf("Verify: got %v, want ErrDigestMismatch", err)
			}
			_, r, err := s.Open(ctx, run, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close()
			if !errors.Is(err, tmpfs.ErrDigestMismatch) {
				t.Fatalf("streaming read: got %q, %v, want ErrDigestMismatch", got, err)
			}
			// Writing the true bytes again heals the blob instead of
			// deduplicating against the damaged object.
			if _, err := s.WriteBytes(ctx, run, tc.name+".again", []byte(tc.orig)); err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(ctx, f.SHA256); err != nil {
				t.Fatalf("Verify after rewrite: got %v, want the blob healed", err)
			}
			if got, _, err := s.ReadAll(ctx, run, tc.name); err != nil || string(got) != tc.orig {
				t.Fatalf("read after rewrite: got %q, %v, want %q", got, err, tc.orig)
			}
		})
	}
}

// Two processes writing one run at once lose nothing: each entry is its own
// object.
func TestConcurrentWritersShareARun(t *testing.T) {
	srv := miniotest.Shared(t)
	ctx := t.Context()
	run := runid.New()
	stores := make([]*tmpfs.Store, 2)
	for i := range stores {
		stores[i], _ = open(t, srv)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			_, err := stores[i%2].WriteBytes(ctx, run, fmt.Sprintf("p%d/%02d", i%2, i), []byte(fmt.Sprint(i)))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fresh, _ := open(t, srv)
	if l, err := fresh.List(ctx, run, ""); err != nil || len(l) != 64 {
		t.Fatalf("got %d entries, %v, want 64", len(l), err)
	}
}

// A damaged index entry drops out of its run's listing instead of making
// the whole run unreadable.
func TestCorruptIndexEntry(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	for _, p := range []string{"good.txt", "bad.txt"} {
		if _, err := s.WriteBytes(ctx, run, p, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	keys := listKeys(t, srv, "runs/"+run.String()+"/")
	if len(keys) != 2 {
		t.Fatalf("got index objects %v, want 2", keys)
	}
	// Overwrite bad.txt's entry with garbage, and copy good.txt's entry to
	// a key its path does not hash to: both must be refused.
	c := srv.Client()
	put := func(k, v string) {
		t.Helper()
		if _, err := c.PutObject(ctx, srv.Bucket, k, strings.NewReader(v), int64(len(v)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var bad int
	for _, k := range keys {
		o, err := c.GetObject(ctx, srv.Bucket, k, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(o)
		o.Close()
		if bytes.Contains(b, []byte(`"bad.txt"`)) {
			bad++
			put(k, "{not json")
		} else {
			put("runs/"+run.String()+"/index/"+strings.Repeat("0", 64), strings.Replace(string(b), "good.txt", "stray.txt", 1))
		}
	}
	if bad != 1 {
		t.Fatalf("found %d entries for bad.txt, want 1", bad)
	}
	fresh, _ := open(t, srv)
	l, err := fresh.List(ctx, run, "")
	if err != nil || len(l) != 1 || l[0].Path != "good.txt" {
		t.Fatalf("got %v, %v, want only good.txt", l, err)
	}
}

// Appends are stored as a tail object each, holding the bytes since the
// last compacted blob, and every 32nd append compacts the whole file into
// an ordinary blob; every version reads back whole and verified, and a
// restarted store continues the chain from the bucket alone.
func TestAppendLayout(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	var want []byte
	var last tmpfs.File
	for i := range 40 {
		line := fmt.Appendf(nil, "line %d of %s\n", i, run)
		want = append(want, line...)
		f, err := s.Append(ctx, run, "trace.jsonl", line)
		if err != nil {
			t.Fatal(err)
		}
		last = f
	}
	c := srv.Client()
	// One tail object per version.
	end := 0
	for i := range 40 {
		end += len(fmt.Sprintf("line %d of %s\n", i, run))
		if _, err := c.StatObject(ctx, srv.Bucket, "appends/"+tmpfs.DigestOf(want[:end]).String(), minio.StatObjectOptions{}); err != nil {
			t.Errorf("version %d has no tail object: %v", i, err)
		}
	}
	// The compacted blob is the file as it stood after append 32.
	prefix := 0
	for i := range 32 {
		prefix += len(fmt.Sprintf("line %d of %s\n", i, run))
	}
	compacted := tmpfs.DigestOf(want[:prefix])
	if _, err := c.StatObject(ctx, srv.Bucket, "blobs/sha256/"+compacted.String(), minio.StatObjectOptions{}); err != nil {
		t.Errorf("no compacted blob for append 32: %v", err)
	}
	s2, _ := open(t, srv)
	got, _, err := s2.ReadAll(ctx, run, "trace.jsonl")
	if err != nil || !bytes.Equal(got, want) || last.SHA256 != tmpfs.DigestOf(want) {
		t.Fatalf("after restart: got %d bytes, %v, want %d", len(got), err, len(want))
	}
	// A ranged read across the base and the tail.
	r, err := s2.OpenBlob(ctx, last.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Seek(int64(prefix-5), io.SeekStart); err != nil {
		t.Fatal(err)
	}
	part := make([]byte, 10)
	if _, err := io.ReadFull(r, part); err != nil || !bytes.Equal(part, want[prefix-5:prefix+5]) {
		t.Fatalf("ranged read across the base: got %q, %v, want %q", part, err, want[prefix-5:prefix+5])
	}
}

// TestForget: two processes on one bucket. The first caches a run's index
// and does not see what the second writes until it forgets the run (as a
// replica does when the run's lock says another one held it), and then
// sees exactly the bucket's state.
func TestForget(t *testing.T) {
	srv := miniotest.Shared(t)
	a, _ := open(t, srv)
	b, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	if _, err := a.WriteBytes(ctx, run, "one.txt", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteBytes(ctx, run, "two.txt", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, run, "one.txt"); err != nil {
		t.Fatal(err)
	}
	paths := func(s *tmpfs.Store) []string {
		fs, err := s.List(ctx, run, "")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range fs {
			out = append(out, f.Path)
		}
		return out
	}
	if got := paths(a); !slices.Equal(got, []string{"one.txt"}) {
		t.Fatalf("a before Forget: got %v, want its cached [one.txt] (the cache is per process)", got)
	}
	a.Forget(run)
	if got := paths(a); !slices.Equal(got, []string{"two.txt"}) {
		t.Errorf("a after Forget: got %v, want [two.txt]", got)
	}
}

// fsck checks every appended blob: each tail object after its base, which
// is hashed once however many tails share it. A byte damaged in a tail
// makes bad that version only, since each tail holds its own copy of the
// bytes since its base.
func TestFsckAppended(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	tmpfstest.RunFsckAppended(t, s, func(t *testing.T, d tmpfs.Digest, off int64) {
		key := "appends/" + d.String()
		info, err := srv.Client().StatObject(t.Context(), srv.Bucket, key, minio.StatObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		base, err := strconv.ParseInt(info.Metadata.Get("X-Amz-Meta-Base-Size"), 10, 64)
		if err != nil || off < base {
			t.Fatalf("the damage at %d is not in the tail object (base of %s bytes, %v)", off, info.Metadata.Get("X-Amz-Meta-Base-Size"), err)
		}
		srv.FlipByte(t, key, off-base)
	})
}

// fsck and the scrub find damaged blobs, small (one object) and large (an
// upload and its manifest), quarantine them under quarantine/ and list the
// runs and paths that held them.
func TestFsck(t *testing.T) {
	srv := miniotest.Shared(t)
	tmpfstest.RunFsck(t, func(t *testing.T) *tmpfs.Store {
		s, _ := open(t, srv)
		return s
	}, func(t *testing.T, d tmpfs.Digest) { srv.CorruptBlob(t, d.String()) }, 100<<10, 12<<20)
	if got := listKeys(t, srv, "quarantine/sha256/"); len(got) == 0 {
		t.Fatal("nothing under quarantine/sha256/ after fsck quarantined blobs")
	}
}

// A manifest whose upload is gone is a corrupt blob, never a short one;
// an upload no manifest names is swept, one that is named stays.
func TestManifestAndSweep(t *testing.T) {
	srv := miniotest.Shared(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	data := make([]byte, 9<<20)
	rand.NewChaCha8([32]byte{9}).Read(data)
	f, err := s.WriteBytes(ctx, run, "big.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	uploads := listKeys(t, srv, "blobs/uploads/")
	if len(uploads) != 1 {
		t.Fatalf("got uploads %v, want one", uploads)
	}
	mc := srv.Client()
	orphan := "blobs/uploads/20000101T000000Z-orphan"
	if _, err := mc.PutObject(ctx, srv.Bucket, orphan, strings.NewReader("left by a crash"), 15, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := blobs.Sweep(ctx, 0)
	if err != nil || n != 1 {
		t.Fatalf("Sweep: got %d, %v, want the one orphan removed", n, err)
	}
	if got := listKeys(t, srv, "blobs/uploads/"); !slicesEqual(got, uploads) {
		t.Fatalf("after Sweep: got uploads %v, want %v kept", got, uploads)
	}
	if err := mc.RemoveObject(ctx, srv.Bucket, uploads[0], minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReadAll(ctx, run, "big.bin"); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("read of a blob whose upload is gone: got %v, want ErrDigestMismatch", err)
	}
	if err := s.Verify(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("Verify: got %v, want ErrDigestMismatch", err)
	}
	// Writing the bytes again heals it rather than trusting the manifest.
	if _, err := s.WriteBytes(ctx, run, "again.bin", data); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.ReadAll(ctx, run, "big.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after rewrite: %d bytes, %v", len(got), err)
	}
}

// A file larger than one part (stored as an upload and a manifest) takes
// appends: on the same store, across compactions, and after a restart,
// and every version reads back whole. CEL.md on S3 grows past that size
// in a long run.
func TestAppendToLargeFile(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	want := bytes.Repeat([]byte("0123456789abcdef"), (6<<20)/16+3) // 6 MiB and 48 bytes
	if _, err := s.Write(ctx, run, "CEL.md", bytes.NewReader(want), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().StatObject(ctx, srv.Bucket, "blobs/sha256/"+tmpfs.DigestOf(want).String(), minio.StatObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	appendLines := func(s *tmpfs.Store, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			line := fmt.Appendf(nil, "## Step %d\n", i)
			want = append(want, line...)
			f, err := s.Append(ctx, run, "CEL.md", line)
			if err != nil {
				t.Fatalf("append %d: %v", i, err)
			}
			if f.SHA256 != tmpfs.DigestOf(want) {
				t.Fatalf("append %d: got %s, want the digest of the file so far", i, f.SHA256.Short())
			}
		}
		got, _, err := s.ReadAll(ctx, run, "CEL.md")
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after append %d: got %d bytes, %v, want %d", to, len(got), err, len(want))
		}
	}
	appendLines(s, 0, 40) // past a compaction (every 32)
	s2, _ := open(t, srv)
	appendLines(s2, 40, 45) // the chain resumed from the bucket alone
}

// A damaged base (the compacted file that tail objects continue) makes
// every version built on it bad: fsck quarantines the base as a blob and
// each of those versions as an appended one, and none is reported
// unreadable or left to read as missing.
func TestFsckAppendedBase(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	var vs []tmpfs.File
	for i := range 40 { // a compaction after 32
		f, err := s.Append(ctx, run, "CEL.md", fmt.Appendf(nil, "## Step %d\n", i))
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, f)
	}
	last := vs[len(vs)-1]
	info, err := srv.Client().StatObject(ctx, srv.Bucket, "appends/"+last.SHA256.String(), minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := info.Metadata.Get("X-Amz-Meta-Base")
	baseSize, err := strconv.ParseInt(info.Metadata.Get("X-Amz-Meta-Base-Size"), 10, 64)
	if base == "" || err != nil {
		t.Fatalf("the last version has no base (%q, %v): no compaction happened", base, err)
	}
	srv.CorruptBlob(t, base)
	rep, err := s.Fsck(ctx, tmpfs.FsckOptions{})
	if err != nil || len(rep.Unreadable) != 0 {
		t.Fatalf("fsck: %v, unreadable %q", err, rep.Unreadable)
	}
	bad := map[string]bool{}
	for _, b := range rep.Bad {
		bad[b.SHA256.String()] = b.Quarantined
	}
	if !bad[base] {
		t.Fatalf("fsck bad %v: want the base %s quarantined", bad, base[:12])
	}
	for _, v := range vs {
		onBase := v.Size >= baseSize // the base itself, or built on it
		err := s.Verify(ctx, v.SHA256)
		if onBase && (!bad[v.SHA256.String()] || !errors.Is(err, tmpfs.ErrQuarantined)) || !onBase && err != nil {
			t.Errorf("version of %d bytes (on the base: %v): fsck bad=%v, verify %v", v.Size, onBase, bad[v.SHA256.String()], err)
		}
	}
}

func TestCollect(t *testing.T) {
	srv := miniotest.Shared(t)
	tmpfstest.RunCollect(t, func(t *testing.T) *tmpfs.Store {
		s, _ := open(t, srv)
		return s
	})
}
