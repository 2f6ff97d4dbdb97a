// Package hostdir is the sandbox.WorkDir of a kernel whose working directory is a directory on the host.
//
// Docker (a bind-mounted, loop-mounted directory) and wasm (a directory
// mounted into the guest) both use it. Every access goes through an
// os.Root, so no path leaves the directory, and no symlink a cell planted
// is followed by any method: Put replaces it, Scan skips it, Open refuses
// it. Special files (FIFOs, sockets, devices) are skipped and refused the
// same way, and opening never blocks on a FIFO.
package hostdir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
)

// Dir is a host directory seen as a sandbox.WorkDir. Its methods are safe
// for concurrent use.
type Dir struct {
	root   *os.Root
	path   string
	quota  int64
	uid    int // owner given to what Put creates; -1 leaves it to the process
	gid    int
	closed atomic.Bool
}

var _ sandbox.WorkDir = (*Dir)(nil)

// Open returns the directory dir (which must exist) as a WorkDir whose
// listings report quota (0: none). When the process runs as root, files and
// directories Put creates are given dir's owner, so a kernel running as
// that uid can change them.
func Open(dir string, quota int64) (*Dir, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open working directory: %w", err)
	}
	d := &Dir{root: root, path: dir, quota: quota, uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		st, err := root.Stat(".")
		if err != nil {
			root.Close()
			return nil, fmt.Errorf("open working directory: %w", err)
		}
		d.uid, d.gid = owner(st)
	}
	return d, nil
}

// Path is the directory on the host.
func (d *Dir) Path() string { return d.path }

// Close releases the directory handle; the directory itself stays. Calls
// made afterwards, and those in progress that touch the directory again,
// fail with sandbox.ErrClosed. It is safe to call twice.
func (d *Dir) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	return d.root.Close()
}

// check returns sandbox.ErrClosed after Close, and ctx's error once it is
// done.
func (d *Dir) check(ctx context.Context) error {
	if d.closed.Load() {
		return fmt.Errorf("working directory %s: %w", d.path, sandbox.ErrClosed)
	}
	return ctx.Err()
}

// fail turns an error that happened because Close ran meanwhile into
// sandbox.ErrClosed, so the caller learns why rather than "file already
// closed".
func (d *Dir) fail(err error) error {
	if err != nil && d.closed.Load() && !errors.Is(err, sandbox.ErrClosed) {
		return fmt.Errorf("working directory %s: %w (%v)", d.path, sandbox.ErrClosed, err)
	}
	return err
}

// tmpPrefix starts the names of Put's temporary files, which Scan ignores.
const tmpPrefix = ".triad-put-"

// Put implements sandbox.WorkDir.
func (d *Dir) Put(ctx context.Context, p string, r io.Reader) (sandbox.Entry, error) {
	e, err := d.put(ctx, p, r)
	return e, d.fail(err)
}

func (d *Dir) put(ctx context.Context, p string, r io.Reader) (sandbox.Entry, error) {
	if err := d.check(ctx); err != nil {
		return sandbox.Entry{}, err
	}
	p, err := safepath.Clean(p)
	if err != nil {
		return sandbox.Entry{}, err
	}
	if dir := path.Dir(p); dir != "." {
		if err := d.mkdirAll(dir); err != nil {
			return sandbox.Entry{}, err
		}
	}
	tmp := path.Join(path.Dir(p), tmpPrefix+randomHex()+".tmp")
	// O_EXCL never follows a symlink, so a cell cannot aim the temporary
	// file elsewhere.
	w, err := d.root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return sandbox.Entry{}, fmt.Errorf("put %s: %w", p, err)
	}
	done := false
	defer func() {
		w.Close()
		if !done {
			d.root.Remove(tmp)
		}
	}()
	if _, err := copyIn(ctx, w, r); err != nil {
		return sandbox.Entry{}, fmt.Errorf("put %s: %w", p, err)
	}
	if d.uid >= 0 {
		if err := w.Chown(d.uid, d.gid); err != nil {
			return sandbox.Entry{}, fmt.Errorf("put %s: %w", p, err)
		}
	}
	if st, err := d.root.Lstat(p); err == nil && st.IsDir() {
		return sandbox.Entry{}, fmt.Errorf("put %s: a directory is in the way: %w", p, sandbox.ErrNotRegular)
	}
	// rename(2) replaces a symlink at p rather than following it.
	if err := d.root.Rename(tmp, p); err != nil {
		return sandbox.Entry{}, fmt.Errorf("put %s: %w", p, err)
	}
	done = true
	// The descriptor still names the file just renamed, so its stamp is
	// this file's even if a cell replaces the path meanwhile (and rename
	// changed its ctime, so it is taken after).
	st, err := w.Stat()
	if err != nil {
		return sandbox.Entry{}, fmt.Errorf("put %s: %w", p, err)
	}
	return entry(p, st), nil
}

