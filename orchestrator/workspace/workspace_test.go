package workspace_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/workspace"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/hostdir"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func newStore(t *testing.T) (*tmpfs.Store, string) {
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil), dir
}

// workDir is a host directory seen through the WorkDir seam, as a kernel
// would hand it out.
func workDir(t *testing.T, quota int64) (*hostdir.Dir, string) {
	t.Helper()
	dir := t.TempDir()
	wd, err := hostdir.Open(dir, quota)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wd.Close() })
	return wd, dir
}

// must fails the test on a setup step's error: an attack that was never
// planted would make the assertions after it pass for nothing.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func TestMaterializeAndHarvest(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t)
	run := runid.New()
	if _, err := s.WriteBytes(ctx, run, "in/data.csv", []byte("a,b\n1,2\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteBytes(ctx, run, "old.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	wd, dir := workDir(t, 0)
	d := workspace.Open(s, run, wd, nil)
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
	must(t, os.WriteFile(filepath.Join(dir, "out.csv"), []byte("x\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "in/data.csv"), []byte("a,b\n9,9\n"), 0o644))
	must(t, os.Remove(filepath.Join(dir, "old.txt")))
	must(t, os.Symlink("/etc/shadow", filepath.Join(dir, "shadow")))
	must(t, os.Symlink("/etc", filepath.Join(dir, "etcdir")))
	must(t, mkfifo(filepath.Join(dir, "pipe")))
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
	s, _ := newStore(t)
	run := runid.New()
	wd, dir := workDir(t, 0)
	outside := filepath.Join(t.TempDir(), "victim.txt")
	must(t, os.WriteFile(outside, []byte("untouched"), 0o644))
	d := workspace.Open(s, run, wd, nil)
	must(t, os.Symlink(outside, filepath.Join(dir, "data.csv")))
	must(t, os.Symlink(filepath.Dir(outside), filepath.Join(dir, "sub")))
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
	s, _ := newStore(t)
	run := runid.New()
	if _, err := s.WriteBytes(ctx, run, "CEL.md", []byte("# journal\n")); err != nil {
		t.Fatal(err)
	}
	wd, dir := workDir(t, 0)
	d := workspace.Open(s, run, wd, nil)
	d.Protect = func(p string) bool { return p == "CEL.md" }
	if err := d.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "CEL.md"), []byte("forged"), 0o644))
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
	must(t, os.Remove(filepath.Join(dir, "CEL.md")))
	ch, err = d.Harvest(ctx)
	if err != nil || !slices.Equal(ch.Tampered, []string{"CEL.md"}) {
		t.Fatalf("delete: got %+v, %v", ch, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "CEL.md")); string(b) != "# journal\n" {
		t.Fatalf("deleted journal not restored: %q", b)
	}
}

// A sparse file whose apparent size is past the disk quota is refused, not
// stored at its apparent size, and the refusal says why; sparse files under
// the quota cannot add up past it either.
func TestSparseFilesAreRefused(t *testing.T) {
	ctx := t.Context()
	s, storeDir := newStore(t)
	run := runid.New()
	const quota = 1 << 20
	wd, dir := workDir(t, quota)
	d := workspace.Open(s, run, wd, nil)
	sparse := func(name string, size int64) {
		t.Helper()
		f, err := os.Create(filepath.Join(dir, name))
		must(t, err)
		must(t, f.Truncate(size))
		must(t, f.Close())
	}
	sparse("huge.bin", 100<<30) // 100 GB on no blocks
	sparse("a.bin", 600<<10)
	sparse("b.bin", 600<<10)
	must(t, os.WriteFile(filepath.Join(dir, "real.txt"), []byte("real"), 0o644))
	ch, err := d.Harvest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	for _, f := range ch.Written {
		written = append(written, f.Path)
	}
	if want := []string{"a.bin", "real.txt"}; !slices.Equal(written, want) {
		t.Errorf("written: got %v, want %v", written, want)
	}
	refused := map[string]workspace.Refusal{}
	for _, r := range ch.Refused {
		refused[r.Path] = r
	}
	if r := refused["huge.bin"]; r.Size != 100<<30 || !strings.Contains(r.Reason, "sparse") {
		t.Errorf("huge.bin: got %+v, want a refusal naming a sparse file", r)
	}
	if r := refused["b.bin"]; !strings.Contains(r.Reason, "quota") {
		t.Errorf("b.bin: got %+v, want a refusal for passing the quota", r)
	}
	if _, err := s.Stat(ctx, run, "huge.bin"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Errorf("huge.bin in the store: %v, want not found", err)
	}
	// The store holds no more than the quota, wherever the blobs live.
	var stored int64
	must(t, filepath.Walk(storeDir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			stored += info.Size()
		}
		return err
	}))
	if stored > 2*quota {
		t.Errorf("the store grew by %d bytes, want about the %d quota at most", stored, quota)
	}
}

