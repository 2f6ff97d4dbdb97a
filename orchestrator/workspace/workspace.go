// Package workspace keeps a kernel's working directory and its run's file index in step, so that both are one namespace.
//
// Before a cell, the run's files are materialised into the directory; after
// it, whatever the cell created, changed or deleted is harvested back into
// the store. Every access goes through an os.Root, so a symlink or special
// file a cell plants is never followed out of the directory, by any read or
// write path: symlinks and special files are not harvested at all.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"sort"
	"syscall"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/tmpfs"
)

// Dir is a kernel working directory bound to a run.
type Dir struct {
	store *tmpfs.Store
	run   runid.ID
	root  *os.Root
	dir   string
	uid   int
	gid   int
	log   *slog.Logger
	// Protect, when set, names paths the harvest must not take from the
	// directory (the journal's files): they are reported in Harvest's
	// tampered list and restored from the store instead.
	Protect func(path string) bool

	seen map[string]stamp // what the directory held at the last sync
}

// stamp identifies a file's state cheaply, so unchanged files are not rehashed.
type stamp struct {
	size  int64
	mtime int64
	ctime int64
	ino   uint64
	file  tmpfs.File
}

// Open binds dir (which must exist) to run. Files created in it are owned by
// dir's owner, so a kernel running as another uid can change them.
func Open(store *tmpfs.Store, run runid.ID, dir string, log *slog.Logger) (*Dir, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open working directory: %w", err)
	}
	st, err := root.Stat(".")
	if err != nil {
		root.Close()
		return nil, err
	}
	d := &Dir{store: store, run: run, root: root, dir: dir, uid: -1, gid: -1, log: log, seen: map[string]stamp{}}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		d.uid, d.gid = int(sys.Uid), int(sys.Gid)
	}
	return d, nil
}

// Path is the directory on the host.
func (d *Dir) Path() string { return d.dir }

// Close releases the directory handle; the directory itself stays.
func (d *Dir) Close() error { return d.root.Close() }

// Materialize writes every file of the run into the directory.
func (d *Dir) Materialize(ctx context.Context) error {
	files, err := d.store.List(ctx, d.run, "")
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := d.Put(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// Put writes one run file into the directory (after tmp.write), replacing
// whatever is at its path, including a symlink, without following it.
func (d *Dir) Put(ctx context.Context, f tmpfs.File) error {
	if st, ok := d.seen[f.Path]; ok && st.file.SHA256 == f.SHA256 {
		return nil
	}
	r, err := d.store.OpenBlob(ctx, f.SHA256)
	if err != nil {
		return err
	}
	defer r.Close()
	if dir := path.Dir(f.Path); dir != "." {
		if err := d.mkdirAll(dir); err != nil {
			return err
		}
	}
	tmp := path.Join(path.Dir(f.Path), fmt.Sprintf(".triad-%d-%d.tmp", os.Getpid(), time.Now().UnixNano()))
	w, err := d.root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("materialise %s: %w", f.Path, err)
	}
	_, err = io.Copy(w, r)
	if err == nil && d.uid >= 0 {
		err = w.Chown(d.uid, d.gid)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// A directory in the way (the cell made one where the index has a
		// file) is the cell's newer state; leave it and let the harvest win.
		if st, serr := d.root.Lstat(f.Path); serr == nil && st.IsDir() {
			d.root.Remove(tmp)
			return nil
		}
		err = d.root.Rename(tmp, f.Path)
	}
	if err != nil {
		d.root.Remove(tmp)
		return fmt.Errorf("materialise %s: %w", f.Path, err)
	}
	st, err := d.root.Lstat(f.Path)
	if err != nil {
		return err
	}
	d.seen[f.Path] = stampOf(st, f)
	return nil
}

func (d *Dir) mkdirAll(dir string) error {
	cur := ""
	for _, part := range splitPath(dir) {
		cur = path.Join(cur, part)
		st, err := d.root.Lstat(cur)
		if err == nil {
			if st.IsDir() {
				continue
			}
			// A file or symlink where the index needs a directory: the
			// index wins, the stray entry goes.
			if err := d.root.Remove(cur); err != nil {
				return err
			}
		}
		if err := d.root.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mkdir %s: %w", cur, err)
		}
		if d.uid >= 0 {
			d.root.Lchown(cur, d.uid, d.gid)
		}
	}
	return nil
}