// mkdirAll makes dir and its parents; a file or symlink in the way of one
// is removed (the caller's file wins over what a cell left there).
func (d *Dir) mkdirAll(dir string) error {
	cur := ""
	for _, part := range strings.Split(dir, "/") {
		cur = path.Join(cur, part)
		st, err := d.root.Lstat(cur)
		if err == nil {
			if st.IsDir() {
				continue
			}
			if err := d.root.Remove(cur); err != nil {
				return fmt.Errorf("mkdir %s: %w", cur, err)
			}
		}
		if err := d.root.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mkdir %s: %w", cur, err)
		}
		if d.uid >= 0 {
			if err := d.root.Lchown(cur, d.uid, d.gid); err != nil {
				return fmt.Errorf("mkdir %s: %w", cur, err)
			}
		}
	}
	return nil
}

// Remove implements sandbox.WorkDir.
func (d *Dir) Remove(ctx context.Context, p string) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	p, err := safepath.Clean(p)
	if err != nil {
		return err
	}
	if err := d.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return d.fail(fmt.Errorf("remove %s: %w", p, err))
	}
	return nil
}

// Scan implements sandbox.WorkDir.
func (d *Dir) Scan(ctx context.Context) (sandbox.Listing, error) {
	l, err := d.scan(ctx)
	return l, d.fail(err)
}

func (d *Dir) scan(ctx context.Context) (sandbox.Listing, error) {
	l := sandbox.Listing{Quota: d.quota}
	if err := d.check(ctx); err != nil {
		return l, err
	}
	// WalkDir takes each entry's type from the directory listing itself,
	// so it never descends through a symlink to a directory.
	err := fs.WalkDir(d.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			l.Skipped = append(l.Skipped, p) // an unreadable directory
			return fs.SkipDir
		}
		if p == "." {
			return nil
		}
		if err := d.check(ctx); err != nil {
			return err
		}
		if _, err := safepath.Clean(p); err != nil {
			l.Skipped = append(l.Skipped, p)
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case e.IsDir():
			// ext4's lost+found (Docker's quota'd directories) is the file
			// system's, not the cell's.
			if p == "lost+found" {
				return fs.SkipDir
			}
			return nil
		case !e.Type().IsRegular():
			l.Skipped = append(l.Skipped, p)
			return nil
		case strings.HasPrefix(path.Base(p), tmpPrefix):
			return nil // a Put in progress
		}
		st, err := d.root.Lstat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if !st.Mode().IsRegular() {
			l.Skipped = append(l.Skipped, p) // swapped while walking
			return nil
		}
		l.Files = append(l.Files, entry(p, st))
		return nil
	})
	if err != nil {
		return l, fmt.Errorf("scan working directory: %w", err)
	}
	sort.Slice(l.Files, func(i, j int) bool { return l.Files[i].Path < l.Files[j].Path })
	sort.Strings(l.Skipped)
	return l, nil
}

var _ sandbox.Appender = (*Dir)(nil)

// Append implements sandbox.Appender. Like Open, it never follows a
// symlink and never blocks on a FIFO: the file is opened for appending
// only once it is checked to be the regular file last stamped want.
func (d *Dir) Append(ctx context.Context, p string, want sandbox.Stamp, r io.Reader) (sandbox.Entry, error) {
	e, err := d.append(ctx, p, want, r)
	return e, d.fail(err)
}

