package workspace_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/workspace"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func newStore(t *testing.T) *tmpfs.Store {
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil)
}

func TestMaterializeAndHarvest(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	run := runid.New()
	if _, err := s.WriteBytes(ctx, run, "in/data.csv", []byte("a,b\n1,2\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteBytes(ctx, run, "old.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d, err := workspace.Open(s, run, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "in/data.csv")); err != nil || string(b) != "a,b\n1,2\n" {
		t.Fatalf("materialised: got %q, %v", b, err)
	}
	// Nothing changed yet: an empty harvest.
	ch, err := d.Harvest(ctx)
	if err != nil || len(ch.Written)+len(ch.Deleted) != 0 {
		t.Fatalf("idle harvest: got %+v, %v", ch, err)
	}
	// A "cell": writes a file, changes one, deletes one, plants a symlink
	// to a host secret and a fifo.
	os.WriteFile(filepath.Join(dir, "out.csv"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "in/data.csv"), []byte("a,b\n9,9\n"), 0o644)
	os.Remove(filepath.Join(dir, "old.txt"))
	os.Symlink("/etc/shadow", filepath.Join(dir, "shadow"))
	os.Symlink("/etc", filepath.Join(dir, "etcdir"))
	if err := mkfifo(filepath.Join(dir, "pipe")); err != nil {
		t.Fatal(err)
	}
	ch, err = d.Harvest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	for _, f := range ch.Written {
		written = append(written, f.Path)
	}
	if want := []string{"in/data.csv", "out.csv"}; !slices.Equal(written, want) {
		t.Fatalf("written: got %v, want %v", written, want)
	}
	if want := []string{"old.txt"}; !slices.Equal(ch.Deleted, want) {
		t.Fatalf("deleted: got %v, want %v", ch.Deleted, want)
	}
	if !slices.Contains(ch.Skipped, "shadow") || !slices.Contains(ch.Skipped, "pipe") || !slices.Contains(ch.Skipped, "etcdir") {
		t.Fatalf("skipped: got %v, want shadow, etcdir and pipe", ch.Skipped)
	}
	if _, err := s.Stat(ctx, run, "shadow"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("a symlink was harvested: %v", err)
	}
	got, f, err := s.ReadAll(ctx, run, "out.csv")
	if err != nil || string(got) != "x\n" || f.SHA256 != tmpfs.DigestOf([]byte("x\n")) {
		t.Fatalf("out.csv in store: got %q, %v", got, err)
	}
	if _, err := s.Stat(ctx, run, "old.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Fatalf("deleted file still indexed: %v", err)
	}
}

// Writing a run file over a symlink the cell planted replaces the link and
// never writes through it.
func TestPutDoesNotFollowSymlinks(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	run := runid.New()
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "victim.txt")
	os.WriteFile(outside, []byte("untouched"), 0o644)
	d, err := workspace.Open(s, run, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	os.Symlink(outside, filepath.Join(dir, "data.csv"))
	os.Symlink(filepath.Dir(outside), filepath.Join(dir, "sub"))
	f, err := s.WriteBytes(ctx, run, "data.csv", []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, f); err != nil {
		t.Fatal(err)
	}
	f2, err := s.WriteBytes(ctx, run, "sub/victim.txt", []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, f2); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "untouched" {
		t.Fatalf("wrote through a symlink: victim now %q", b)
	}
	if st, err := os.Lstat(filepath.Join(dir, "data.csv")); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("data.csv: got %v, %v, want a regular file", st, err)
	}
}

func TestProtectedPathsAreRestored(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	run := runid.New()
	s.WriteBytes(ctx, run, "CEL.md", []byte("# journal\n"))
	dir := t.TempDir()
	d, _ := workspace.Open(s, run, dir, nil)
	defer d.Close()
	d.Protect = func(p string) bool { return p == "CEL.md" }
	if err := d.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "CEL.md"), []byte("forged"), 0o644)
	ch, err := d.Harvest(ctx)
	if err != nil || !slices.Equal(ch.Tampered, []string{"CEL.md"}) {
		t.Fatalf("got %+v, %v, want CEL.md tampered", ch, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "CEL.md")); string(b) != "# journal\n" {
		t.Fatalf("journal not restored on disk: %q", b)
	}
	if b, _, _ := s.ReadAll(ctx, run, "CEL.md"); string(b) != "# journal\n" {
		t.Fatalf("journal changed in store: %q", b)
	}
	os.Remove(filepath.Join(dir, "CEL.md"))
	ch, err = d.Harvest(ctx)
	if err != nil || !slices.Equal(ch.Tampered, []string{"CEL.md"}) {
		t.Fatalf("delete: got %+v, %v", ch, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "CEL.md")); string(b) != "# journal\n" {
		t.Fatalf("deleted journal not restored: %q", b)
	}
}
