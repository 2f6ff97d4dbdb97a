// Package testenv decides whether a test that needs a real engine (Docker, MinIO) runs, skips or fails.
//
// Locally a missing engine skips the test with a message naming what is
// missing. Under CI (the CI variable is set, as .ci/run does) a missing engine
// fails the test instead, so CI can never go green by skipping.
package testenv

import (
	"bytes"
	"os"
	"sync"
	"testing"
)

// InCI reports whether the tests run under CI, where nothing may be skipped.
func InCI() bool { return os.Getenv("CI") != "" }

// Missing stops the test because a dependency is absent: a skip locally, a
// failure under CI. what names the daemon or variable that is missing.
func Missing(t testing.TB, what string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is required under CI but missing; .ci/run must install and start it", what)
	}
	t.Skipf("skipping: %s is missing (set it up, or run .ci/run)", what)
}

// Buffer collects writes from other goroutines or processes (a server's
// logs, a child's output) for the test to read; it is safe for concurrent
// use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// DockerRuntime is the OCI runtime tests run Docker kernels under:
// TRIAD_DOCKER_RUNTIME ("runc", "runsc" or "auto"), as `triad serve`
// reads it; "" (unset) is auto, runsc when the engine has it.
// scripts/test.sh runs the suites that must hold under both runtimes once
// with each.
func DockerRuntime() string { return os.Getenv("TRIAD_DOCKER_RUNTIME") }
