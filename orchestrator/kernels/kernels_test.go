package kernels_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func setup(t *testing.T, warm int, ttl time.Duration) (*kernels.Manager, *tmpfs.Store) {
	t.Helper()
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	wb, err := wasm.New(context.Background(), wasm.Config{WorkRoot: filepath.Join(dir, "work"), CacheDir: filepath.Join(os.TempDir(), "triad-test-wazero-cache")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wb.Close() })
	m := kernels.New(kernels.Config{Backend: wb, Store: store, Warm: warm, IdleTTL: ttl})
	t.Cleanup(func() { m.Close() })
	return m, store
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run claims a pooled kernel, finds its files materialised in it, keeps
// its kernel across calls, and the pool refills.
func TestPoolAndMaterialise(t *testing.T) {
	m, store := setup(t, 2, 0)
	ctx := t.Context()
	waitFor(t, "the pool to fill", func() bool { return m.Pooled() == 2 })
	run := runid.New()
	if _, err := store.WriteBytes(ctx, run, "in/data.csv", []byte("a\n1\n")); err != nil {
		t.Fatal(err)
	}
	s, err := m.Acquire(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Fresh || m.Pooled() != 1 {
		t.Fatalf("got fresh=%v pooled=%d, want a fresh session from the pool", s.Fresh, m.Pooled())
	}
	res, err := s.Kernel.Execute(ctx, "x = open('in/data.csv').read()\nlen(x)", 10*time.Second)
	if err != nil || !res.OK || res.Value == nil || string(res.Value.Data["text/plain"]) != `"4"` {
		t.Fatalf("the materialised file is not readable: %+v %v", res, err)
	}
	s2, err := m.Acquire(ctx, run)
	if err != nil || s2.Kernel != s.Kernel || s2.Fresh {
		t.Fatalf("a second Acquire got another kernel: %v", err)
	}
	waitFor(t, "the pool to refill", func() bool { return m.Pooled() == 2 })
	if m.Live() != 1 {
		t.Fatalf("live = %d, want 1", m.Live())
	}
}

// An idle kernel is stopped; the run's files stay, and the next Acquire
// starts a fresh kernel with them.
func TestIdleReaper(t *testing.T) {
	m, store := setup(t, 0, 300*time.Millisecond)
	ctx := t.Context()
	run := runid.New()
	s, err := m.Acquire(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Kernel.Execute(ctx, "y = 1\nopen('kept.txt','w').write('kept')", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Dir.Harvest(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reaper", func() bool { return m.Live() == 0 })
	if _, err := store.Stat(ctx, run, "kept.txt"); err != nil {
		t.Fatalf("the run's file went with its kernel: %v", err)
	}
	s2, err := m.Acquire(ctx, run)
	if err != nil || !s2.Fresh {
		t.Fatalf("got %v fresh=%v, want a fresh kernel", err, s2 != nil && s2.Fresh)
	}
	res, _ := s2.Kernel.Execute(ctx, "print(open('kept.txt').read())\nprint('y' in dir())", 10*time.Second)
	if res.Stdout != "kept\nFalse\n" {
		t.Fatalf("got %q, want the file back and the variable gone", res.Stdout)
	}
}

func TestClose(t *testing.T) {
	m, _ := setup(t, 1, 0)
	waitFor(t, "the pool", func() bool { return m.Pooled() == 1 })
	if _, err := m.Acquire(t.Context(), runid.New()); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Acquire(t.Context(), runid.New()); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Acquire after Close: got %v, want ErrClosed", err)
	}
}
