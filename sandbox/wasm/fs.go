package wasm

import (
	"io"
	"io/fs"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// workFS is the kernel's working directory as the guest sees it at /work:
// the host directory, writable, with symlink creation refused.
//
// wazero already cleans every guest path and refuses ones that climb out of
// the mount ("../.."), but its directory mount creates whatever symlink the
// guest asks for and the host kernel follows it on the next open, so a
// relative link like "../../../etc/passwd" would reach the host filesystem.
// Without guest-made symlinks, every path stays below the directory. The host
// side (files_in) must not place symlinks there either.
//
// With a quota, writes through files it opened count against it.
type workFS struct {
	experimentalsys.FS
	quota *diskQuota // nil: no quota
}

// Symlink refuses: see workFS.
func (workFS) Symlink(oldName, linkName string) experimentalsys.Errno {
	return experimentalsys.EPERM
}

// OpenFile implements experimentalsys.FS, charging writes to the quota.
func (w workFS) OpenFile(path string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	f, errno := w.FS.OpenFile(path, flag, perm)
	if errno != 0 || w.quota == nil || flag&(experimentalsys.O_RDWR|experimentalsys.O_WRONLY) == 0 {
		return f, errno
	}
	return quotaFile{File: f, q: w.quota}, 0
}

// diskQuota bounds the bytes under a kernel's working directory
// (sandbox.Limits.DiskBytes), as the Docker backend's loop-mounted /work does.
//
// Walking the directory on every write would be slow, so used is an upper
// bound: the size found by the last walk plus every byte written since
// (overwrites included). The directory is walked before each cell (so files
// the host placed count) and again only when a write would pass the limit
// (so files the cell deleted stop counting). A refused write fails with EIO (WASI preview 1 has no
// ENOSPC), and hit tells the kernel to explain that in the cell's stderr.
type diskQuota struct {
	dir   string
	limit int64

	mu   sync.Mutex
	used int64
	hit  atomic.Bool
}

// remeasure walks the directory now and clears hit; the kernel calls it
// before each cell.
func (q *diskQuota) remeasure() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.used = dirSize(q.dir)
	q.hit.Store(false)
}

func (q *diskQuota) charge(n int64) experimentalsys.Errno {
	if n <= 0 {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.used+n > q.limit {
		q.used = dirSize(q.dir)
		if q.used+n > q.limit {
			q.hit.Store(true)
			return experimentalsys.EIO
		}
	}
	q.used += n
	return 0
}

// dirSize sums the apparent sizes of the regular files under dir.
func dirSize(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// quotaFile is a writable file in a working directory with a quota.
type quotaFile struct {
	experimentalsys.File
	q *diskQuota
}

// Write implements experimentalsys.File.
func (f quotaFile) Write(buf []byte) (int, experimentalsys.Errno) {
	if errno := f.q.charge(int64(len(buf))); errno != 0 {
		return 0, errno
	}
	return f.File.Write(buf)
}

// Pwrite implements experimentalsys.File.
func (f quotaFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	if errno := f.q.charge(int64(len(buf))); errno != 0 {
		return 0, errno
	}
	return f.File.Pwrite(buf, off)
}

// Truncate implements experimentalsys.File; growing a file is charged.
func (f quotaFile) Truncate(size int64) experimentalsys.Errno {
	st, errno := f.File.Stat()
	if errno != 0 {
		return errno
	}
	if errno := f.q.charge(size - st.Size); errno != 0 {
		return errno
	}
	return f.File.Truncate(size)
}

// rootFS is the guest's "/": a read-only directory that lists the mount
// points and holds nothing else, so os.listdir("/") shows exactly the mounts.
// Paths below a mount point never reach it: wasi-libc sends them to the
// longest matching preopen.
type rootFS struct {
	mounts []string // names of the mount points, sorted
}

// Open implements fs.FS.
func (r rootFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		entries := make([]fs.DirEntry, len(r.mounts))
		for i, m := range r.mounts {
			entries[i] = fs.FileInfoToDirEntry(dirInfo(m))
		}
		return &dirFile{info: dirInfo("."), entries: entries}, nil
	}
	for _, m := range r.mounts {
		if name == m {
			return &dirFile{info: dirInfo(m)}, nil
		}
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

type dirInfo string

func (d dirInfo) Name() string     { return string(d) }
func (dirInfo) Size() int64        { return 0 }
func (dirInfo) Mode() fs.FileMode  { return fs.ModeDir | 0o555 }
func (dirInfo) ModTime() time.Time { return time.Time{} }
func (dirInfo) IsDir() bool        { return true }
func (dirInfo) Sys() any           { return nil }

// dirFile is an open directory of rootFS.
type dirFile struct {
	info    dirInfo
	entries []fs.DirEntry
	off     int
}

func (d *dirFile) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *dirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: string(d.info), Err: fs.ErrInvalid}
}
func (d *dirFile) Close() error { return nil }

// ReadDir implements fs.ReadDirFile.
func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.off:]
	if n <= 0 {
		d.off = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	if n > len(rest) {
		n = len(rest)
	}
	d.off += n
	return rest[:n], nil
}
