package kernels_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/orchestrator/workspace"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func newStore(t *testing.T) (*tmpfs.Store, string) {
	t.Helper()
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil), dir
}

// backends are the real backends the manager is tested over.
var backends = map[string]func(t *testing.T, dir string) sandbox.Backend{
	"wasm": func(t *testing.T, dir string) sandbox.Backend {
		wb, err := wasm.New(context.Background(), wasm.Config{WorkRoot: filepath.Join(dir, "work"), CacheDir: filepath.Join(os.TempDir(), "triad-test-wazero-cache")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { wb.Close() })
		return wb
	},
	"docker": func(t *testing.T, dir string) sandbox.Backend {
		return orchestratortest.Docker(t, filepath.Join(dir, "work"))
	},
}

// kubeBackend opens a sandbox/kube backend on the test cluster
// (scripts/kube.sh env prints the variables), as the only replica of a
// deployment of the test's own, whose pods go when the test ends. Its
// pod sweep deletes run pods unused for idle (0: never).
func kubeBackend(t *testing.T, idle time.Duration) sandbox.Backend {
	t.Helper()
	kc, ns, image := os.Getenv("TRIAD_KUBECONFIG"), os.Getenv("TRIAD_KUBE_NAMESPACE"), os.Getenv("TRIAD_KUBE_IMAGE")
	for name, v := range map[string]string{"TRIAD_KUBECONFIG": kc, "TRIAD_KUBE_NAMESPACE": ns, "TRIAD_KUBE_IMAGE": image} {
		if v == "" {
			testenv.Missing(t, name+` (eval "$(scripts/kube.sh env)" sets it)`)
		}
	}
	rc, err := kube.RestConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	owner := strings.Trim(fmt.Sprintf("t%d-%s-%d", os.Getpid()%10000, strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())), time.Now().UnixNano()%100000), "-.")
	if len(owner) > 50 {
		owner = owner[len(owner)-50:]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := kube.New(ctx, kube.Config{Rest: rc, Namespace: ns, Image: image, Owner: strings.Trim(owner, "-."), IdleTTL: idle,
		RuntimeClass: os.Getenv("TRIAD_KUBE_RUNTIME_CLASS"), SeccompProfile: os.Getenv("TRIAD_KUBE_SECCOMP_PROFILE"),
		WorkDriver: os.Getenv("TRIAD_KUBE_WORK_DRIVER"),
		Defaults:   sandbox.Limits{MemoryBytes: 512 << 20, DiskBytes: 256 << 20}, MemoryRequest: 64 << 20, CPURequest: 0.05, TmpSize: 64 << 20,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatalf("kube.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func setup(t *testing.T, backend string, warm int, ttl time.Duration) (*kernels.Manager, *tmpfs.Store, *recorder) {
	t.Helper()
	store, dir := newStore(t)
	var be sandbox.Backend
	if backend == "kube" {
		// The kube backend reaps on its own too: a sweep of run pods
		// unused for the TTL, besides the manager's detaching.
		be = kubeBackend(t, ttl)
	} else {
		be = backends[backend](t, dir)
	}
	rec := &recorder{Backend: be}
	m := kernels.New(kernels.Config{Backend: rec, Store: store, Warm: warm, IdleTTL: ttl})
	t.Cleanup(func() { m.Close() })
	return m, store, rec
}

// recorder is a real backend that remembers the kernels it started, so a
// test can tell a pooled kernel from a new one without racing the pool's
// refiller.
type recorder struct {
	sandbox.Backend
	mu      sync.Mutex
	started []sandbox.Kernel
	owner   map[sandbox.Kernel]string
}

func (r *recorder) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	k, err := r.Backend.Start(ctx, spec)
	if err == nil {
		r.mu.Lock()
		r.started = append(r.started, k)
		if r.owner == nil {
			r.owner = map[sandbox.Kernel]string{}
		}
		r.owner[k] = spec.Owner
		r.mu.Unlock()
	}
	return k, err
}

// Unwrap implements sandbox.Wrapper, so that the recorded backend's
// abilities (a kube backend's own pool) stay visible.
func (r *recorder) Unwrap() sandbox.Backend { return r.Backend }

// owners returns the Spec.Owner of every kernel started, in order.
func (r *recorder) owners() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var o []string
	for _, k := range r.started {
		o = append(o, r.owner[k])
	}
	return o
}

// first returns the first n kernels started.
func (r *recorder) first(n int) []sandbox.Kernel {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sandbox.Kernel(nil), r.started[:min(n, len(r.started))]...)
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

// execute runs code in the session's kernel and returns how it ended and
// what it printed.
func execute(t *testing.T, s *kernels.Session, code string, timeout time.Duration) (*sandbox.Result, *sandbox.Collector) {
	t.Helper()
	var col sandbox.Collector
	res, err := s.Kernel.Execute(t.Context(), sandbox.Cell{Code: code, Timeout: timeout, Output: col.Add})
	if err != nil {
		t.Fatalf("Execute(%q): %v", code, err)
	}
	return res, &col
}

// A run claims a pooled kernel, finds its files materialised in it, keeps
// its kernel across calls, and the pool refills.
func TestPoolAndMaterialise(t *testing.T) {
	m, store, rec := setup(t, "wasm", 2, 0)
	ctx := t.Context()
	waitFor(t, "the pool to fill", func() bool { return m.Pooled() == 2 })
	pooled := rec.first(2)
	run := runid.New()
	if _, err := store.WriteBytes(ctx, run, "in/data.csv", []byte("a\n1\n")); err != nil {
		t.Fatal(err)
	}
	s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever the refiller has done since, the session's kernel is one of
	// the two that were in the pool.
	if !s.Fresh || (s.Kernel != pooled[0] && s.Kernel != pooled[1]) {
		t.Fatalf("got fresh=%v kernel %s, want a fresh session with a pooled kernel (%s or %s)", s.Fresh, s.Kernel.ID(), pooled[0].ID(), pooled[1].ID())
	}
	res, col := execute(t, s, "x = open('in/data.csv').read()\nlen(x)", 10*time.Second)
	if !res.OK || col.Value == nil || string(col.Value.Data["text/plain"]) != `"4"` {
		t.Fatalf("the materialised file is not readable: %+v %+v", res, col.Value)
	}
	m.Release(s)
	s2, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
	if err != nil || s2.Kernel != s.Kernel || s2.Fresh {
		t.Fatalf("a second Acquire got another kernel: %v", err)
	}
	m.Release(s2)
	waitFor(t, "the pool to refill", func() bool { return m.Pooled() == 2 })
	if m.Live() != 1 {
		t.Fatalf("live = %d, want 1", m.Live())
	}
}

// ownPool is a real backend that says it keeps its own warm pool
// (sandbox.Pool), as sandbox/kube does.
type ownPool struct {
	sandbox.Backend
	pooled int
}

func (p *ownPool) Pooled() int { return p.pooled }

// A backend with its own pool is asked for it, through a wrapper like
// metrics' as triad serve has: the manager keeps no pool beside it (every
// kernel it starts is for a run, whatever Warm says), and Pooled reports
// the backend's.
func TestBackendOwnPool(t *testing.T) {
	store, dir := newStore(t)
	rec := &recorder{Backend: &ownPool{Backend: backends["wasm"](t, dir), pooled: 7}}
	m := kernels.New(kernels.Config{Backend: metrics.New().Backend(rec), Store: store, Warm: 2})
	if got := m.Pooled(); got != 7 {
		t.Fatalf("Pooled() = %d, want the backend's 7", got)
	}
	run := runid.New()
	s, err := m.Acquire(t.Context(), run, sandbox.Spec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Release(s)
	m.Close() // waits for a pool filler, had there been one
	if got, want := rec.owners(), []string{run.String()}; !slices.Equal(got, want) {
		t.Fatalf("kernels started for owners %q, want only %q (no warm kernel beside the backend's pool)", got, want)
	}
}

// An idle kernel is stopped; the run's files stay, and the next Acquire
// starts a fresh kernel with them.
func TestIdleReaper(t *testing.T) {
	m, store, _ := setup(t, "wasm", 0, 300*time.Millisecond)
	ctx := t.Context()
	run := runid.New()
	s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	execute(t, s, "y = 1\nopen('kept.txt','w').write('kept')", 10*time.Second)
	if _, err := s.Dir.Harvest(ctx); err != nil {
		t.Fatal(err)
	}
	m.Release(s)
	waitFor(t, "the reaper", func() bool { return m.Live() == 0 })
	if _, err := store.Stat(ctx, run, "kept.txt"); err != nil {
		t.Fatalf("the run's file went with its kernel: %v", err)
	}
	s2, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
	if err != nil || !s2.Fresh {
		t.Fatalf("got %v fresh=%v, want a fresh kernel", err, s2 != nil && s2.Fresh)
	}
	_, col := execute(t, s2, "print(open('kept.txt').read())\nprint('y' in dir())", 10*time.Second)
	if got := col.Stdout.String(); got != "kept\nFalse\n" {
		t.Fatalf("got %q, want the file back and the variable gone", got)
	}
	m.Release(s2)
}

// A kernel running a cell, or having its files harvested, is not idle: a
// cell sleeping past the idle TTL, within its timeout, finishes normally,
// and all the files it wrote are stored. Once released, the kernel is
// reaped. On kube both reapers are at work: the manager's detaching and
// the backend's sweep of run pods, whose shortest period is a second, so
// there the cell sleeps several periods.
func TestBusyKernelIsNotReaped(t *testing.T) {
	for _, backend := range []string{"wasm", "docker", "kube"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ttl, sleep := 200*time.Millisecond, 2
			if backend == "kube" {
				ttl, sleep = 3*time.Second, 10
			}
			m, store, _ := setup(t, backend, 0, ttl)
			ctx := t.Context()
			run := runid.New()
			s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The cell outlasts the TTL many times over, and so does the
			// harvest of its 10,000 files.
			res, col := execute(t, s, fmt.Sprintf(`import os, time
os.makedirs('many', exist_ok=True)
for i in range(10000):
    with open('many/f%%05d.txt' %% i, 'w') as f:
        f.write(str(i))
time.sleep(%d)
'slept'`, sleep), 5*time.Minute)
			if !res.OK || res.Restarted || col.Value == nil {
				t.Fatalf("the sleeping cell: got %+v, want it to finish normally", res.Error)
			}
			ch, err := s.Dir.Harvest(ctx)
			if err != nil {
				t.Fatalf("harvest: %v", err)
			}
			m.Release(s)
			if len(ch.Written) != 10000 {
				t.Errorf("harvested %d files, want 10000", len(ch.Written))
			}
			files, err := store.List(ctx, run, "many/")
			if err != nil || len(files) != 10000 {
				t.Errorf("the store holds %d files, %v; want 10000", len(files), err)
			}
			waitFor(t, "the reaper, once the kernel is released", func() bool { return m.Live() == 0 })
		})
	}
}

