package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

var (
	_ tmpfs.RunLister = (*Index)(nil)
	_ tmpfs.Sweeper   = (*Blobs)(nil)
)

func (b *Blobs) quarantinePath(d tmpfs.Digest) string {
	return filepath.Join(b.dir, "quarantine", "sha256", d.String())
}

// Walk implements tmpfs.Scrubbable: it lists blobs/sha256/*/*, one
// directory at a time.
func (b *Blobs) Walk(ctx context.Context, fn func(d tmpfs.Digest, size int64) error) error {
	root := filepath.Join(b.dir, "blobs", "sha256")
	dirs, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("list blobs: %w", err)
	}
	for _, dir := range dirs {
		if !dir.IsDir() || len(dir.Name()) != 2 {
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, dir.Name()))
		if err != nil {
			return fmt.Errorf("list blobs: %w", err)
		}
		for _, f := range files {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, err := tmpfs.ParseDigest(f.Name())
			if err != nil || f.IsDir() || d.String() != f.Name() || f.Name()[:2] != dir.Name() {
				continue // not a blob: a stray file is no concern of fsck's
			}
			info, err := f.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if err := fn(d, info.Size()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Quarantine implements tmpfs.Scrubbable: the blob file is renamed to
// quarantine/sha256/<hex>, beside its report, and its fingerprint is
// forgotten. A Put of the true bytes later writes a new blob file; the
// quarantined one stays for the operator to inspect or delete.
func (b *Blobs) Quarantine(ctx context.Context, d tmpfs.Digest, ver string, report []byte) error {
	p := b.path(d)
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return b.missing(d)
	}
	if err != nil {
		return err
	}
	if fileVersion(st) != ver {
		return fmt.Errorf("%w: blob %s was replaced while it was checked", tmpfs.ErrPrecondition, d)
	}
	q := b.quarantinePath(d)
	if err := os.MkdirAll(filepath.Dir(q), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(b.tmpDir(), "report-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(report, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), q+".json")
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write quarantine report of %s: %w", d.Short(), err)
	}
	// The report goes first: a crash between the two leaves the blob in
	// place, and the next fsck finds it again.
	if err := os.Rename(p, q); err != nil {
		return fmt.Errorf("move blob %s to quarantine: %w", d.Short(), err)
	}
	b.fps.drop(d)
	if err := syncDir(filepath.Dir(p)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(q))
}

// Sweep implements tmpfs.Sweeper: files in tmp/ older than age are what
// a crash left of a write (a blob, a fingerprint, a report) and go.
func (b *Blobs) Sweep(ctx context.Context, age time.Duration) (int, error) {
	ents, err := os.ReadDir(b.tmpDir())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", b.tmpDir(), err)
	}
	cutoff := time.Now().Add(-age)
	n := 0
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || e.IsDir() || !info.ModTime().Before(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(b.tmpDir(), e.Name())); err == nil {
			n++
		}
	}
	return n, nil
}

// Runs implements tmpfs.RunLister: each directory under runs/ is a run.
func (x *Index) Runs(ctx context.Context) ([]runid.ID, error) {
	ents, err := os.ReadDir(x.dir)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var out []runid.ID
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if id, err := runid.Parse(e.Name()); err == nil {
			out = append(out, id)
		}
	}
	return out, nil
}
