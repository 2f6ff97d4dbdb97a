package kernels_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
)

// gated is a real backend whose starts wait for a gate, and which records
// the owners it started, in order, and the most starts it saw at once.
type gated struct {
	sandbox.Backend
	gate chan struct{}

	mu      sync.Mutex
	owners  []string
	running int
	most    int
}

func (g *gated) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	g.mu.Lock()
	g.owners = append(g.owners, spec.Owner)
	g.running++
	g.most = max(g.most, g.running)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.running--
		g.mu.Unlock()
	}()
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Backend.Start(ctx, spec)
}

func (g *gated) started() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.owners...)
}

// Runs beyond Config.Starts wait for a start slot and get it in the order
// they came; a run whose caller gives up while waiting leaves the queue
// without taking a slot; and no more than Starts kernels start at once.
func TestStartAdmissionIsFIFO(t *testing.T) {
	t.Parallel()
	for _, starts := range []int{1, 2} {
		t.Run(fmt.Sprint("starts=", starts), func(t *testing.T) {
			t.Parallel()
			store, dir := newStore(t)
			g := &gated{Backend: backends["wasm"](t, dir), gate: make(chan struct{})}
			m := kernels.New(kernels.Config{Backend: g, Store: store, Starts: starts})
			t.Cleanup(func() { m.Close() })

			const n = 6
			runs := make([]runid.ID, n)
			errs := make(chan error, n+1)
			acquire := func(ctx context.Context, run runid.ID) {
				s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
				if err == nil {
					m.Release(s)
				}
				errs <- err
			}
			// The first `starts` runs take the slots and block in Start.
			for i := range starts {
				runs[i] = runid.New()
				go acquire(t.Context(), runs[i])
			}
			waitFor(t, "the first starts", func() bool { return len(g.started()) == starts })
			// The rest queue one by one; one of them gives up.
			quitter, quit := context.WithCancel(t.Context())
			queued := 0
			for i := starts; i < n; i++ {
				runs[i] = runid.New()
				go acquire(t.Context(), runs[i])
				queued++
				waitFor(t, "a run to queue", func() bool { return m.Waiting() == queued })
				if i == starts {
					go acquire(quitter, runid.New())
					queued++
					waitFor(t, "the quitter to queue", func() bool { return m.Waiting() == queued })
				}
			}
			quit()
			if err := <-errs; !errors.Is(err, context.Canceled) {
				t.Fatalf("the run that gave up: got %v, want context.Canceled", err)
			}
			if got, want := m.Waiting(), n-starts; got != want {
				t.Fatalf("waiting after one gave up: got %d, want %d", got, want)
			}
			close(g.gate)
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			got := g.started()
			if len(got) != n {
				t.Fatalf("starts: got %d (%v), want %d", len(got), got, n)
			}
			// With one slot the order is exact; with more, runs granted
			// together may reach Start in either order, so compare the
			// order slot by slot.
			for i := 0; i < n; i += starts {
				want := map[string]bool{}
				for _, r := range runs[i:min(i+starts, n)] {
					want[r.String()] = true
				}
				for _, o := range got[i:min(i+starts, n)] {
					if !want[o] {
						t.Errorf("start %d: got run %s, want one of %v (arrival order %v, started %v)", i, o, want, runs, got)
					}
				}
			}
			g.mu.Lock()
			most := g.most
			g.mu.Unlock()
			if most > starts {
				t.Errorf("starts at once: got %d, want at most %d", most, starts)
			}
		})
	}
}

// A waiting run takes a kernel that reaches the warm pool before its
// start slot comes, and the pool's filler never takes a slot while a run
// waits.
func TestWaitingRunTakesPooledKernel(t *testing.T) {
	t.Parallel()
	store, dir := newStore(t)
	g := &gated{Backend: backends["wasm"](t, dir), gate: make(chan struct{})}
	m := kernels.New(kernels.Config{Backend: g, Store: store, Starts: 1, Warm: 1})
	t.Cleanup(func() { m.Close() })
	// The filler holds the only slot, blocked in Start.
	waitFor(t, "the filler's start", func() bool { return len(g.started()) == 1 })
	done := make(chan error, 1)
	go func() {
		s, err := m.Acquire(t.Context(), runid.New(), sandbox.Spec{}, nil)
		if err == nil {
			m.Release(s)
		}
		done <- err
	}()
	waitFor(t, "the run to queue", func() bool { return m.Waiting() == 1 })
	close(g.gate)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting run did not get the pooled kernel")
	}
	if got := g.started(); len(got) < 1 || got[0] != "" {
		t.Fatalf("starts: got owners %q, want the filler's (\"\") first", got)
	}
	// The run was served by the filler's kernel, not a start of its own.
	for _, o := range g.started() {
		if o != "" {
			t.Errorf("a start for the run (owner %q): want the pooled kernel to serve it", o)
		}
	}
}
