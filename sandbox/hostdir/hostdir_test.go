package hostdir_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/hostdir"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func open(t *testing.T) (*hostdir.Dir, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := hostdir.Open(dir, 123)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, dir
}

func TestRoundTrip(t *testing.T) {
	ctx := t.Context()
	d, dir := open(t)
	e, err := d.Put(ctx, "a/b/c.txt", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "a/b/c.txt" || e.Size != 5 || e.Stamp == "" {
		t.Fatalf("Put: got %+v", e)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a/b/c.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("on disk: got %q, %v", b, err)
	}
	l, err := d.Scan(ctx)
	if err != nil || len(l.Files) != 1 || l.Files[0] != e || l.Quota != 123 {
		t.Fatalf("Scan: got %+v, %v, want the entry Put returned and quota 123", l, err)
	}
	r, oe, err := d.Open(ctx, "a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "hello" || oe != e {
		t.Fatalf("Open: got %q %+v %v", b, oe, err)
	}
	// A rewrite in place with the same size and modification time still
	// changes the stamp (ctime moves).
	st, err := os.Stat(filepath.Join(dir, "a/b/c.txt"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "a/b/c.txt"), []byte("HELLO"), 0o644))
	must(t, os.Chtimes(filepath.Join(dir, "a/b/c.txt"), st.ModTime(), st.ModTime()))
	l, err = d.Scan(ctx)
	if err != nil || l.Files[0].Stamp == e.Stamp {
		t.Fatalf("stamp after a same-size rewrite: got %+v, %v, want it changed from %q", l.Files, err, e.Stamp)
	}
	if err := d.Remove(ctx, "a/b/c.txt"); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(ctx, "a/b/c.txt"); err != nil {
		t.Fatalf("Remove of a missing file: %v", err)
	}
	if _, _, err := d.Open(ctx, "a/b/c.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after Remove: got %v, want ErrNotExist", err)
	}
}

// Nothing a cell plants is followed: symlinks to files and directories,
// symlinks in the middle of a path, FIFOs and sockets are skipped by Scan,
// refused by Open (without blocking), and replaced by Put.
func TestNeverFollows(t *testing.T) {
	ctx := t.Context()
	d, dir := open(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	must(t, os.WriteFile(secret, []byte("secret"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "target"), []byte("inside"), 0o644))
	must(t, os.Symlink(secret, filepath.Join(dir, "out-link")))
	must(t, os.Symlink("target", filepath.Join(dir, "in-link"))) // even inside the directory
	must(t, os.Symlink(outside, filepath.Join(dir, "dir-link")))
	must(t, os.Mkdir(filepath.Join(dir, "real"), 0o755))
	must(t, os.Symlink("..", filepath.Join(dir, "real", "up")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	l, err := d.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Files) != 1 || l.Files[0].Path != "target" {
		t.Errorf("Scan files: got %+v, want only target", l.Files)
	}
	if want := []string{"dir-link", "fifo", "in-link", "out-link", "real/up"}; !slices.Equal(l.Skipped, want) {
		t.Errorf("Scan skipped: got %v, want %v", l.Skipped, want)
	}
	for _, p := range []string{"out-link", "in-link", "dir-link", "fifo", "dir-link/secret", "real/up/target", "real"} {
		done := make(chan error, 1)
		go func() {
			r, _, err := d.Open(ctx, p)
			if err == nil {
				r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, sandbox.ErrNotRegular) {
				t.Errorf("Open(%s): got %v, want ErrNotRegular", p, err)
			}
		case <-time.After(time.Minute): // a hang guard, not a speed check
			t.Fatalf("Open(%s) blocked", p)
		}
	}
	for _, p := range []string{"out-link", "dir-link/secret"} {
		if _, err := d.Put(ctx, p, strings.NewReader("mine")); err != nil {
			t.Fatalf("Put(%s): %v", p, err)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Errorf("the file outside was written through a link: %q", b)
	}
	if _, err := d.Put(ctx, "real", strings.NewReader("x")); !errors.Is(err, sandbox.ErrNotRegular) {
		t.Errorf("Put over a directory: got %v, want ErrNotRegular", err)
	}
	for _, p := range []string{"../x", "/abs", "a/../../x", ""} {
		if _, err := d.Put(ctx, p, strings.NewReader("x")); err == nil {
			t.Errorf("Put(%q) succeeded", p)
		}
	}
}

func TestClosed(t *testing.T) {
	ctx := t.Context()
	d, _ := open(t)
	if _, err := d.Put(ctx, "a", strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	r, _, err := d.Open(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := d.Scan(ctx); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Scan after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := d.Open(ctx, "a"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Open after Close: got %v, want ErrClosed", err)
	}
	if _, err := d.Put(ctx, "b", strings.NewReader("b")); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Put after Close: got %v, want ErrClosed", err)
	}
	if err := d.Remove(ctx, "a"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Remove after Close: got %v, want ErrClosed", err)
	}
	// A file opened before Close reads to its end.
	if b, err := io.ReadAll(r); err != nil || string(b) != "a" {
		t.Errorf("a file opened before Close: got %q, %v", b, err)
	}
}

// Append adds to a file in place only while it is the file last stamped:
// one a cell changed, replaced by a symlink, or removed is left alone.
func TestAppend(t *testing.T) {
	ctx := t.Context()
	d, dir := open(t)
	e, err := d.Put(ctx, "CEL.md", strings.NewReader("# journal\n"))
	must(t, err)
	e2, err := d.Append(ctx, "CEL.md", e.Stamp, strings.NewReader("## Step 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "CEL.md")); string(b) != "# journal\n## Step 1\n" || e2.Size != int64(len(b)) || e2.Stamp == e.Stamp {
		t.Fatalf("got %q, entry %+v", b, e2)
	}
	// A stale stamp: nothing is written.
	if _, err := d.Append(ctx, "CEL.md", e.Stamp, strings.NewReader("x")); !errors.Is(err, sandbox.ErrStale) {
		t.Fatalf("stale stamp: got %v, want ErrStale", err)
	}
	// A cell's change makes the last stamp stale too.
	time.Sleep(10 * time.Millisecond)
	must(t, os.WriteFile(filepath.Join(dir, "CEL.md"), []byte("forged"), 0o644))
	if _, err := d.Append(ctx, "CEL.md", e2.Stamp, strings.NewReader("x")); !errors.Is(err, sandbox.ErrStale) {
		t.Fatalf("changed file: got %v, want ErrStale", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "CEL.md")); string(b) != "forged" {
		t.Fatalf("a stale append wrote: %q", b)
	}
	// A symlink in the file's place is never followed.
	outside := filepath.Join(t.TempDir(), "target")
	must(t, os.WriteFile(outside, []byte("outside"), 0o644))
	must(t, os.Remove(filepath.Join(dir, "CEL.md")))
	must(t, os.Symlink(outside, filepath.Join(dir, "CEL.md")))
	if _, err := d.Append(ctx, "CEL.md", e2.Stamp, strings.NewReader("x")); !errors.Is(err, sandbox.ErrStale) {
		t.Fatalf("symlink: got %v, want ErrStale", err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside" {
		t.Fatalf("append followed a symlink: %q", b)
	}
	if _, err := d.Append(ctx, "gone.md", e2.Stamp, strings.NewReader("x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: got %v, want ErrNotExist", err)
	}
}