// A 100 GB sparse file in the working directory adds nothing near its
// apparent size to the store: the harvest refuses it and says why.
func TestSparseFileNotHarvested(t *testing.T) {
	for _, backend := range []string{"wasm", "docker"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			m, store, _ := setup(t, backend, 0, 0)
			ctx := t.Context()
			run := runid.New()
			s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Release(s)
			// One byte at 100 GB: a file of that apparent size on a few
			// blocks, within any disk quota.
			res, _ := execute(t, s, "with open('huge.bin', 'wb') as f:\n    f.seek(100 << 30)\n    f.write(b'x')\nopen('small.txt', 'w').write('small')", time.Minute)
			if !res.OK {
				t.Fatalf("making the sparse file: %+v", res.Error)
			}
			ch, err := s.Dir.Harvest(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ch.Refused) != 1 || ch.Refused[0].Path != "huge.bin" || ch.Refused[0].Size != 100<<30+1 || !strings.Contains(ch.Refused[0].Reason, "sparse") {
				t.Errorf("refused: got %+v, want huge.bin, refused as sparse", ch.Refused)
			}
			if len(ch.Written) != 1 || ch.Written[0].Path != "small.txt" {
				t.Errorf("written: got %+v, want small.txt alone", ch.Written)
			}
			if _, err := store.Stat(ctx, run, "huge.bin"); !errors.Is(err, tmpfs.ErrNotFound) {
				t.Errorf("huge.bin in the store: %v, want not found", err)
			}
		})
	}
}

