package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/triadhq/triad/tmpfs"
)

var _ tmpfs.Collectable = (*Blobs)(nil)

// A blob's stored time is its file's mtime: a blob file's (every Put
// writes the file anew), or an appended blob's ref's. A write that finds
// a ref's digest stored already, and Touch, set it to now when it is
// older than tmpfs.FreshenAge. See docs/DECISIONS.md, "Deleting runs and
// collecting blobs".

// WalkStored implements tmpfs.Collectable: blob files, then refs.
func (b *Blobs) WalkStored(ctx context.Context, fn func(tmpfs.StoredBlob) error) error {
	walk := func(root string, appended bool) error {
		return eachDigest(ctx, root, func(d tmpfs.Digest, f fs.DirEntry) error {
			info, err := f.Info()
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			return fn(tmpfs.StoredBlob{Digest: d, Stored: info.ModTime(), Appended: appended})
		})
	}
	if err := walk(filepath.Join(b.dir, "blobs", "sha256"), false); err != nil {
		return err
	}
	return walk(filepath.Join(b.extentDir(), "refs"), true)
}

// Needs implements tmpfs.Collectable: an appended blob reads its extent,
// which Tidy keeps while a ref names it, and no other blob.
func (b *Blobs) Needs(context.Context, tmpfs.Digest) ([]tmpfs.Digest, error) { return nil, nil }

// Remove implements tmpfs.Collectable: the blob file and the ref, each if
// its mtime is before the cutoff and this process has not stored or
// touched the blob since.
func (b *Blobs) Remove(ctx context.Context, d tmpfs.Digest, before time.Time) (bool, error) {
	recent, done := b.pins.Removing(d, before)
	defer done()
	if recent {
		return false, nil
	}
	removed := false
	for _, p := range []string{b.path(d), b.refPath(d)} {
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return removed, err
		}
		if !st.ModTime().Before(before) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove blob %s: %w", d.Short(), err)
		}
		if err := syncDir(filepath.Dir(p)); err != nil {
			return removed, err
		}
		removed = true
	}
	if removed {
		b.fps.drop(d)
	}
	return removed, nil
}

// Touch implements tmpfs.Collectable.
func (b *Blobs) Touch(ctx context.Context, d tmpfs.Digest) error {
	defer b.pins.Write()()
	if b.pins.Noted(d) {
		return nil
	}
	if err := b.freshen(d); err != nil {
		return err
	}
	b.pins.Note(d)
	return nil
}

// freshen sets the mtime of blob d's file (or else its ref) to now when
// it is older than tmpfs.FreshenAge, or returns ErrNotFound. Call it
// inside pins.Write.
func (b *Blobs) freshen(d tmpfs.Digest) error {
	for _, p := range []string{b.path(d), b.refPath(d)} {
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if time.Since(st.ModTime()) < tmpfs.FreshenAge {
			return nil
		}
		now := time.Now()
		if err := os.Chtimes(p, now, now); err != nil {
			return fmt.Errorf("touch blob %s: %w", d.Short(), err)
		}
		return nil
	}
	return b.missing(d)
}

// Tidy implements tmpfs.Collectable: an extent that no ref names any more
// and that was last written before the cutoff holds no blob, and goes.
func (b *Blobs) Tidy(ctx context.Context, before time.Time) (int, error) {
	named := map[string]bool{}
	err := eachDigest(ctx, filepath.Join(b.extentDir(), "refs"), func(d tmpfs.Digest, _ fs.DirEntry) error {
		if r, err := b.readRef(d); err == nil {
			named[r.Extent] = true
		} else if !errors.Is(err, tmpfs.ErrNotFound) {
			// A damaged ref might name any extent: keep them all.
			named[""] = true
		}
		return nil
	})
	if err != nil || named[""] {
		return 0, err
	}
	ents, err := os.ReadDir(b.extentDir())
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		id := e.Name()
		if e.IsDir() || named[id] || strings.HasPrefix(id, ".") {
			continue
		}
		ok, err := b.removeExtent(id, before)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// removeExtent removes extent id if it was last written before before,
// with every write of this process held off, and drops the chains that
// end in it.
func (b *Blobs) removeExtent(id string, before time.Time) (bool, error) {
	_, done := b.pins.Removing(tmpfs.Digest{}, before)
	defer done()
	p := b.extentPath(id)
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !st.ModTime().Before(before) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	b.ext.mu.Lock()
	for key, c := range b.ext.chains {
		if c.extent == id {
			delete(b.ext.chains, key)
		}
	}
	b.ext.mu.Unlock()
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, syncDir(b.extentDir())
}
