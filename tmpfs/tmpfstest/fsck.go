package tmpfstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Corrupt damages the stored bytes of blob d behind the store's back (a
// flipped byte, same size), as a disk or an operator might.
type Corrupt func(t *testing.T, d tmpfs.Digest)

// RunFsck checks fsck and the scrub against a backend: a blob damaged
// behind the store's back is found, quarantined and reported with every
// run and path that held it, is never served again (each read fails with
// ErrQuarantined), and its true bytes written again restore it; a dry run
// moves nothing; the background scrub finds one too. sizes are the blob
// sizes to damage (a backend may store small and large blobs apart).
func RunFsck(t *testing.T, newStore func(t *testing.T) *tmpfs.Store, corrupt Corrupt, sizes ...int) {
	if len(sizes) == 0 {
		sizes = []int{100 << 10}
	}
	for _, size := range sizes {
		t.Run(fmt.Sprintf("Fsck%dKiB", size>>10), func(t *testing.T) { testFsck(t, newStore(t), corrupt, size) })
	}
	t.Run("DryRun", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		data := randomBytes(64 << 10)
		f, err := s.WriteBytes(ctx, run, "d.bin", data)
		if err != nil {
			t.Fatal(err)
		}
		corrupt(t, f.SHA256)
		rep, err := s.Fsck(ctx, tmpfs.FsckOptions{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		bad := find(rep, f.SHA256)
		if bad == nil || bad.Quarantined {
			t.Fatalf("dry run: got %+v, want the blob reported and not moved", rep.Bad)
		}
		if _, _, err := s.ReadAll(ctx, run, "d.bin"); !errors.Is(err, tmpfs.ErrDigestMismatch) {
			t.Fatalf("read after a dry run: got %v, want ErrDigestMismatch (damaged, not quarantined)", err)
		}
	})
	t.Run("Scrub", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		f, err := s.WriteBytes(ctx, run, "s.bin", randomBytes(256<<10))
		if err != nil {
			t.Fatal(err)
		}
		corrupt(t, f.SHA256)
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.Scrub(sctx, 8<<20) }()
		defer func() { cancel(); <-done }()
		// The scrub runs on its own; wait (boundedly) for what it does.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			_, _, err := s.ReadAll(ctx, run, "s.bin")
			if errors.Is(err, tmpfs.ErrQuarantined) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the scrub did not quarantine the damaged blob: the last read got %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

func testFsck(t *testing.T, s *tmpfs.Store, corrupt Corrupt, size int) {
	ctx := t.Context()
	a, b := runid.New(), runid.New()
	data := randomBytes(size)
	f, err := s.WriteBytes(ctx, a, "in/data.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, b, "copy.bin", f.SHA256, f.Size); err != nil {
		t.Fatal(err)
	}
	good, err := s.WriteBytes(ctx, a, "good.txt", []byte("untouched"))
	if err != nil {
		t.Fatal(err)
	}
	// A first read, so any record that the blob was verified exists.
	if got, _, err := s.ReadAll(ctx, a, "in/data.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read before damage: %d bytes, %v", len(got), err)
	}
	corrupt(t, f.SHA256)

	rep, err := s.Fsck(ctx, tmpfs.FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := find(rep, f.SHA256)
	if bad == nil || !bad.Quarantined || bad.Size != int64(size) {
		t.Fatalf("fsck: got bad %+v, want %s (%d bytes) quarantined", rep.Bad, f.SHA256.Short(), size)
	}
	if find(rep, good.SHA256) != nil || rep.Blobs < 2 {
		t.Fatalf("fsck: got %+v, want only the damaged blob bad, of at least 2 checked", rep)
	}
	refs := map[tmpfs.Ref]bool{}
	for _, r := range bad.Refs {
		refs[r] = true
	}
	for _, want := range []tmpfs.Ref{{Run: a, Path: "in/data.bin"}, {Run: b, Path: "copy.bin"}} {
		if !refs[want] {
			t.Errorf("fsck refs: got %+v, want %+v among them", bad.Refs, want)
		}
	}

	// Never served again, by any road.
	if _, _, err := s.ReadAll(ctx, a, "in/data.bin"); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("read: got %v, want ErrQuarantined", err)
	}
	if _, _, err := s.ReadAll(ctx, b, "copy.bin"); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("read of the other run's path: got %v, want ErrQuarantined", err)
	}
	if _, err := s.OpenBlob(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("OpenBlob: got %v, want ErrQuarantined", err)
	}
	if err := s.Verify(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("Verify: got %v, want ErrQuarantined", err)
	}
	if got, _, err := s.ReadAll(ctx, a, "good.txt"); err != nil || string(got) != "untouched" {
		t.Fatalf("the good blob: got %q, %v", got, err)
	}
	// A second pass finds nothing more.
	if rep, err := s.Fsck(ctx, tmpfs.FsckOptions{}); err != nil || len(rep.Bad) != 0 {
		t.Fatalf("second fsck: got %+v, %v, want nothing bad", rep.Bad, err)
	}
	// The true bytes written again restore the blob for every path.
	if _, err := s.WriteBytes(ctx, a, "again.bin", data); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after rewrite: %d bytes, %v, want the true %d", len(got), err, len(data))
	}
	if got, _, err := s.ReadAll(ctx, b, "copy.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("other run after rewrite: %d bytes, %v", len(got), err)
	}
}

func find(rep tmpfs.FsckReport, d tmpfs.Digest) *tmpfs.Bad {
	for i := range rep.Bad {
		if rep.Bad[i].SHA256 == d {
			return &rep.Bad[i]
		}
	}
	return nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
