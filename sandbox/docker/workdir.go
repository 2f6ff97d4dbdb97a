package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
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

// quotaFS formats and mounts per-kernel ext4 images. A sparse image costs
// only the blocks written to it, so the host disk sees real usage, and
// writing past the image's size fails inside the cell with ENOSPC.
type quotaFS struct {
	root string // WorkRoot
	uid  int
	gid  int
}

// mkfsArgs formats without a journal: a kernel's working directory is
// scratch space that the caller harvests after every cell, so crash
// consistency buys nothing, while the journal would cost 64 MiB of written
// blocks and twice the format time per kernel. No blocks are reserved for
// root, because the kernel never runs as root.
var mkfsArgs = []string{"-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,root_owner=%d:%d"}

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
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return wd, fmt.Errorf("create disk image: %w", err)
	}
	wd.image = img
	err = f.Truncate(quota)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return wd, fmt.Errorf("size disk image: %w", err)
	}
	args := make([]string, len(mkfsArgs))
	copy(args, mkfsArgs)
	args[len(args)-1] = fmt.Sprintf(args[len(args)-1], q.uid, q.gid)
	if err := run(ctx, "mkfs.ext4", append(args, img)...); err != nil {
		return wd, err
	}
	if err := run(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, dir); err != nil {
		return wd, err
	}
	// mkfs made the root directory the kernel's (root_owner). lost+found
	// would show up in every listing of the run's files as a directory the
	// kernel cannot open; ext4 works without it (fsck recreates it).
	if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return wd, fmt.Errorf("remove lost+found: %w", err)
	}
	return wd, nil
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
	if os.Geteuid() != 0 {
		return errors.New("not running as root, so it cannot loop-mount a disk image")
	}
	for _, tool := range []string{"mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (apt-get install e2fsprogs mount): %w", tool, err)
		}
	}
	wd, err := q.create(ctx, filepath.Join(q.root, probeName), 8<<20)
	if err != nil {
		return err
	}
	return wd.remove()
}

// unmountAll detaches every mount at or below dir, deepest first. Lazy
// (MNT_DETACH) unmounting succeeds even while a dying container still holds
// the directory; the loop device is released when the last user goes.
func unmountAll(dir string) error {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return fmt.Errorf("list mounts: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		p := unescapeMount(f[1])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}

// unescapeMount undoes the octal escapes /proc/self/mounts uses for
// whitespace and backslashes in paths.
var unescapeMount = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace

// run runs a host tool with a bounded wait and returns its output in the
// error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
