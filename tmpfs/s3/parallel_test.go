package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
)

// bigSize is above the parallel threshold and not a multiple of a
// segment: the first segment, three whole ones, and a short last one.
const bigSize = 4*s3.SegmentSize + 5*s3.SegmentSize/8 + 4321

func bigData(seed byte) []byte {
	b := make([]byte, bigSize)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// writeBig stores bigData(seed) in s as big.bin of a new run.
func writeBig(t *testing.T, s *tmpfs.Store, seed byte) (tmpfs.File, []byte) {
	t.Helper()
	data := bigData(seed)
	f, err := s.WriteBytes(t.Context(), runid.New(), "big.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	return f, data
}

// putPlain stores data as one plain object under its blob name, with its
// digest in the metadata, as a store writing whole objects would: a large
// blob that is not a manifest, whose first GET runs to the end.
func putPlain(t *testing.T, srv *miniotest.Server, d tmpfs.Digest, data []byte) {
	t.Helper()
	if _, err := srv.Client().PutObject(t.Context(), srv.Bucket, "blobs/sha256/"+d.String(), bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{UserMetadata: map[string]string{"sha256": d.String()}}); err != nil {
		t.Fatal(err)
	}
}

// uploadKey is the object holding a manifest blob's bytes.
func uploadKey(t *testing.T, srv *miniotest.Server, d tmpfs.Digest) (string, minio.ObjectInfo) {
	t.Helper()
	info, err := srv.Client().StatObject(t.Context(), srv.Bucket, "blobs/sha256/"+d.String(), minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := info.Metadata.Get("X-Amz-Meta-Triad-Data")
	if key == "" {
		t.Fatalf("blob %s is not a manifest", d.Short())
	}
	return key, info
}

// fetching counts the goroutines a prefetch started that have not ended.
func fetching() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "created by github.com/triadhq/triad/tmpfs/s3.(*object).fill")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// eventually polls cond until it holds or a generous bound passes (which
// only turns a hang into a failure; nothing here is timed).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// startRead reads the first MiB of r and waits until the reader has
// gone parallel: the prefetch holds segment buffers.
func startRead(t *testing.T, r io.Reader, data []byte) {
	t.Helper()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(r, head); err != nil || !bytes.Equal(head, data[:len(head)]) {
		t.Fatalf("first MiB: %v (equal %v)", err, bytes.Equal(head, data[:len(head)]))
	}
	eventually(t, "the read went parallel", func() bool { return s3.SegmentsInUse() > 0 })
}

// A large blob read from its start comes back byte for byte, verified,
// whether it is read in parallel or as one stream, stored as an upload and
// a manifest or as one plain object; a reader that finds every segment
// buffer taken reads as one stream.
func TestParallelRead(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	run := runid.New()
	data := bigData(1)
	f, err := s.WriteBytes(ctx, run, "big.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	uploadKey(t, srv, f.SHA256) // a manifest
	plain := bigData(2)
	pd := tmpfs.DigestOf(plain)
	putPlain(t, srv, pd, plain)

	for _, tc := range []struct {
		name     string
		d        tmpfs.Digest
		data     []byte
		parallel bool
	}{
		{"manifest/parallel", f.SHA256, data, true},
		{"manifest/one stream", f.SHA256, data, false},
		{"plain/parallel", pd, plain, true},
		{"plain/one stream", pd, plain, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restore := s3.ForceParallel(tc.parallel)
			defer restore()
			r, err := s.OpenBlob(ctx, tc.d)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if tc.parallel {
				startRead(t, r, tc.data)
			} else if _, err := io.ReadFull(r, make([]byte, 1<<20)); err != nil {
				t.Fatal(err)
			}
			rest, err := io.ReadAll(r)
			if err != nil {
				t.Fatalf("got %v, want the rest of the blob", err)
			}
			if got := append(tc.data[:1<<20:1<<20], rest...); !bytes.Equal(got, tc.data) {
				t.Fatalf("got %d bytes, want the %d written (equal: false)", len(got), len(tc.data))
			}
			if !tc.parallel && s3.SegmentsInUse() != 0 {
				t.Fatalf("a one-stream read holds %d segment buffers", s3.SegmentsInUse())
			}
			r.Close()
			if n := s3.SegmentsInUse(); n != 0 {
				t.Fatalf("after Close: got %d segment buffers held, want 0", n)
			}
		})
	}

	t.Run("all buffers taken", func(t *testing.T) {
		restore := s3.ForceParallel(true)
		defer restore()
		// Readers paused after their first MiB hold their buffers; with
		// every buffer held, one more reader goes as one stream.
		var held []io.Closer
		defer func() {
			for _, r := range held {
				r.Close()
			}
		}()
		for s3.SegmentsInUse() < s3.MaxSegments {
			before := s3.SegmentsInUse()
			r, err := s.OpenBlob(ctx, f.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, r)
			startRead(t, r, data)
			eventually(t, "the paused reader took its buffers", func() bool { return s3.SegmentsInUse() > before })
			if len(held) > s3.MaxSegments {
				t.Fatalf("%d readers hold %d buffers; want the cap reached", len(held), s3.SegmentsInUse())
			}
		}
		full := s3.SegmentsInUse()
		got, _, err := s.ReadAll(ctx, run, "big.bin")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read with every buffer taken: got %d bytes, %v, want the %d written", len(got), err, len(data))
		}
		if n := s3.SegmentsInUse(); n != full {
			t.Fatalf("buffers held: got %d, want still %d", n, full)
		}
		for _, r := range held {
			r.Close()
		}
		held = nil
		if n := s3.SegmentsInUse(); n != 0 {
			t.Fatalf("after closing every reader: got %d buffers held, want 0", n)
		}
	})
}

// A blob whose bytes are replaced while it is read in parallel fails
// with ErrReplaced; every byte delivered before is the original's, never
// the new object's.
func TestParallelReadReplaced(t *testing.T) {
	srv := miniotest.Shared(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	f, data := writeBig(t, s, 3)
	key, _ := uploadKey(t, srv, f.SHA256)
	restore := s3.ForceParallel(true)
	defer restore()
	b, err := blobs.Open(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]byte, 3<<20) // past the probe: the read is parallel now
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if s3.SegmentsInUse() == 0 {
		t.Fatal("the read did not go parallel")
	}
	other := bigData(4)
	if _, err := srv.Client().PutObject(ctx, srv.Bucket, key, bytes.NewReader(other), int64(len(other)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(b)
	got = append(got, rest...)
	if !errors.Is(err, tmpfs.ErrReplaced) {
		t.Fatalf("read on after the upload was replaced: got %d bytes, %v, want ErrReplaced", len(got), err)
	}
	if !bytes.Equal(got, data[:len(got)]) {
		t.Fatalf("the %d bytes delivered are not the original's", len(got))
	}
	t.Logf("failed after %d of %d bytes: %v", len(got), len(data), err)
}

// A large blob with a flipped byte fails a parallel read with
// ErrDigestMismatch, and its last chunk is never delivered: hashing is the
// same as for one stream.
func TestParallelReadDigestMismatch(t *testing.T) {
	srv := miniotest.Shared(t)
	s, _ := open(t, srv)
	ctx := t.Context()
	mc := srv.Client()
	restore := s3.ForceParallel(true)
	defer restore()

	// A manifest naming an upload whose bytes were damaged under an ETag
	// the manifest still matches (damage the service did not see).
	f, data := writeBig(t, s, 5)
	key, minfo := uploadKey(t, srv, f.SHA256)
	bad := bytes.Clone(data)
	bad[len(bad)-3*s3.SegmentSize/2] ^= 0x20 // in a segment fetched ahead
	up, err := mc.PutObject(ctx, srv.Bucket, key, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	meta := map[string]string{}
	for k, v := range minfo.UserMetadata {
		meta[k] = v
	}
	for k := range meta {
		if strings.EqualFold(k, "Triad-Data-Etag") {
			delete(meta, k)
		}
	}
	meta["Triad-Data-Etag"] = up.ETag
	if _, err := mc.PutObject(ctx, srv.Bucket, "blobs/sha256/"+f.SHA256.String(), bytes.NewReader(nil), 0,
		minio.PutObjectOptions{UserMetadata: meta}); err != nil {
		t.Fatal(err)
	}

	// A plain object with a flipped byte under the original's name.
	plain := bigData(6)
	pd := tmpfs.DigestOf(plain)
	plain[s3.SegmentSize+17] ^= 0x01
	putPlain(t, srv, pd, plain)

	for _, tc := range []struct {
		name   string
		d      tmpfs.Digest
		stored []byte
	}{{"manifest", f.SHA256, bad}, {"plain", pd, plain}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.OpenBlob(ctx, tc.d)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			startRead(t, r, tc.stored)
			n, err := io.Copy(io.Discard, r)
			if !errors.Is(err, tmpfs.ErrDigestMismatch) {
				t.Fatalf("got %v, want ErrDigestMismatch", err)
			}
			if n+1<<20 >= bigSize {
				t.Fatalf("got %d bytes of %d before the error, want the last chunk held back", n+1<<20, bigSize)
			}
		})
	}
}

// Closing a reader in the middle of a parallel read, or cancelling its
// Open context, ends every segment GET and goroutine and frees the
// buffers. The store is reached through a proxy that sends each
// connection at 16 MiB/s, as S3 caps one connection, so the probe itself
// chooses the parallel read and the GETs are still running when the
// reader stops.
func TestParallelReadStops(t *testing.T) {
	srv := miniotest.Shared(t)
	ctx := t.Context()
	fast, _ := open(t, srv)
	f, data := writeBig(t, fast, 7)
	cfg := config(t, srv)
	cfg.Endpoint = throttle(t, srv.Endpoint, 16<<20)
	b, x, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s := tmpfs.New(b, x, nil)
	b.Close() // drop the connection New made, for the goroutine count
	baseline := runtime.NumGoroutine()

	t.Run("Close", func(t *testing.T) {
		r, err := s.OpenBlob(ctx, f.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		startRead(t, r, data)
		eventually(t, "segment GETs in flight", func() bool { return fetching() > 0 })
		r.Close()
		if n := fetching(); n != 0 {
			t.Fatalf("after Close: %d segment goroutines still running", n)
		}
		if n := s3.SegmentsInUse(); n != 0 {
			t.Fatalf("after Close: %d segment buffers held", n)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		r, err := s.OpenBlob(octx, f.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		startRead(t, r, data)
		eventually(t, "segment GETs in flight", func() bool { return fetching() > 0 })
		cancel()
		if _, err := io.Copy(io.Discard, r); !errors.Is(err, context.Canceled) {
			t.Fatalf("read after cancel: got %v, want context.Canceled", err)
		}
		eventually(t, "the segment goroutines end without Close", func() bool { return fetching() == 0 })
		r.Close()
		if n := s3.SegmentsInUse(); n != 0 {
			t.Fatalf("after Close: %d segment buffers held", n)
		}
	})
	b.Close()
	eventually(t, "the goroutine count is back to where it was", func() bool {
		b.Close() // connections cancelled mid-response close as they wind down
		return runtime.NumGoroutine() <= baseline
	})
}

// Seeks during a parallel read stop it cleanly, and ranged reads after
// them land on the right bytes, across segment edges too.
func TestParallelReadSeek(t *testing.T) {
	srv := miniotest.Shared(t)
	s, blobs := open(t, srv)
	ctx := t.Context()
	f, data := writeBig(t, s, 8)
	restore := s3.ForceParallel(true)
	defer restore()
	open := map[string]func() (io.ReadSeekCloser, error){
		"Store.OpenBlob": func() (io.ReadSeekCloser, error) { return s.OpenBlob(ctx, f.SHA256) },
		"Blobs.Open":     func() (io.ReadSeekCloser, error) { return blobs.Open(ctx, f.SHA256) },
	}
	for name, openIt := range open {
		t.Run(name, func(t *testing.T) {
			r, err := openIt()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			head := make([]byte, 3<<20)
			if _, err := io.ReadFull(r, head); err != nil || !bytes.Equal(head, data[:len(head)]) {
				t.Fatalf("head: %v", err)
			}
			eventually(t, "the read went parallel", func() bool { return s3.SegmentsInUse() > 0 })
			for i, c := range []struct{ off, n int64 }{
				{2*s3.SegmentSize + 7, 100},   // ahead, inside a segment being fetched
				{s3.SegmentSize - 3, 6},       // back, across the first segment's edge
				{5, 10},                       // the start
				{int64(len(data)) - 50, 50},   // the end
				{3*s3.SegmentSize - 1, 2 + 1}, // across a later edge
			} {
				if _, err := r.Seek(c.off, io.SeekStart); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, c.n)
				if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, data[c.off:c.off+c.n]) {
					t.Fatalf("at %d: got %x, %v, want %x", c.off, got, err, data[c.off:c.off+c.n])
				}
				if i == 0 && s3.SegmentsInUse() != 0 {
					t.Fatalf("after a seek away: %d segment buffers still held", s3.SegmentsInUse())
				}
			}
			if fetching() != 0 {
				t.Fatal("segment goroutines still running after a seek away")
			}
			if _, err := r.Seek(0, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			all, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(all, data) {
				t.Fatalf("whole read after the seeks: got %d bytes, %v, want the %d written", len(all), err, len(data))
			}
		})
	}
}

// throttle serves endpoint through a loopback proxy that sends each
// connection's responses at most rate bytes a second, as S3 serves one
// connection, and returns the proxy's endpoint. S3 signatures cover the
// Host header, which the client sets to the proxy's address, so requests
// pass through unchanged.
func throttle(t testing.TB, endpoint string, rate float64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(endpoint, "http://")
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			track(c)
			track(up)
			wg.Add(2)
			go func() {
				defer wg.Done()
				io.Copy(up, c)
				up.Close()
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 32<<10)
				next := time.Now()
				for {
					n, err := up.Read(buf)
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
						// Sleep only when ahead; a connection behind by up
						// to 10ms catches up, so sleeps that overshoot do
						// not slow it below rate.
						next = later(next, time.Now().Add(-10*time.Millisecond)).Add(time.Duration(float64(n) / rate * float64(time.Second)))
						time.Sleep(time.Until(next))
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
