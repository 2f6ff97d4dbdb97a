//go:build !linux

package hostdir

import (
	"fmt"
	"io/fs"

	"github.com/triadhq/triad/sandbox"
)

// stamp builds a file's change token from what the portable stat offers:
// size and modification time (Linux adds device, inode and ctime).
func stamp(st fs.FileInfo) sandbox.Stamp {
	return sandbox.Stamp(fmt.Sprintf("%x:%x", st.Size(), st.ModTime().UnixNano()))
}

// owner is unknown here: files keep the process's owner.
func owner(fs.FileInfo) (int, int) { return -1, -1 }
