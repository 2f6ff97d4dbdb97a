package miniotest

import "syscall"

// sysProcAttr makes the kernel send MinIO SIGTERM when the thread that
// started it exits (see proc.start), so a test binary that dies, or never
// calls StopShared, does not leave a server running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
