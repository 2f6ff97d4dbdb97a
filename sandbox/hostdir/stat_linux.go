package hostdir

import (
	"fmt"
	"io/fs"
	"syscall"

	"github.com/triadhq/triad/sandbox"
)

// stamp builds a file's change token from its device, inode, size and
// modification and change times: a rewrite in place changes mtime or size,
// a replacement the inode, and a touch that restores mtime still moves
// ctime.
func stamp(st fs.FileInfo) sandbox.Stamp {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return sandbox.Stamp(fmt.Sprintf("%x:%x", st.Size(), st.ModTime().UnixNano()))
	}
	return sandbox.Stamp(fmt.Sprintf("%x:%x:%x:%x:%x", s.Dev, s.Ino, s.Size, s.Mtim.Nano(), s.Ctim.Nano()))
}

// owner returns the uid and gid of st.
func owner(st fs.FileInfo) (int, int) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid), int(s.Gid)
	}
	return -1, -1
}