func (d *Dir) append(ctx context.Context, p string, want sandbox.Stamp, r io.Reader) (sandbox.Entry, error) {
	f, e, err := d.open(ctx, p)
	if err != nil {
		if errors.Is(err, sandbox.ErrNotRegular) {
			err = fmt.Errorf("append %s: %w", p, sandbox.ErrStale)
		}
		return sandbox.Entry{}, err
	}
	f.Close()
	if e.Stamp != want {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, sandbox.ErrStale)
	}
	before, err := d.root.Lstat(e.Path)
	if err != nil {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, err)
	}
	w, err := d.root.OpenFile(e.Path, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
	if err != nil {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, err)
	}
	defer w.Close()
	st, err := w.Stat()
	if err != nil {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, err)
	}
	if !st.Mode().IsRegular() || !os.SameFile(before, st) || entry(e.Path, st).Stamp != want {
		return sandbox.Entry{}, fmt.Errorf("append %s: replaced while opening: %w", e.Path, sandbox.ErrStale)
	}
	if _, err := copyIn(ctx, w, r); err != nil {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, err)
	}
	if st, err = w.Stat(); err != nil {
		return sandbox.Entry{}, fmt.Errorf("append %s: %w", e.Path, err)
	}
	return entry(e.Path, st), nil
}

// Open implements sandbox.WorkDir.
func (d *Dir) Open(ctx context.Context, p string) (io.ReadCloser, sandbox.Entry, error) {
	f, e, err := d.open(ctx, p)
	return f, e, d.fail(err)
}

func (d *Dir) open(ctx context.Context, p string) (io.ReadCloser, sandbox.Entry, error) {
	if err := d.check(ctx); err != nil {
		return nil, sandbox.Entry{}, err
	}
	p, err := safepath.Clean(p)
	if err != nil {
		return nil, sandbox.Entry{}, err
	}
	// os.Root resolves symlinks that stay inside the directory, so every
	// component is checked first: directories above, a regular file last.
	// The descriptor is then checked to be that very file, so a swap in
	// between is refused rather than followed.
	cur := ""
	for _, part := range strings.Split(path.Dir(p), "/") {
		if part == "." {
			break
		}
		cur = path.Join(cur, part)
		st, err := d.root.Lstat(cur)
		if err != nil {
			return nil, sandbox.Entry{}, fmt.Errorf("open %s: %w", p, err)
		}
		if !st.IsDir() {
			return nil, sandbox.Entry{}, fmt.Errorf("open %s: %s is not a directory: %w", p, cur, sandbox.ErrNotRegular)
		}
	}
	before, err := d.root.Lstat(p)
	if err != nil {
		return nil, sandbox.Entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	if !before.Mode().IsRegular() {
		return nil, sandbox.Entry{}, fmt.Errorf("open %s: %v: %w", p, before.Mode().Type(), sandbox.ErrNotRegular)
	}
	// O_NONBLOCK: if a FIFO took the file's place, opening it must not
	// wait for a writer (the identity check below then refuses it).
	f, err := d.root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, sandbox.Entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, sandbox.Entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	if !st.Mode().IsRegular() || !os.SameFile(before, st) {
		f.Close()
		return nil, sandbox.Entry{}, fmt.Errorf("open %s: replaced while opening: %w", p, sandbox.ErrNotRegular)
	}
	return &file{File: f, d: d}, entry(p, st), nil
}

// file is an opened regular file whose read errors after Close say so.
type file struct {
	*os.File
	d *Dir
}

func (f *file) Read(b []byte) (int, error) {
	n, err := f.File.Read(b)
	if err != nil && err != io.EOF {
		err = f.d.fail(err)
	}
	return n, err
}

// entry describes the regular file p whose stat is st.
func entry(p string, st fs.FileInfo) sandbox.Entry {
	return sandbox.Entry{Path: p, Size: st.Size(), Stamp: stamp(st)}
}

// ctxReader stops a copy when ctx ends.
// copyBufs holds copyIn's buffers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyIn copies r into w, stopping between reads when ctx ends, through a
// pooled buffer: io.Copy into a file would make a fresh 32 KiB one each
// time (os.File.ReadFrom's fallback), and the journal's lines are
// appended to the kernel's copies three times a step.
func copyIn(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, ctxReader{ctx, r}, *buf)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
