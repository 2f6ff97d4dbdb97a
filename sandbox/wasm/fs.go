package wasm

import (
	"io"
	"io/fs"
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
type workFS struct {
	experimentalsys.FS
}

// Symlink refuses: see workFS.
func (workFS) Symlink(oldName, linkName string) experimentalsys.Errno {
	return experimentalsys.EPERM
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