// A harvest cut short by the kernel's Close fails with an error that says
// so, and reports only what it stored.
func TestHarvestAfterCloseFails(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t)
	run := runid.New()
	wd, dir := workDir(t, 0)
	d := workspace.Open(s, run, wd, nil)
	must(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a"), 0o644))
	must(t, wd.Close())
	ch, err := d.Harvest(ctx)
	if !errors.Is(err, workspace.ErrIncomplete) || !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("got %v, want ErrIncomplete and ErrClosed", err)
	}
	if len(ch.Written) != 0 {
		t.Errorf("written: got %v, want nothing", ch.Written)
	}
}

// losable is a host directory that can lose its contents, as a Kubernetes
// pod's does when it is evicted.
type losable struct {
	*hostdir.Dir
	losses uint64
}

func (l *losable) Losses() uint64 { return l.losses }

// TestLostDirectory: a directory that lost its contents with its kernel
// (sandbox.Losable) gets the run's files back at the next harvest, and
// their absence is not taken for deletions; what the new kernel wrote is
// harvested on top.
func TestLostDirectory(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t)
	run := runid.New()
	for _, p := range []string{"a.txt", "sub/b.txt"} {
		if _, err := s.WriteBytes(ctx, run, p, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	hd, dir := workDir(t, 0)
	wd := &losable{Dir: hd}
	d := workspace.Open(s, run, wd, nil)
	if err := d.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	// The pod is evicted: its directory is empty, and the new kernel's
	// first cell writes one file.
	must(t, os.RemoveAll(filepath.Join(dir, "sub")))
	must(t, os.Remove(filepath.Join(dir, "a.txt")))
	wd.losses++
	must(t, os.WriteFile(filepath.Join(dir, "new.txt"), []byte("new"), 0o644))
	ch, err := d.Harvest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Deleted) != 0 || len(ch.Written) != 1 || ch.Written[0].Path != "new.txt" {
		t.Errorf("harvest after the loss: got deleted %v, written %v; want nothing deleted and new.txt written", ch.Deleted, ch.Written)
	}
	for _, p := range []string{"a.txt", "sub/b.txt"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != p {
			t.Errorf("%s after the loss: got %q, %v, want it put back", p, b, err)
		}
		if _, err := s.Stat(ctx, run, p); err != nil {
			t.Errorf("%s in the store: %v", p, err)
		}
	}
}

// TestMaterializeRemovesExtras: a directory that holds files the run does
// not have (an adopted kernel's, after the run deleted one elsewhere) is
// made to match the store, so the next harvest does not bring them back.
func TestMaterializeRemovesExtras(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t)
	run := runid.New()
	if _, err := s.WriteBytes(ctx, run, "kept.txt", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	wd, dir := workDir(t, 0)
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "sub/deleted.txt"), []byte("gone from the run"), 0o644))
	d := workspace.Open(s, run, wd, nil)
	if err := d.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub/deleted.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sub/deleted.txt after Materialize: %v, want it removed", err)
	}
	ch, err := d.Harvest(ctx)
	if err != nil || len(ch.Written)+len(ch.Deleted) != 0 {
		t.Errorf("harvest after Materialize: got %+v, %v, want nothing", ch, err)
	}
}
