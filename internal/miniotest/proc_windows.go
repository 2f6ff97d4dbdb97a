package miniotest

import (
	"errors"
	"os"
)

const sharedPrefix = "triad-miniotest-"

// terminate stops MinIO; Windows has no SIGTERM, so it is killed.
func terminate(p *os.Process) error { return p.Kill() }

func sweepStale() {}

// suspend is not possible on Windows: resuming is a no-op, stopping fails.
func suspend(p *os.Process, stop bool) error {
	if stop {
		return errors.New("suspending a process is not supported on Windows")
	}
	return nil
}