// A harvest cut short by Close fails with an error that says so, and what
// it reports stored is stored: never a success with files missing.
func TestHarvestInterruptedByClose(t *testing.T) {
	m, store, _ := setup(t, "wasm", 0, 0)
	ctx := t.Context()
	run := runid.New()
	s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := execute(t, s, "for i in range(10000):\n    open('f%05d.txt' % i, 'w').write(str(i))", 5*time.Minute)
	if !res.OK {
		t.Fatalf("writing the files: %+v", res.Error)
	}
	type harvested struct {
		ch  workspace.Change
		err error
	}
	done := make(chan harvested, 1)
	go func() {
		ch, err := s.Dir.Harvest(ctx)
		done <- harvested{ch, err}
	}()
	// Close once the harvest is under way.
	waitFor(t, "the harvest to start", func() bool {
		files, _ := store.List(ctx, run, "")
		return len(files) > 0
	})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	h := <-done
	files, err := store.List(ctx, run, "")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case h.err == nil:
		// The harvest beat Close: then every file is there.
		if len(h.ch.Written) != 10000 || len(files) != 10000 {
			t.Fatalf("a harvest that reports success stored %d (store holds %d), want 10000", len(h.ch.Written), len(files))
		}
	case errors.Is(h.err, workspace.ErrIncomplete) && errors.Is(h.err, sandbox.ErrClosed):
		if len(files) != len(h.ch.Written) {
			t.Errorf("the harvest reports %d stored, the store holds %d", len(h.ch.Written), len(files))
		}
		t.Logf("Close stopped the harvest after %d files: %v", len(h.ch.Written), h.err)
	default:
		t.Fatalf("harvest: got %v, want success or an error matching ErrIncomplete and ErrClosed", h.err)
	}
}

