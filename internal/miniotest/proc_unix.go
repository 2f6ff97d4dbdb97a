//go:build unix

package miniotest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// suspend stops (SIGSTOP) or continues (SIGCONT) the process.
func suspend(p *os.Process, stop bool) error {
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if err := p.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if stop {
		// The signal is queued, not acted on: a busy server keeps
		// answering until every thread has stopped. Wait for that, so a
		// test that freezes the server knows it is frozen.
		waitStopped(p.Pid)
	}
	return nil
}

// waitStopped waits, up to 5 s, until every thread of pid is stopped, as
// /proc shows. Where there is no /proc it waits briefly instead.
func waitStopped(pid int) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	if _, err := os.Stat(dir); err != nil {
		time.Sleep(100 * time.Millisecond)
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !allStopped(dir) {
		time.Sleep(time.Millisecond)
	}
}

func allStopped(taskDir string) bool {
	tasks, err := os.ReadDir(taskDir)
	if err != nil {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(taskDir, task.Name(), "stat"))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses
		// and may itself contain spaces or parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
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
