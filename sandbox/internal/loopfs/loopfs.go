// Package loopfs gives a directory a fixed size: a sparse ext4 image, loop-mounted on it, so that a write past the size fails with ENOSPC when it is made.
//
// Docker kernels' working directories (sandbox/docker) and Kubernetes
// kernel pods' (sandbox/kube/csi, a CSI node plugin) are made this way. A
// sparse image costs only the blocks written to it, so the host's disk
// sees real usage, never more than the size. It needs root, mkfs.ext4 and
// mount.
package loopfs

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

// mkfsArgs formats without a journal: a kernel's working directory is
// scratch space that the caller harvests after every cell, so crash
// consistency buys nothing, while the journal would cost 64 MiB of written
// blocks and twice the format time per kernel. No blocks are reserved for
// root, because the kernel never runs as root.
var mkfsArgs = []string{"-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,root_owner=%d:%d"}

// Make creates image, a sparse ext4 file system of size bytes whose root
// directory belongs to uid:gid. image must not exist.
func Make(ctx context.Context, image string, size int64, uid, gid int) error {
	f, err := os.OpenFile(image, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	args := make([]string, len(mkfsArgs))
	copy(args, mkfsArgs)
	args[len(args)-1] = fmt.Sprintf(args[len(args)-1], uid, gid)
	return Run(ctx, "mkfs.ext4", append(args, image)...)
}

// Mount loop-mounts image on dir (nosuid, nodev) and removes lost+found,
// which would show in every listing of the directory as one its owner
// cannot open (ext4 works without it; fsck recreates it).
func Mount(ctx context.Context, image, dir string) error {
	if err := Run(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", image, dir); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove lost+found: %w", err)
	}
	return nil
}

// Probe checks that this process can make and mount images: root, and
// the tools on PATH.
func Probe() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root, so it cannot loop-mount a disk image")
	}
	for _, tool := range []string{"mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (apt-get install e2fsprogs mount): %w", tool, err)
		}
	}
	return nil
}

// UnmountAll detaches every mount at or below dir, deepest first. Lazy
// (MNT_DETACH) unmounting succeeds even while a dying container still holds
// the directory; the loop device is released when the last user goes.
func UnmountAll(dir string) error {
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

// Mounted reports whether dir is a mount point.
func Mounted(dir string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false, fmt.Errorf("list mounts: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && unescapeMount(f[1]) == dir {
			return true, nil
		}
	}
	return false, nil
}

// unescapeMount undoes the octal escapes /proc/self/mounts uses for
// whitespace and backslashes in paths.
var unescapeMount = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace

// Run runs a host tool with a bounded wait and returns its output in the
// error when it fails.
func Run(ctx context.Context, name string, args ...string) error {
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
