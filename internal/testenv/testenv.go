// Package testenv decides whether a test that needs a real engine (Docker, MinIO) runs, skips or fails.
//
// Locally a missing engine skips the test with a message naming what is
// missing. Under CI (the CI variable is set, as .ci/run does) a missing engine
// fails the test instead, so CI can never go green by skipping.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
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

// Golden compares got with the golden file at path; with update it
// rewrites the file instead. A difference fails the test with the first
// lines that differ and the command that accepts the change.
func Golden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is out of date: review the change, then run go test -run '^%s$' -update in its package and commit the file\n%s",
			path, t.Name(), lineDiff(want, got))
	}
}

// lineDiff shows the lines where want and got differ (the first 20).
func lineDiff(want, got []byte) string {
	wl, gl := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var out bytes.Buffer
	shown := 0
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g []byte
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if bytes.Equal(w, g) {
			continue
		}
		fmt.Fprintf(&out, "line %d:\n- %s\n+ %s\n", i+1, w, g)
		if shown++; shown == 20 {
			out.WriteString("...\n")
			break
		}
	}
	return out.String()
}

// Patience is how long a test waits for something that takes quiet on a
// quiet machine: until the test binary's deadline (go test -timeout) less a
// minute to report, and never less than quiet. A loaded machine (CI beside
// other builds, kernels under gVisor) takes many times longer than a quiet
// one, and a deadline load can miss is a bug, not a guard.
func Patience(t testing.TB, quiet time.Duration) time.Duration {
	d := 30 * time.Minute
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := dt.Deadline(); ok {
			d = time.Until(dl) - time.Minute
		}
	}
	return max(d, quiet)
}
