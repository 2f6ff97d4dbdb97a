//go:build unix

package wasm

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockWorkRoot takes an exclusive lock on root for the life of the Backend:
// removing an earlier process's leftovers from a WorkRoot that a live
// process still uses would delete its kernels' files. The OS drops the lock
// when its holder dies, kill -9 included.
func lockWorkRoot(root string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(root, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock work root: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("work root %s is in use by another live wasm backend (one per WorkRoot): %w", root, err)
	}
	return f, nil
}
