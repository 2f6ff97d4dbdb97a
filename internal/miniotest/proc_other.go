//go:build !linux

package miniotest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: there, call
// StopShared from TestMain so the shared server does not outlive the tests.
func sysProcAttr() *syscall.SysProcAttr { return nil }
