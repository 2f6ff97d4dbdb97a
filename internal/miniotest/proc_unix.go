//go:build unix

package miniotest

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// sharedPrefix names the shared server's temp directory, followed by the
// owning test binary's pid, so a later run can sweep directories left by a
// binary that died without StopShared.
const sharedPrefix = "triad-miniotest-"

// terminate asks MinIO to shut down cleanly.
func terminate(p *os.Process) error {
	if err := p.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// sweepStale removes shared-server directories whose test binary is gone.
func sweepStale() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), sharedPrefix+"*"))
	for _, m := range matches {
		rest := strings.TrimPrefix(filepath.Base(m), sharedPrefix)
		pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(m)
		}
	}
}