func TestClose(t *testing.T) {
	m, _, _ := setup(t, "wasm", 1, 0)
	waitFor(t, "the pool", func() bool { return m.Pooled() == 1 })
	if _, err := m.Acquire(t.Context(), runid.New(), sandbox.Spec{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Acquire(t.Context(), runid.New(), sandbox.Spec{}, nil); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Acquire after Close: got %v, want ErrClosed", err)
	}
}

// usedLog keeps what OnUsed was told, per run.
type usedLog struct {
	mu  sync.Mutex
	got map[runid.ID][]kernels.Used
}

func (l *usedLog) add(_ context.Context, run runid.ID, u kernels.Used) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.got == nil {
		l.got = map[runid.ID][]kernels.Used{}
	}
	l.got[run] = append(l.got[run], u)
}

func (l *usedLog) of(run runid.ID) []kernels.Used {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got[run])
}

// A run's live kernel is read after a step (Meter), every MeterEvery,
// and once more when it stops; then never again. Docker measures CPU
// time; wasm does not, and says so (CPUKnown false), with the
// interpreter's memory.
func TestMeterReadsRunKernels(t *testing.T) {
	for _, backend := range []string{"wasm", "docker"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			store, dir := newStore(t)
			m := kernels.New(kernels.Config{Backend: backends[backend](t, dir), Store: store, MeterEvery: 50 * time.Millisecond})
			t.Cleanup(func() { m.Close() })
			var log usedLog
			m.OnUsed(log.add)
			ctx := t.Context()
			run := runid.New()
			s, err := m.Acquire(ctx, run, sandbox.Spec{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			execute(t, s, "x = 0\nfor i in range(300_000):\n    x += i\nkeep = bytearray(8 << 20)", 60*time.Second)
			m.Release(s)
			m.Meter(ctx, run)
			got := log.of(run)
			if len(got) == 0 {
				t.Fatal("Meter read nothing")
			}
			var cpu time.Duration
			var peak int64
			var byteSeconds float64
			for _, u := range got {
				if u.CPUKnown != (backend == "docker") {
					t.Errorf("CPUKnown %v on %s", u.CPUKnown, backend)
				}
				cpu += u.CPU
				peak = max(peak, u.Memory)
				byteSeconds += u.MemoryByteSeconds
			}
			if backend == "docker" && cpu <= 0 {
				t.Errorf("CPU time: got %v, want some", cpu)
			}
			if peak < 8<<20 || byteSeconds <= 0 {
				t.Errorf("memory: got peak %d and %v byte-seconds, want at least 8 MiB held for a while", peak, byteSeconds)
			}
			n := len(got)
			waitFor(t, "a periodic reading", func() bool { return len(log.of(run)) > n })
			m.Drop(run)
			n = len(log.of(run))
			m.Meter(ctx, run)
			m.MeterAll(ctx)
			if got := len(log.of(run)); got != n {
				t.Errorf("a stopped kernel was read %d more times", got-n)
			}
		})
	}
}