func splitPath(p string) []string {
	var out []string
	for p != "." && p != "/" && p != "" {
		out = append([]string{path.Base(p)}, out...)
		p = path.Dir(p)
	}
	return out
}

// Remove deletes a path from the directory (after tmp.delete). A missing
// file is not an error.
func (d *Dir) Remove(p string) error {
	delete(d.seen, p)
	err := d.root.Remove(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Change is the result of a harvest.
type Change struct {
	// Written are files the cell created or changed, now in the store.
	Written []tmpfs.File
	// Deleted are paths the cell removed, now gone from the index.
	Deleted []string
	// Skipped are entries that were not harvested: symlinks, special
	// files, and names the path validator refuses.
	Skipped []string
	// Tampered are protected paths the cell changed or deleted; they were
	// restored from the store.
	Tampered []string
}

// Harvest stores what changed in the directory since the last sync.
func (d *Dir) Harvest(ctx context.Context) (Change, error) {
	var ch Change
	now := map[string]fs.FileInfo{}
	err := fs.WalkDir(d.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			ch.Skipped = append(ch.Skipped, p)
			return nil
		}
		if p == "." {
			return nil
		}
		if e.IsDir() {
			if p == "lost+found" {
				return fs.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() {
			ch.Skipped = append(ch.Skipped, p)
			return nil
		}
		if path.Ext(p) == ".tmp" && len(path.Base(p)) > 7 && path.Base(p)[:7] == ".triad-" {
			return nil
		}
		if _, err := safepath.Clean(p); err != nil {
			ch.Skipped = append(ch.Skipped, p)
			return nil
		}
		info, err := e.Info()
		if err != nil {
			return nil // removed while walking
		}
		now[p] = info
		return nil
	})
	if err != nil {
		return ch, fmt.Errorf("walk working directory: %w", err)
	}
	// Deletions first: a cell that replaced file "a" with directory "a/"
	// must lose "a" from the index before "a/b" can be added.
	var gone []string
	for p := range d.seen {
		if _, ok := now[p]; !ok {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		if d.Protect != nil && d.Protect(p) {
			ch.Tampered = append(ch.Tampered, p)
			continue
		}
		delete(d.seen, p)
		if err := d.store.Delete(ctx, d.run, p); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return ch, err
		}
		ch.Deleted = append(ch.Deleted, p)
	}
	paths := make([]string, 0, len(now))
	for p := range now {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		info := now[p]
		if st, ok := d.seen[p]; ok && st.same(info) {
			continue
		}
		if d.Protect != nil && d.Protect(p) {
			ch.Tampered = append(ch.Tampered, p)
			continue
		}
		f, err := d.harvestFile(ctx, p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return ch, err
		}
		if f.Path != "" {
			ch.Written = append(ch.Written, f)
		}
	}
	// Put the journal back the way the store has it.
	for _, p := range ch.Tampered {
		delete(d.seen, p)
		f, err := d.store.Stat(ctx, d.run, p)
		if errors.Is(err, tmpfs.ErrNotFound) {
			d.root.Remove(p)
			continue
		}
		if err != nil {
			return ch, err
		}
		if err := d.Put(ctx, f); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

func (d *Dir) harvestFile(ctx context.Context, p string) (tmpfs.File, error) {
	r, err := d.root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return tmpfs.File{}, nil // swapped for a symlink meanwhile
		}
		return tmpfs.File{}, err
	}
	defer r.Close()
	info, err := r.Stat()
	if err != nil {
		return tmpfs.File{}, err
	}
	if !info.Mode().IsRegular() {
		return tmpfs.File{}, nil
	}
	f, err := d.store.Write(ctx, d.run, p, r, 0)
	if err != nil {
		return tmpfs.File{}, fmt.Errorf("harvest %s: %w", p, err)
	}
	d.seen[p] = stampOf(info, f)
	return f, nil
}

func stampOf(info fs.FileInfo, f tmpfs.File) stamp {
	s := stamp{size: info.Size(), mtime: info.ModTime().UnixNano(), file: f}
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		s.ino = sys.Ino
		s.ctime = sys.Ctim.Nano()
	}
	return s
}

func (s stamp) same(info fs.FileInfo) bool {
	o := stampOf(info, s.file)
	return o.size == s.size && o.mtime == s.mtime && o.ino == s.ino && o.ctime == s.ctime
}
