// Package tmpfstest is a conformance suite that every tmpfs backend must pass.
package tmpfstest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
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
		// Once the directory is empty again, a file may take its name,
		// in this store and after a restart.
		if _, err := s.WriteBytes(ctx, run, "d/e/f", []byte("x")); err != nil {
			t.Fatal(err)
		}
		s.Delete(ctx, run, "d/f")
		if _, err := s.WriteBytes(ctx, run, "d", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
			t.Fatalf("file over a directory that still holds d/e/f: got %v, want ErrConflict", err)
		}
		s.Delete(ctx, run, "d/e/f")
		if _, err := s.WriteBytes(ctx, run, "d", []byte("x")); err != nil {
			t.Fatalf("file over an emptied directory: %v", err)
		}
		if _, err := newStore(t).WriteBytes(ctx, run, "d/g", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
			t.Fatalf("after a restart, file under file: got %v, want ErrConflict", err)
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
	t.Run("Forget", func(t *testing.T) {
		// Forgetting a run (the orchestrator does it for idle runs) while
		// writes go on loses none of them, and leaves nothing cached.
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		const n = 200
		done := make(chan error, 1)
		go func() {
			for i := range n {
				if _, err := s.WriteBytes(ctx, run, fmt.Sprintf("f/%03d", i), []byte(fmt.Sprint(i))); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for range n {
			s.Forget(run)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		l, err := s.List(ctx, run, "f/")
		if err != nil || len(l) != n {
			t.Fatalf("got %d entries, %v, want %d", len(l), err, n)
		}
		s.Forget(run)
		if got := s.Cached(); got != 0 {
			t.Errorf("got %d runs cached after Forget, want 0", got)
		}
		got, _, err := s.ReadAll(ctx, run, "f/199")
		if err != nil || string(got) != "199" {
			t.Fatalf("after Forget: got %q, %v, want 199", got, err)
		}
	})
	t.Run("Meta", func(t *testing.T) { testMeta(t, newStore) })
	t.Run("Append", func(t *testing.T) { testAppend(t, newStore) })
	t.Run("Commit", func(t *testing.T) { testCommit(t, newStore) })
	t.Run("Usage", func(t *testing.T) {
		s := newStore(t)
		ctx := t.Context()
		run := runid.New()
		check := func(when string) {
			t.Helper()
			got, err := s.Usage(ctx, run)
			files, lerr := s.List(ctx, run, "")
			var want int64
			for _, f := range files {
				want += f.Size
			}
			if err != nil || lerr != nil || got != want {
				t.Fatalf("%s: got %d, %v, want %d (%v)", when, got, err, want, lerr)
			}
		}
		check("empty")
		a, err := s.WriteBytes(ctx, run, "a.txt", []byte("12345"))
		if err != nil {
			t.Fatal(err)
		}
		check("after a write")
		s.WriteBytes(ctx, run, "a.txt", []byte("12"))
		check("after an overwrite")
		s.Append(ctx, run, "j.md", []byte("line\n"))
		s.Append(ctx, run, "j.md", []byte("line\n"))
		check("after appends")
		s.Link(ctx, run, "b.txt", a.SHA256, a.Size)
		check("after a link")
		s.Delete(ctx, run, "a.txt")
		check("after a delete")
	})
}

// AppendSteps is how many appends testAppend makes to one file: enough to
// cross an implementation's compaction (tmpfs/s3 compacts every 32).
const AppendSteps = 80

// testAppend checks Store.Append: every version's digest is the sha256 of
// its whole content and stays readable by digest (a checkpoint is a Link
// to it), the file reads back whole and verified, appends continue after
// a restart and after the file is rewritten whole, two runs appending the
// same bytes (so the same digests) do not disturb each other, and a new
// file obeys the run's tree.
func testAppend(t *testing.T, newStore func(t *testing.T) *tmpfs.Store) {
	ctx := t.Context()
	s := newStore(t)
	a, b := runid.New(), runid.New()
	var want []byte
	var versions []tmpfs.File
	check := func(s *tmpfs.Store, run runid.ID, f tmpfs.File, want []byte) {
		t.Helper()
		if f.SHA256 != tmpfs.DigestOf(want) || f.Size != int64(len(want)) {
			t.Fatalf("got %s (%d bytes), want %s (%d bytes)", f.SHA256.Short(), f.Size, tmpfs.DigestOf(want).Short(), len(want))
		}
		got, st, err := s.ReadAll(ctx, run, f.Path)
		if err != nil || !bytes.Equal(got, want) || st.SHA256 != f.SHA256 {
			t.Fatalf("read back: got %d bytes (%v), want %d", len(got), err, len(want))
		}
	}
	for i := range AppendSteps {
		line := []byte(fmt.Sprintf("step %d: %s\n", i, strings.Repeat("x", i%7)))
		want = append(want, line...)
		fa, err := s.Append(ctx, a, "CEL.md", line)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		fb, err := s.Append(ctx, b, "CEL.md", line)
		if err != nil {
			t.Fatalf("append %d to the second run: %v", i, err)
		}
		if fa.SHA256 != fb.SHA256 {
			t.Fatalf("append %d: the runs' digests differ", i)
		}
		check(s, a, fa, want)
		versions = append(versions, fa)
		if i%10 == 0 {
			if _, err := s.Link(ctx, a, fmt.Sprintf("CEL.step_%d.md", i), fa.SHA256, fa.Size); err != nil {
				t.Fatal(err)
			}
		}
	}
	check(s, b, versions[len(versions)-1], want)
	// Every version is still stored, by digest.
	prefix := 0
	for i, v := range versions {
		prefix += len(fmt.Sprintf("step %d: %s\n", i, strings.Repeat("x", i%7)))
		r, err := s.OpenBlob(ctx, v.SHA256)
		if err != nil {
			t.Fatalf("version %d: %v", i, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want[:prefix]) {
			t.Fatalf("version %d: got %d bytes, %v, want %d", i, len(got), err, prefix)
		}
		if n, err := s.Blobs().Stat(ctx, v.SHA256); err != nil || n != v.Size {
			t.Fatalf("stat version %d: got %d, %v, want %d", i, n, err, v.Size)
		}
		if err := s.Verify(ctx, v.SHA256); err != nil {
			t.Fatalf("verify version %d: %v", i, err)
		}
	}
	if got, _, err := s.ReadAll(ctx, a, "CEL.step_40.md"); err != nil || !bytes.Equal(got, want[:versions[40].Size]) {
		t.Fatalf("checkpoint: got %d bytes, %v", len(got), err)
	}

	// After a restart, appends continue where they were.
	s2 := newStore(t)
	more := []byte("after the restart\n")
	f, err := s2.Append(ctx, a, "CEL.md", more)
	if err != nil {
		t.Fatal(err)
	}
	check(s2, a, f, append(append([]byte(nil), want...), more...))
	// The other run's file is untouched by this run's append.
	check(s2, b, versions[len(versions)-1], want)

	// A file rewritten whole, then appended to.
	if _, err := s2.WriteBytes(ctx, a, "CEL.md", []byte("fresh\n")); err != nil {
		t.Fatal(err)
	}
	f, err = s2.Append(ctx, a, "CEL.md", []byte("and more\n"))
	if err != nil {
		t.Fatal(err)
	}
	check(s2, a, f, []byte("fresh\nand more\n"))
	f, err = s2.Append(ctx, a, "CEL.md", []byte("!\n"))
	if err != nil {
		t.Fatal(err)
	}
	check(s2, a, f, []byte("fresh\nand more\n!\n"))
	s = s2

	// An empty append changes nothing; an empty append to a new file
	// creates it empty.
	if g, err := s.Append(ctx, a, "CEL.md", nil); err != nil || g.SHA256 != f.SHA256 {
		t.Fatalf("empty append: got %+v, %v, want %s", g, err, f.SHA256.Short())
	}
	if g, err := s.Append(ctx, a, "empty.jsonl", nil); err != nil || g.Size != 0 || g.SHA256 != tmpfs.DigestOf(nil) {
		t.Fatalf("empty new file: got %+v, %v", g, err)
	}

	// Concurrent appends to one path lose nothing; appends to other paths
	// of the run go on beside them.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				if _, err := s.Append(ctx, a, "shared.jsonl", []byte(fmt.Sprintf("%d-%d\n", g, i))); err != nil {
					errs <- err
				}
				if _, err := s.Append(ctx, a, fmt.Sprintf("own-%d.jsonl", g), []byte("x\n")); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, f, err := s.ReadAll(ctx, a, "shared.jsonl")
	if err != nil || strings.Count(string(got), "\n") != 80 || f.SHA256 != tmpfs.DigestOf(got) {
		t.Fatalf("concurrent appends: got %d lines, %v", strings.Count(string(got), "\n"), err)
	}
	for g := range 8 {
		got, _, err := s.ReadAll(ctx, a, fmt.Sprintf("own-%d.jsonl", g))
		if err != nil || string(got) != strings.Repeat("x\n", 10) {
			t.Fatalf("own-%d: got %q, %v", g, got, err)
		}
	}

	// A new file must fit the run's tree.
	if _, err := s.WriteBytes(ctx, a, "d/f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, a, "d", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
		t.Fatalf("append over a directory: got %v, want ErrConflict", err)
	}
	if _, err := s.Append(ctx, a, "d/f/g", []byte("x")); !errors.Is(err, tmpfs.ErrConflict) {
		t.Fatalf("append under a file: got %v, want ErrConflict", err)
	}
	if _, err := s.Append(ctx, a, "../x", []byte("x")); err == nil {
		t.Fatal("append outside the run: no error")
	}
}

// testMeta checks the namespace outside runs: conditional writes, paged
// listings, and that a second store over the same backing (a replica)
// sees every write at once, with no cache in between.
func testMeta(t *testing.T, newStore func(t *testing.T) *tmpfs.Store) {
	s1, s2 := newStore(t), newStore(t)
	m1, m2 := s1.Meta(), s2.Meta()
	ctx := t.Context()
	ns := "t-" + strings.ToLower(rand.Text()) + "/"

	if _, _, err := m1.GetMeta(ctx, ns+"missing"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("get missing: got %v, want ErrNotFound", err)
	}
	v1, err := m1.PutMeta(ctx, ns+"a", []byte(`{"n":1}`), tmpfs.Cond{IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.PutMeta(ctx, ns+"a", []byte(`{"n":9}`), tmpfs.Cond{IfAbsent: true}); !errors.Is(err, tmpfs.ErrPrecondition) {
		t.Fatalf("second create on a replica: got %v, want ErrPrecondition", err)
	}
	b, v, err := m2.GetMeta(ctx, ns+"a")
	if err != nil || string(b) != `{"n":1}` || v != v1 {
		t.Fatalf("replica read: got %q %q %v, want {\"n\":1} at version %q", b, v, err, v1)
	}
	v2, err := m2.PutMeta(ctx, ns+"a", []byte(`{"n":2}`), tmpfs.Cond{IfVersion: v1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.PutMeta(ctx, ns+"a", []byte(`{"n":3}`), tmpfs.Cond{IfVersion: v1}); !errors.Is(err, tmpfs.ErrPrecondition) {
		t.Fatalf("stale replace: got %v, want ErrPrecondition", err)
	}
	if _, err := m1.PutMeta(ctx, ns+"nope", []byte(`{}`), tmpfs.Cond{IfVersion: v1}); !errors.Is(err, tmpfs.ErrPrecondition) {
		t.Fatalf("replace of a missing record: got %v, want ErrPrecondition", err)
	}
	if b, v, err := m1.GetMeta(ctx, ns+"a"); err != nil || string(b) != `{"n":2}` || v != v2 {
		t.Fatalf("after replace, the first store reads %q %q %v, want {\"n\":2} at %q", b, v, err, v2)
	}

	// A key and keys below it coexist; listings are ordered and paged.
	want := []string{ns + "a", ns + "a/x", ns + "b/1", ns + "b/2", ns + "b/3", ns + "c"}
	for _, k := range want[1:] {
		if _, err := m1.PutMeta(ctx, k, []byte("{}"), tmpfs.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := m2.ListMeta(ctx, ns, "", 0)
	if err != nil || strings.Join(all, ",") != strings.Join(want, ",") {
		t.Fatalf("list: got %q, %v, want %q", all, err, want)
	}
	page, err := m2.ListMeta(ctx, ns+"b/", ns+"b/1", 1)
	if err != nil || len(page) != 1 || page[0] != ns+"b/2" {
		t.Fatalf("page after b/1: got %q, %v, want [b/2]", page, err)
	}
	if page, err := m2.ListMeta(ctx, ns+"b", "", 0); err != nil || len(page) != 3 {
		t.Fatalf("list by partial segment: got %q, %v, want b/1..b/3", page, err)
	}

	if err := m2.DeleteMeta(ctx, ns+"b/2"); err != nil {
		t.Fatal(err)
	}
	if err := m1.DeleteMeta(ctx, ns+"b/2"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("second delete: got %v, want ErrNotFound", err)
	}
	if _, _, err := m1.GetMeta(ctx, ns+"b/2"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("read after a replica's delete: got %v, want ErrNotFound", err)
	}

	// Bad keys never reach the backing store.
	for _, k := range []string{"", "../x", ns + "a//b", ns + "a b", ns + "ü", ns + "a/../../x", "/abs"} {
		if _, err := m1.PutMeta(ctx, k, []byte("{}"), tmpfs.Cond{}); err == nil {
			t.Errorf("put %q: got nil error, want a refusal", k)
		}
	}

	// Runs and the namespace do not see each other.
	run := runid.Must("meta")
	if _, err := s1.WriteBytes(ctx, run, strings.TrimSuffix(ns, "/")+"/a", []byte("run file")); err != nil {
		t.Fatal(err)
	}
	if b, _, _ := m1.GetMeta(ctx, ns+"a"); string(b) != `{"n":2}` {
		t.Fatalf("a run file changed the record: got %q", b)
	}
	if files, _ := s1.List(ctx, runid.Must("meta"), ""); len(files) != 1 {
		t.Fatalf("the namespace leaked into run files: %+v", files)
	}

	// Concurrent creates: exactly one wins. Concurrent read-modify-writes
	// with retries lose no update.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := m1
			if i%2 == 1 {
				m = m2
			}
			if _, err := m.PutMeta(ctx, ns+"race", []byte(fmt.Sprint(i)), tmpfs.Cond{IfAbsent: true}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, tmpfs.ErrPrecondition) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("concurrent creates: %d won, want 1", wins)
	}
	if _, err := m1.PutMeta(ctx, ns+"count", []byte("0"), tmpfs.Cond{}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := m1
			if i%2 == 1 {
				m = m2
			}
			for range 5 {
				for {
					b, v, err := m.GetMeta(ctx, ns+"count")
					if err != nil {
						t.Error(err)
						return
					}
					var n int
					fmt.Sscan(string(b), &n)
					if _, err := m.PutMeta(ctx, ns+"count", []byte(fmt.Sprint(n+1)), tmpfs.Cond{IfVersion: v}); err == nil {
						break
					} else if !errors.Is(err, tmpfs.ErrPrecondition) {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if b, _, err := m2.GetMeta(ctx, ns+"count"); err != nil || string(b) != "30" {
		t.Fatalf("counter after 30 concurrent increments: got %q, %v, want 30", b, err)
	}
}

// testCommit checks a group commit: appends, a whole write and a link
// land together, each reads back as its own bytes after a restart, usage
// follows, and a path that is not a valid place for a file fails the
// whole group with nothing changed.
func testCommit(t *testing.T, newStore func(t *testing.T) *tmpfs.Store) {
	ctx := t.Context()
	s := newStore(t)
	run := runid.New()
	if _, err := s.Usage(ctx, run); err != nil {
		t.Fatal(err)
	}
	j, err := s.Append(ctx, run, "CEL.md", []byte("# log\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Commit(ctx, run, []tmpfs.Change{
		{Path: "CEL.step_1.md", Link: &j},
		{Path: "CEL.md", Data: []byte("## Step 1\n")},
		{Path: "trace.jsonl", Data: []byte("{}\n")},
		{Path: "artifacts/index.json", Data: []byte("[]\n"), Whole: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 || res[1].Prev.SHA256 != j.SHA256 || !res[2].Prev.SHA256.IsZero() {
		t.Fatalf("got %+v, want four results, CEL.md's from %s, trace.jsonl's from nothing", res, j.SHA256.Short())
	}
	want := map[string]string{"CEL.step_1.md": "# log\n", "CEL.md": "# log\n## Step 1\n", "trace.jsonl": "{}\n", "artifacts/index.json": "[]\n"}
	check := func(s *tmpfs.Store) {
		t.Helper()
		for p, w := range want {
			got, f, err := s.ReadAll(ctx, run, p)
			if err != nil || string(got) != w || f.SHA256 != tmpfs.DigestOf([]byte(w)) {
				t.Fatalf("%s: got %q (%v), want %q", p, got, err, w)
			}
		}
	}
	check(s)
	check(newStore(t))
	files, _ := s.List(ctx, run, "")
	var total int64
	for _, f := range files {
		total += f.Size
	}
	if u, err := s.Usage(ctx, run); err != nil || u != total {
		t.Fatalf("usage: got %d (%v), want %d", u, err, total)
	}
	// A file where a directory is needed fails the group: nothing of it
	// is in the index.
	if _, err := s.Commit(ctx, run, []tmpfs.Change{
		{Path: "trace.jsonl", Data: []byte("{}\n")},
		{Path: "CEL.md/x", Data: []byte("no")},
	}); !errors.Is(err, tmpfs.ErrConflict) {
		t.Fatalf("a commit under a file: got %v, want ErrConflict", err)
	}
	check(s)
}
