package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

var errCrash = errors.New("crash injected")

// open opens the store in dir as a restarted process would: nothing of
// the store that wrote it (which may have died mid-write) is reused.
func open(t *testing.T, dir string) (*tmpfs.Store, *Index) {
	t.Helper()
	b, err := NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil), x
}

// step commits step n as the journal does: the checkpoint of CEL.md, its
// Step Block, the evaluation and trace lines and the artifact index, in
// one group commit.
func step(t *testing.T, s *tmpfs.Store, run runid.ID, n int) error {
	t.Helper()
	cur, err := s.Stat(t.Context(), run, "CEL.md")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Commit(t.Context(), run, []tmpfs.Change{
		{Path: fmt.Sprintf("CEL.step_%d.md", n), Link: &cur},
		{Path: "CEL.md", Data: fmt.Appendf(nil, "\n## Step %d: sandbox.exec\n", n)},
		{Path: "evaluations.jsonl", Data: fmt.Appendf(nil, "{\"step\":%d}\n", n)},
		{Path: "trace.jsonl", Data: fmt.Appendf(nil, "{\"step\":%d}\n", n)},
		{Path: "artifacts/index.json", Data: fmt.Appendf(nil, "{\"last_step\":%d}\n", n), Whole: true},
	})
	return err
}

// steps reads back which steps each record holds, verifying every byte
// against its digest, and fails unless they all hold the same steps,
// numbered 1..n without a gap. It returns n.
func steps(t *testing.T, s *tmpfs.Store, run runid.ID) int {
	t.Helper()
	read := func(p string) string {
		b, _, err := s.ReadAll(t.Context(), run, p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		return string(b)
	}
	cel := read("CEL.md")
	n := strings.Count(cel, "## Step ")
	for i := 1; i <= n; i++ {
		if !strings.Contains(cel, fmt.Sprintf("## Step %d:", i)) {
			t.Fatalf("CEL.md has %d steps but no step %d:\n%s", n, i, cel)
		}
		cp := read(fmt.Sprintf("CEL.step_%d.md", i))
		if strings.Count(cp, "## Step ") != i-1 {
			t.Fatalf("CEL.step_%d.md holds %d steps, want %d", i, strings.Count(cp, "## Step "), i-1)
		}
	}
	if _, err := s.Stat(t.Context(), run, fmt.Sprintf("CEL.step_%d.md", n+1)); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("CEL.step_%d.md: got %v, want not found (CEL.md has %d steps)", n+1, err, n)
	}
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "{\"step\":%d}\n", i)
	}
	for _, p := range []string{"evaluations.jsonl", "trace.jsonl"} {
		if got := read(p); got != want.String() {
			t.Fatalf("%s: got %q, want %q (CEL.md has %d steps)", p, got, want.String(), n)
		}
	}
	if got, want := read("artifacts/index.json"), fmt.Sprintf("{\"last_step\":%d}\n", n); got != want {
		t.Fatalf("artifacts/index.json: got %q, want %q", got, want)
	}
	return n
}

// A step is one group commit. A crash at each point of it leaves, once
// the store is reopened, the step in every record or in none: never
// CEL.md without its trace line, a checkpoint without its block, or a
// gap in the step numbers. What was acknowledged (the commit returned)
// is never lost, and the next step takes the next number.
func TestCommitIsAllOrNothingAtEveryCrashPoint(t *testing.T) {
	run := mustRun(t, "r-crash")
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			s, x := open(t, dir)
			if _, err := s.Append(t.Context(), run, "CEL.md", []byte("# Context Engineering Log (CEL)\n")); err != nil {
				t.Fatal(err)
			}
			if err := step(t, s, run, 1); err != nil {
				t.Fatal(err)
			}
			x.crash = func(p string) error {
				if p == point {
					return errCrash
				}
				return nil
			}
			if err := step(t, s, run, 2); !errors.Is(err, errCrash) {
				t.Fatalf("step 2: got %v, want the injected crash", err)
			}

			s2, _ := open(t, dir)
			n := steps(t, s2, run)
			// The record is the commit point: before any of it is on
			// disk, or torn, the step is absent; once all of it is
			// written, a process crash (not a power loss) keeps it.
			want := 1
			if point == "before-sync" || point == "after-sync" {
				want = 2
			}
			if n != want {
				t.Fatalf("after a crash at %s: got %d steps, want %d", point, n, want)
			}
			if err := step(t, s2, run, n+1); err != nil {
				t.Fatalf("step %d after the crash: %v", n+1, err)
			}
			s3, _ := open(t, dir)
			if got := steps(t, s3, run); got != n+1 {
				t.Fatalf("after step %d was acknowledged and the store reopened: got %d steps", n+1, got)
			}
		})
	}
}

// A run's log written before group commits (one put a line) reads as it
// did, and takes group commits after it.
func TestCommitAfterPutsOnlyLog(t *testing.T) {
	run := mustRun(t, "r-old")
	dir := t.TempDir()
	s, _ := open(t, dir)
	ctx := t.Context()
	if _, err := s.Append(ctx, run, "CEL.md", []byte("# Context Engineering Log (CEL)\n")); err != nil {
		t.Fatal(err)
	}
	// Step 1 as the journal wrote it before: a put per file.
	cur, _ := s.Stat(ctx, run, "CEL.md")
	s.Link(ctx, run, "CEL.step_1.md", cur.SHA256, cur.Size)
	s.Append(ctx, run, "CEL.md", []byte("\n## Step 1: sandbox.exec\n"))
	s.Append(ctx, run, "evaluations.jsonl", []byte("{\"step\":1}\n"))
	s.Append(ctx, run, "trace.jsonl", []byte("{\"step\":1}\n"))
	s.WriteBytes(ctx, run, "artifacts/index.json", []byte("{\"last_step\":1}\n"))
	b, err := readLog(dir, run)
	if err != nil || bytes.Contains(b, []byte(`"batch"`)) {
		t.Fatalf("the old-style log: %v %s", err, b)
	}
	if err := step(t, s, run, 2); err != nil {
		t.Fatal(err)
	}
	s2, _ := open(t, dir)
	if n := steps(t, s2, run); n != 2 {
		t.Fatalf("got %d steps, want 2", n)
	}
}

func readLog(dir string, run runid.ID) ([]byte, error) {
	return os.ReadFile(filepath.Join(dir, "runs", run.String(), "index.jsonl"))
}

func mustRun(t *testing.T, s string) runid.ID {
	t.Helper()
	id, err := runid.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
