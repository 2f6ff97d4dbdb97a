package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image/imagetest"
)

// sandboxImage returns the real sandbox image (imagetest.Tag).
func sandboxImage(t testing.TB) string { return imagetest.Tag(t) }

// newBackend starts a Backend on a fresh WorkRoot and closes it when the
// test ends.
func newBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	cfg.Image = sandboxImage(t)
	if cfg.Runtime == "" {
		cfg.Runtime = testenv.DockerRuntime()
	}
	if cfg.WorkRoot == "" {
		cfg.WorkRoot = t.TempDir()
	}
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Backend.Close: %v", err)
		}
	})
	return b
}

func startKernel(t testing.TB, b *Backend, spec sandbox.Spec) sandbox.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience(t, 2*time.Minute))
	defer cancel()
	k, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// result is a finished cell: how it ended and what it printed.
type result struct {
	*sandbox.Result
	sandbox.Collector
	delivered int64 // bytes of output delivered
}

// run1 runs a cell and fails the test when the call itself errs.
func run1(t testing.TB, k sandbox.Kernel, code string, timeout time.Duration) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer cancel()
	r := &result{}
	res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: timeout, Output: func(e sandbox.Event) {
		r.delivered += e.Size()
		r.Add(e)
	}})
	if err != nil {
		t.Fatalf("Execute(%q): %v", firstLine(code), err)
	}
	r.Result = res
	return r
}

// mustOK runs a cell that has to succeed and returns its stdout.
func mustOK(t testing.TB, k sandbox.Kernel, code string) string {
	t.Helper()
	res := run1(t, k, code, testenv.Patience(t, 60*time.Second))
	if !res.OK {
		t.Fatalf("cell %q failed: %s", firstLine(code), describe(res))
	}
	return res.Stdout.String()
}

// value returns the text/plain of a result's execute_result.
func value(t testing.TB, res *result) string {
	t.Helper()
	if res.Value == nil {
		t.Fatalf("no execute_result: %s", describe(res))
	}
	var s string
	if err := json.Unmarshal(res.Value.Data["text/plain"], &s); err != nil {
		t.Fatalf("text/plain of %v: %v", res.Value.Data, err)
	}
	return s
}

func describe(res *result) string {
	b, _ := json.Marshal(res.Result)
	return fmt.Sprintf("%s stdout=%.300q stderr=%.300q", b, res.Stdout.String(), res.Stderr.String())
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
