package tmpfstest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

var errCrash = errors.New("crash injected")

// RunCollect checks Store.Collect on a store of its own: newStore opens
// the same data each time, as a restarted process would. A run is
// deleted; a collection that crashes after its mark and one that crashes
// after its first removal lose nothing another run holds; the next one
// removes the deleted run's blobs (plain, large, appended) and keeps the
// blob both runs held, every blob of the run that stays (an appended
// file's compacted base included) and a blob a concurrent writer stores
// and links while collections run.
func RunCollect(t *testing.T, newStore func(t *testing.T) *tmpfs.Store) {
	ctx := t.Context()
	s := newStore(t)
	gone, kept := runid.New(), runid.New()
	shared := []byte("the bytes both runs hold")
	large := bytes.Repeat([]byte("L"), 6<<20) // a manifest and an upload on S3
	write := func(run runid.ID, path string, b []byte) tmpfs.File {
		t.Helper()
		f, err := s.WriteBytes(ctx, run, path, b)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	onlyGone := []tmpfs.File{write(gone, "a.txt", []byte("only the deleted run")), write(gone, "big.bin", large)}
	write(gone, "s.txt", shared)
	for i := range 3 {
		f, err := s.Append(ctx, gone, "CEL.md", fmt.Appendf(nil, "gone step %d\n", i))
		if err != nil {
			t.Fatal(err)
		}
		onlyGone = append(onlyGone, f)
	}
	write(kept, "s.txt", shared)
	write(kept, "b.txt", []byte("only the run that stays"))
	for i := range 40 { // past a compaction on S3: the tail's base is held by no index
		if _, err := s.Append(ctx, kept, "trace.jsonl", fmt.Appendf(nil, "{\"step\":%d}\n", i)); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := s.Stat(ctx, kept, "trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, kept, "trace.step_40.jsonl", cur.SHA256, cur.Size); err != nil {
		t.Fatal(err)
	}
	garbage := []byte("bytes no run holds when the writer starts")
	write(gone, "g.txt", garbage)
	files, err := s.List(ctx, gone, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := s.Delete(ctx, gone, f.Path); err != nil {
			t.Fatal(err)
		}
	}
	keptFiles, err := s.List(ctx, kept, "")
	if err != nil {
		t.Fatal(err)
	}
	readsKept := func(s *tmpfs.Store) {
		t.Helper()
		for _, f := range keptFiles {
			if _, _, err := s.ReadAll(ctx, kept, f.Path); err != nil {
				t.Fatalf("read %s of the run that stays: %v", f.Path, err)
			}
		}
	}

	// A crash after the mark, then one after the first removal.
	for _, point := range []string{"marked", "removed"} {
		_, err := s.Collect(ctx, tmpfs.CollectOptions{Crash: func(p string) error {
			if p == point {
				return errCrash
			}
			return nil
		}})
		if !errors.Is(err, errCrash) {
			t.Fatalf("crash at %s: got %v, want the injected crash", point, err)
		}
		s = newStore(t)
		readsKept(s)
	}

	// A writer stores the garbage's bytes again and links them while
	// collections run: its file always reads. The cutoff is before it
	// starts, and after every blob above was stored.
	time.Sleep(1100 * time.Millisecond) // S3's LastModified is kept to the second
	cut := time.Now()
	other := runid.New()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.WriteBytes(ctx, other, "g.txt", garbage); err != nil {
				werr = err
				return
			}
			if _, _, err := s.ReadAll(ctx, other, "g.txt"); err != nil {
				werr = fmt.Errorf("write %d: the linked blob does not read: %w", i, err)
				return
			}
			if err := s.Delete(ctx, other, "g.txt"); err != nil {
				werr = err
				return
			}
		}
	}()
	var rep tmpfs.CollectReport
	for range 3 {
		if rep, err = s.Collect(ctx, tmpfs.CollectOptions{Before: cut}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	readsKept(s)
	for _, f := range onlyGone {
		if _, err := s.Blobs().Stat(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrNotFound) {
			t.Errorf("blob %s of the deleted run only: got %v, want not found", f.Path, err)
		}
	}
	if _, err := s.Blobs().Stat(ctx, tmpfs.DigestOf(shared)); err != nil {
		t.Errorf("the shared blob: got %v, want it kept", err)
	}
	if rep.Live == 0 || rep.Stored == 0 {
		t.Errorf("report: got %+v, want stored and live blobs counted", rep)
	}
	// Nothing holds the garbage now: a collection with a later cutoff
	// removes it, and one more finds nothing to do.
	if _, err := s.Collect(ctx, tmpfs.CollectOptions{Before: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Blobs().Stat(ctx, tmpfs.DigestOf(garbage)); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Errorf("the garbage after the writer stopped: got %v, want not found", err)
	}
	if rep, err = s.Collect(ctx, tmpfs.CollectOptions{Before: time.Now().Add(time.Hour)}); err != nil || rep.Removed != 0 {
		t.Errorf("a collection with nothing to do: got %+v, %v, want nothing removed", rep, err)
	}
	readsKept(newStore(t))
}
