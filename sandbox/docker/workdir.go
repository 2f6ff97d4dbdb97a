package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/triadhq/triad/sandbox/internal/loopfs"
)

// diskDir holds the sparse ext4 images behind quota'd working directories.
// It sits inside WorkRoot but is never mounted into a container.
const diskDir = ".disk"

// probeName is the working directory New formats to check quotas work.
const probeName = "probe-quota"

// workdir is one kernel's working directory on the host, optionally backed
// by a loop-mounted ext4 image that enforces the disk quota.
type workdir struct {
	path  string // the directory the kernel sees as /work
	image string // the ext4 image file; "" when the directory is plain
}

// quotaFS formats and mounts per-kernel ext4 images (sandbox/internal/loopfs):
// writing past the image's size fails inside the cell with ENOSPC.
type quotaFS struct {
	root string // WorkRoot
	uid  int
	gid  int
}

// create makes a working directory of at most quota bytes at dir.
func (q quotaFS) create(ctx context.Context, dir string, quota int64) (wd workdir, err error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return wd, fmt.Errorf("create workdir: %w", err)
	}
	wd.path = dir
	img := filepath.Join(q.root, diskDir, filepath.Base(dir)+".ext4")
	defer func() {
		if err != nil {
			_ = wd.remove()
		}
	}()
	if err := loopfs.Make(ctx, img, quota, q.uid, q.gid); err != nil {
		if !errors.Is(err, os.ErrExist) {
			wd.image = img
		}
		return wd, err
	}
	wd.image = img
	return wd, loopfs.Mount(ctx, img, dir)
}

// plain makes an unquota'd working directory, used when loop mounts are not
// available (not root, no loop devices).
func (q quotaFS) plain(dir string) (workdir, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return workdir{}, fmt.Errorf("create workdir: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, q.uid, q.gid); err != nil {
			os.Remove(dir)
			return workdir{}, fmt.Errorf("chown workdir: %w", err)
		}
	}
	return workdir{path: dir}, nil
}

// remove unmounts the working directory and deletes it with its image.
// It is safe to call twice.
func (wd workdir) remove() error {
	var errs []error
	if wd.path != "" {
		if err := unmountAll(wd.path); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll(wd.path); err != nil {
			errs = append(errs, fmt.Errorf("remove workdir: %w", err))
		}
	}
	if wd.image != "" {
		if err := os.Remove(wd.image); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove disk image: %w", err))
		}
	}
	return errors.Join(errs...)
}

// probe checks once, at New, that this process can loop-mount an ext4
// image under root, so a machine without loop devices falls back to plain
// directories with one warning instead of failing every Start.
func (q quotaFS) probe(ctx context.Context) error {
	if err := loopfs.Probe(); err != nil {
		return err
	}
	wd, err := q.create(ctx, filepath.Join(q.root, probeName), 8<<20)
	if err != nil {
		return err
	}
	return wd.remove()
}

// unmountAll detaches every mount at or below dir (loopfs.UnmountAll).
func unmountAll(dir string) error { return loopfs.UnmountAll(dir) }

// run runs a host tool with a bounded wait (loopfs.Run).
func run(ctx context.Context, name string, args ...string) error {
	return loopfs.Run(ctx, name, args...)
}
