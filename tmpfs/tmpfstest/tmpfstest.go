// Package tmpfstest is a conformance suite that every tmpfs backend must pass.
package tmpfstest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Run exercises a Store built by newStore. newStore may be called more than
// once in a test to simulate a restart: stores it returns for the same
// backing data must see each other's writes.
func Run(t *testing.T, newStore func(t *testing.T) *tmpfs.Store) {
	t.Run("RoundTrip", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		f, err := s.WriteBytes(ctx, run, "a/b.txt", []byte("hello"))
		if err != nil {
			t.Fatal(err)
		}
		if want := tmpfs.DigestOf([]byte("hello")); f.SHA256 != want || f.Size != 5 || f.Path != "a/b.txt" {
			t.Fatalf("got %+v, want path a/b.txt size 5 sha %s", f, want)
		}
		got, _, err := s.ReadAll(ctx, run, "a//b.txt")
		if err != nil || string(got) != "hello" {
			t.Fatalf("got %q, %v, want hello", got, err)
		}
		list, err := s.List(ctx, run, "a/")
		if err != nil || len(list) != 1 || list[0].Path != "a/b.txt" {
			t.Fatalf("got %+v, %v, want one file a/b.txt", list, err)
		}
		if err := s.Delete(ctx, run, "a/b.txt"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.ReadAll(ctx, run, "a/b.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("read after delete: got %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, run, "a/b.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("second delete: got %v, want ErrNotFound", err)
		}
		// The blob outlives the path.
		r, err := s.OpenBlob(ctx, f.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != "hello" {
			t.Fatalf("blob: got %q, %v", b, err)
		}
	})
	t.Run("Isolation", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		a, b := runid.New(), runid.New()
		if _, err := s.WriteBytes(ctx, a, "secret.txt", []byte("a's")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, b, "secret.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("stat from other run: got %v, want ErrNotFound", err)
		}
		if l, _ := s.List(ctx, b, ""); len(l) != 0 {
			t.Fatalf("list from other run: got %v, want empty", l)
		}
		if err := s.Delete(ctx, b, "secret.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("delete from other run: got %v, want ErrNotFound", err)
		}
	})
	t.Run("Conflicts", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		if _, err := s.WriteBytes(ctx, run, "d/f", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WriteBytes(ctx, run, "d", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
			t.Fatalf("file over dir: got %v, want ErrConflict", err)
		}
		if _, err := s.WriteBytes(ctx, run, "d/f/g", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
			t.Fatalf("file under file: got %v, want ErrConflict", err)
		}
	})
	t.Run("TooLarge", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		if _, err := s.Write(ctx, run, "big", bytes.NewReader(make([]byte, 1001)), 1000); !errors.Is(err, tmpfs.ErrTooLarge) {
			t.Fatalf("got %v, want ErrTooLarge", err)
		}
		if _, err := s.Stat(ctx, run, "big"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("oversize write left an entry: %v", err)
		}
		if _, err := s.Write(ctx, run, "exact", bytes.NewReader(make([]byte, 1000)), 1000); err != nil {
			t.Fatalf("write at the limit: %v", err)
		}
	})
	t.Run("Dedup", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		data := make([]byte, 1<<20)
		rand.Read(data)
		f1, err := s.WriteBytes(ctx, runid.New(), "x.bin", data)
		if err != nil {
			t.Fatal(err)
		}
		f2, err := s.WriteBytes(ctx, runid.New(), "y.bin", data)
		if err != nil {
			t.Fatal(err)
		}
		if f1.SHA256 != f2.SHA256 {
			t.Fatalf("got %s and %s, want one digest", f1.SHA256, f2.SHA256)
		}
	})
	t.Run("ConcurrentWrites", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		const n = 64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.WriteBytes(ctx, run, fmt.Sprintf("f/%03d", i), []byte(fmt.Sprint(i)))
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		l, err := s.List(ctx, run, "f/")
		if err != nil || len(l) != n {
			t.Fatalf("got %d entries, %v, want %d", len(l), err, n)
		}
		// And a fresh store over the same data agrees (durability).
		l2, err := newStore(t).List(ctx, run, "f/")
		if err != nil || len(l2) != n {
			t.Fatalf("after restart: got %d entries, %v, want %d", len(l2), err, n)
		}
	})
	t.Run("Restart", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		for i := range 300 { // enough to trigger log compaction
			if _, err := s.WriteBytes(ctx, run, "churn.txt", []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.WriteBytes(ctx, run, "gone.txt", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, run, "gone.txt"); err != nil {
			t.Fatal(err)
		}
		s2 := newStore(t)
		got, _, err := s2.ReadAll(ctx, run, "churn.txt")
		if err != nil || string(got) != "299" {
			t.Fatalf("after restart: got %q, %v, want 299", got, err)
		}
		if _, err := s2.Stat(ctx, run, "gone.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("deleted file back after restart: %v", err)
		}
	})
	t.Run("RangedVerify", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		f, err := s.WriteBytes(ctx, runid.New(), "v", []byte("verify me"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Verify(ctx, f.SHA256); err != nil {
			t.Fatal(err)
		}
		if err := s.Verify(ctx, tmpfs.DigestOf([]byte("never stored"))); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Fatalf("got %v, want ErrNotFound", err)
		}
	})
}
