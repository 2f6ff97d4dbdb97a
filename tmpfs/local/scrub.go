package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	return eachDigest(ctx, filepath.Join(b.dir, "blobs", "sha256"), func(d tmpfs.Digest, f fs.DirEntry) error {
		info, err := f.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return fn(d, info.Size())
	})
}

// eachDigest calls fn for each file root/<ab>/<abcdef…> named by a
// sha256, one directory at a time; other files (strays) are skipped. A
// missing root has none. fn's errors are returned as they are.
func eachDigest(ctx context.Context, root string, fn func(d tmpfs.Digest, f fs.DirEntry) error) error {
	dirs, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", root, err)
	}
	for _, dir := range dirs {
		if !dir.IsDir() || len(dir.Name()) != 2 {
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, dir.Name()))
		if err != nil {
			return fmt.Errorf("list %s: %w", root, err)
		}
		for _, f := range files {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, err := tmpfs.ParseDigest(f.Name())
			if err != nil || f.IsDir() || d.String() != f.Name() || f.Name()[:2] != dir.Name() {
				continue
			}
			if err := fn(d, f); err != nil {
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
	return b.quarantine(d, p, report)
}

// quarantine moves file p, which holds or locates blob d, to
// quarantine/sha256/<hex>, after writing report beside it.
func (b *Blobs) quarantine(d tmpfs.Digest, p string, report []byte) error {
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
		if errors.Is(err, fs.ErrNotExist) {
			return b.missing(d)
		}
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

var _ tmpfs.AppendScrubbable = (*Blobs)(nil)

// WalkAppended implements tmpfs.AppendScrubbable: it reads every ref under
// extents/refs/, groups them by extent, and hands each extent over as one
// nested group (each ref names a prefix of it), so the extent is read
// once. A ref that does not parse is a damaged member of a group of its
// own. A digest also stored as a blob file is left to Walk: reads serve
// that copy.
func (b *Blobs) WalkAppended(ctx context.Context, fn func(g tmpfs.AppendedGroup) error) error {
	extents := map[string][]tmpfs.AppendedBlob{}
	err := eachDigest(ctx, filepath.Join(b.extentDir(), "refs"), func(d tmpfs.Digest, _ fs.DirEntry) error {
		if _, err := os.Stat(b.path(d)); err == nil {
			return nil
		}
		r, err := b.readRef(d)
		switch {
		case errors.Is(err, tmpfs.ErrNotFound):
			return nil // quarantined since the listing
		case errors.Is(err, tmpfs.ErrDigestMismatch):
			m := tmpfs.AppendedBlob{Digest: d, Damaged: "its ref, which says where its bytes are, does not parse"}
			return fn(tmpfs.AppendedGroup{Members: []tmpfs.AppendedBlob{m}})
		case err != nil:
			return err
		}
		// The midstate is read again when the group is handed over, so
		// the listing holds ~48 bytes a version, not ~160.
		extents[r.Extent] = append(extents[r.Extent], tmpfs.AppendedBlob{Digest: d, Size: r.Size})
		return nil
	})
	if err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(extents)) {
		members := extents[id]
		delete(extents, id)
		slices.SortFunc(members, func(x, y tmpfs.AppendedBlob) int { return cmp.Compare(x.Size, y.Size) })
		// A ref gone since the listing (quarantined) keeps no midstate:
		// its bytes are still checked.
		for i, m := range members {
			if r, err := b.readRef(m.Digest); err == nil && r.Extent == id && r.Size == m.Size {
				members[i].State = r.State
			}
		}
		g := tmpfs.AppendedGroup{Members: members, Nested: true, Open: func(ctx context.Context, m tmpfs.AppendedBlob) (io.ReadCloser, error) {
			f, err := os.Open(b.extentPath(id))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: blob %s: its extent %s is gone", tmpfs.ErrDigestMismatch, m.Digest, id)
			}
			if err != nil {
				return nil, fmt.Errorf("open extent %s: %w", id, err)
			}
			return struct {
				io.Reader
				io.Closer
			}{io.NewSectionReader(f, 0, m.Size), f}, nil
		}}
		if err := fn(g); err != nil {
			return err
		}
	}
	return nil
}

// QuarantineAppended implements tmpfs.AppendScrubbable: the blob's ref is
// moved to quarantine/sha256/<hex>, beside its report. The extent stays:
// the shorter blobs it holds may be good, and a quarantined ref keeps the
// damaged bytes' location for the operator. This process's appends forget
// where their chains on that extent ended, so none builds on the damaged
// bytes: the next append to such a chain resumes from its base, which
// fails if the base is the quarantined blob.
func (b *Blobs) QuarantineAppended(ctx context.Context, d tmpfs.Digest, report []byte) error {
	r, rerr := b.readRef(d)
	if err := b.quarantine(d, b.refPath(d), report); err != nil {
		return err
	}
	if rerr == nil {
		b.ext.mu.Lock()
		for key, st := range b.ext.chains {
			if st.extent == r.Extent {
				delete(b.ext.chains, key)
			}
		}
		b.ext.mu.Unlock()
	}
	return nil
}
