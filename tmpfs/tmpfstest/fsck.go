package tmpfstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
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

// CorruptAppended damages the stored byte at offset off of appended blob d
// behind the store's back. The damage may reach other versions of d's file
// that share the stored byte (they do in a local extent) or not (an S3
// tail object holds its own copy).
type CorruptAppended func(t *testing.T, d tmpfs.Digest, off int64)

// RunFsckAppended checks fsck against a backend's appended blobs
// (tmpfs.AppendScrubbable), the versions of a file grown by Append: after
// a byte of the file's last version is damaged, fsck checks every version,
// reports as bad exactly the versions whose reads fail, quarantines them
// and leaves the others readable; a second pass finds nothing; the true
// bytes written again restore the last version.
func RunFsckAppended(t *testing.T, s *tmpfs.Store, corrupt CorruptAppended) {
	ctx := t.Context()
	run := runid.New()
	const appends = 40 // past a compaction, on a store that compacts
	var (
		versions []tmpfs.File
		content  []byte
	)
	for i := range appends {
		line := fmt.Appendf(nil, "step %02d %x\n", i, randomBytes(1000))
		f, err := s.Append(ctx, run, "log.txt", line)
		if err != nil {
			t.Fatal(err)
		}
		content = append(content, line...)
		versions = append(versions, f)
	}
	last := versions[appends-1]
	off := versions[appends-6].Size - 10 // in the bytes of the sixth append from the end
	corrupt(t, last.SHA256, off)

	failing := map[tmpfs.Digest]bool{}
	for _, v := range versions {
		switch err := s.Verify(ctx, v.SHA256); {
		case errors.Is(err, tmpfs.ErrDigestMismatch):
			failing[v.SHA256] = true
		case err != nil:
			t.Fatalf("verify version of %d bytes: %v", v.Size, err)
		}
	}
	if !failing[last.SHA256] {
		t.Fatal("the damaged last version still verifies: the corrupter did not damage it")
	}

	rep, err := s.Fsck(ctx, tmpfs.FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blobs < appends || len(rep.Unreadable) != 0 {
		t.Fatalf("fsck checked %d blobs (unreadable %q), want all %d versions", rep.Blobs, rep.Unreadable, appends)
	}
	for _, v := range versions {
		bad := find(rep, v.SHA256)
		if (bad != nil) != failing[v.SHA256] {
			t.Errorf("version of %d bytes (damage at %d): fsck says bad=%v (%+v), a read says bad=%v", v.Size, off, bad != nil, bad, failing[v.SHA256])
			continue
		}
		if bad != nil && (!bad.Quarantined || bad.Size != v.Size) {
			t.Errorf("version of %d bytes: got %+v, want it quarantined with its size", v.Size, bad)
		}
		if v.Size <= off && bad != nil {
			t.Errorf("version of %d bytes ends before the damage at %d, yet fsck says %q", v.Size, off, bad.Reason)
		}
	}
	if bad := find(rep, last.SHA256); bad == nil || len(bad.Refs) != 1 || bad.Refs[0] != (tmpfs.Ref{Run: run, Path: "log.txt"}) {
		t.Errorf("the last version's refs: got %+v, want %s log.txt", bad, run)
	}
	for _, v := range versions {
		err := s.Verify(ctx, v.SHA256)
		if failing[v.SHA256] && !errors.Is(err, tmpfs.ErrQuarantined) || !failing[v.SHA256] && err != nil {
			t.Errorf("after fsck, version of %d bytes: verify got %v, want quarantined=%v", v.Size, err, failing[v.SHA256])
		}
	}
	if _, _, err := s.ReadAll(ctx, run, "log.txt"); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("read of log.txt: got %v, want ErrQuarantined", err)
	}
	if rep, err := s.Fsck(ctx, tmpfs.FsckOptions{}); err != nil || len(rep.Bad) != 0 {
		t.Fatalf("second fsck: got %+v, %v, want nothing bad", rep.Bad, err)
	}
	if _, err := s.WriteBytes(ctx, run, "restored.txt", content); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.ReadAll(ctx, run, "log.txt"); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("log.txt after its true bytes were written again: %d bytes, %v", len(got), err)
	}
}

// FlipFileByte flips the byte at off (-1: the middle one) of the file at
// p in place, as damage below a local store would; the file's mode is
// made writable first.
func FlipFileByte(t testing.TB, p string, off int64) {
	t.Helper()
	os.Chmod(p, 0o600)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off = st.Size() / 2
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
