// Package orchestratortest builds a real Triad stack (store, sandbox, journal, evaluator, fake search) for tests of the core and the surfaces above it.
package orchestratortest

import (
	"context"
	"fmt"
	"github.com/triadhq/triad/internal/runid"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/image/imagetest"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

// Options choose the stack's parts.
type Options struct {
	// Sandbox is "docker", "wasm", "kube" (the test cluster of
	// scripts/kube.sh, from its TRIAD_KUBE* variables) or "" (none).
	Sandbox string
	// Warm is the kernel pool size.
	Warm int
	// Search starts a fake Tavily and wires a real client to it.
	Search bool
	// Dir is the data directory; empty means a fresh temp dir. Reusing a
	// Dir across two stacks simulates a restart.
	Dir string
	// Store, when set, is the file store (an S3 store, say) instead of a
	// local one under Dir. Reusing it across two stacks simulates a restart.
	Store *tmpfs.Store
	// Quotas bound each tenant.
	Quotas orchestrator.Quotas
	// Metrics, when set, counts the stack's calls, store and kernels.
	Metrics *metrics.Metrics
	// KernelIdle stops a run's kernel unused this long (0 never).
	KernelIdle time.Duration
	// RunIdle is orchestrator.Config.RunIdle: how long an unused run
	// keeps its in-memory state (0 the default).
	RunIdle time.Duration
	// InterruptGrace is the Docker backend's Config.InterruptGrace (0
	// its default). Tests that need an interrupted cell to keep its
	// kernel set it high, so a loaded CI host's slow interrupt does not
	// turn into a restart.
	InterruptGrace time.Duration
	// Templates, Egress and EgressTrust are orchestrator.Config's: the
	// sandbox templates runs choose from, the egress proxy (with a test
	// resolver, egresstest.Resolver) and the extra CAs kernels trust.
	Templates   *template.Set
	Egress      *egress.Proxy
	EgressTrust []byte
	// EvalFault, when set, wraps the evaluator's interpreter: a test's
	// fault hook (an evaluator made slow, say). EvalTimeout is the
	// evaluator's Config.Timeout (0 its default).
	EvalFault   func(evaluator.Interpreter) evaluator.Interpreter
	EvalTimeout time.Duration
	// WrapBackend, when set, wraps the sandbox backend the kernel manager
	// starts kernels from: a test's probe (counting live kernels, say).
	WrapBackend func(sandbox.Backend) sandbox.Backend
}

// Stack is an assembled orchestrator and its parts.
type Stack struct {
	Dir     string
	Store   *tmpfs.Store
	Kernels *kernels.Manager
	Orch    *orchestrator.Orchestrator
	Backend string
	Tavily  *tavilytest.Server
	// Keys holds the stack's API keys, in the store's records. Key is one
	// of them (scope runs, tenant "default"), and Principal its caller:
	// tests make their calls with Ctx, as that key, so authentication and
	// tenancy are exercised everywhere, not only in their own tests.
	Keys      *keys.Store
	Key       string
	Principal auth.Principal

	closers []func()
	once    sync.Once
}

// Ctx returns t's context carrying the stack's principal.
func (s *Stack) Ctx(t testing.TB) context.Context {
	ctx := context.Background()
	if tt, ok := t.(interface{ Context() context.Context }); ok {
		ctx = tt.Context()
	}
	return auth.With(ctx, s.Principal)
}

// Trace returns the run's trace records as a reader of the run sees them,
// with every call that has answered recorded.
func (s *Stack) Trace(ctx context.Context, run runid.ID) ([]orchestrator.TraceRecord, error) {
	return Trace(ctx, s.Orch, run)
}

// Trace returns run's trace records as o's readers see them.
func Trace(ctx context.Context, o *orchestrator.Orchestrator, run runid.ID) ([]orchestrator.TraceRecord, error) {
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		return nil, err
	}
	return rr.Trace(ctx)
}

// Close stops the stack as a server stops: kernels, the sandbox backend,
// the evaluator and the local store's index, in that order, leaving the
// store's files. It runs when the test ends, and may run before to
// simulate a restart.
func (s *Stack) Close() {
	s.once.Do(func() {
		for i := len(s.closers) - 1; i >= 0; i-- {
			s.closers[i]()
		}
	})
}

func (s *Stack) onClose(f func()) { s.closers = append(s.closers, f) }

var (
	evalOnce sync.Once
	evalWasm *wasm.Backend
	evalErr  error
)

// wazeroCache is shared by every test process so python.wasm compiles once.
func wazeroCache() string { return filepath.Join(os.TempDir(), "triad-test-wazero-cache") }

// New builds a stack; everything is closed when the test ends.
func New(t testing.TB, o Options) *Stack {
	t.Helper()
	ctx := context.Background()
	s := &Stack{Dir: o.Dir}
	// The directory is registered first so that it is removed last, after
	// Close has stopped the kernels and unmounted their working directories.
	if s.Dir == "" {
		s.Dir = t.TempDir()
	}
	t.Cleanup(s.Close)
	s.Store = o.Store
	if s.Store == nil {
		b, err := local.NewBlobs(filepath.Join(s.Dir, "store"))
		if err != nil {
			t.Fatal(err)
		}
		x, err := local.NewIndex(filepath.Join(s.Dir, "store"))
		if err != nil {
			t.Fatal(err)
		}
		s.onClose(func() { x.Close() })
		var blobs tmpfs.Blobs = b
		var index tmpfs.Index = x
		if o.Metrics != nil {
			blobs, index = o.Metrics.Store("local", b, x)
		}
		s.Store = tmpfs.New(blobs, index, nil)
	}

	var backend sandbox.Backend
	switch o.Sandbox {
	case "docker":
		db := newDocker(t, filepath.Join(s.Dir, "work", "docker"), o.InterruptGrace)
		s.onClose(func() { db.Close() })
		backend = db
	case "kube":
		kb := newKube(t)
		s.onClose(func() { kb.Close() })
		backend = kb
	case "wasm":
		wb, err := wasm.New(ctx, wasm.Config{WorkRoot: filepath.Join(s.Dir, "work", "wasm"), CacheDir: wazeroCache()})
		if err != nil {
			t.Fatal(err)
		}
		s.onClose(func() { wb.Close() })
		backend = wb
	}
	if backend != nil {
		s.Backend = backend.Name()
		kb := backend
		if o.WrapBackend != nil {
			kb = o.WrapBackend(kb)
		}
		if o.Metrics != nil {
			kb = o.Metrics.Backend(backend)
		}
		s.Kernels = kernels.New(kernels.Config{Backend: kb, Store: s.Store, Warm: o.Warm, IdleTTL: o.KernelIdle, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
		s.onClose(func() { s.Kernels.Close() })
		if o.Metrics != nil {
			o.Metrics.Kernels(backend.Name(), s.Kernels.Live, s.Kernels.Pooled)
		}
	}

	evalOnce.Do(func() {
		evalWasm, evalErr = wasm.New(ctx, wasm.Config{CacheDir: wazeroCache(), MemoryLimitBytes: 512 << 20})
	})
	if evalErr != nil {
		t.Fatal(evalErr)
	}
	var interp evaluator.Interpreter = evaluator.InterpreterFunc(func(ctx context.Context, script []byte, dir string) (evaluator.Process, error) {
		return evalWasm.StartProgram(ctx, script, dir)
	})
	if o.EvalFault != nil {
		interp = o.EvalFault(interp)
	}
	ev, err := evaluator.New(evaluator.Config{Interpreter: interp, Store: s.Store, Dir: filepath.Join(s.Dir, "eval"), Timeout: o.EvalTimeout})
	if err != nil {
		t.Fatal(err)
	}
	s.onClose(func() { ev.Close() })

	cfg := orchestrator.Config{Store: s.Store, Kernels: s.Kernels, Journal: cel.New(s.Store), Evaluator: ev, RunIdle: o.RunIdle,
		Templates: o.Templates, Egress: o.Egress, EgressTrust: o.EgressTrust}
	if o.Sandbox == "docker" {
		cfg.ImageDigest = func(ctx context.Context, ref string) (string, error) {
			cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
			if err != nil {
				return "", err
			}
			defer cli.Close()
			return image.Digest(ctx, cli, ref)
		}
	}
	if o.Search {
		s.Tavily = tavilytest.NewServer(t)
		tc, err := tavily.New(tavily.Config{APIKey: s.Tavily.Key, BaseURL: s.Tavily.URL, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Search = tc
	}
	cfg.Quotas = o.Quotas
	if o.Metrics != nil {
		cfg.Metrics = o.Metrics
	}
	s.Orch = orchestrator.New(cfg)
	// Closed first: it flushes the run index before the store closes.
	s.onClose(func() { s.Orch.Close() })
	s.Keys = keys.New(s.Store.Meta(), keys.Config{})
	if s.Key, _, err = s.Keys.Create(ctx, "orchestratortest", auth.DefaultTenant, []auth.Scope{auth.Runs}); err != nil {
		t.Fatal(err)
	}
	if s.Principal, err = s.Keys.Authenticate(ctx, s.Key); err != nil {
		t.Fatal(err)
	}
	return s
}

// Image returns the sandbox image's tag, importing or building it on first
// use as CI does; a missing engine skips locally and fails under CI.
func Image(t testing.TB) string { return imagetest.Tag(t) }

// Docker returns a Docker backend over workRoot with the sandbox image; it
// is closed when the test ends.
func Docker(t testing.TB, workRoot string) *docker.Backend {
	t.Helper()
	b := newDocker(t, workRoot, 0)
	t.Cleanup(func() { b.Close() })
	return b
}

// newDocker is Docker without the cleanup, for the stack, which closes its
// kernel manager before the backend it starts kernels from.
func newDocker(t testing.TB, workRoot string, grace time.Duration) *docker.Backend {
	t.Helper()
	b, err := docker.New(context.Background(), docker.Config{Image: Image(t), WorkRoot: workRoot, InterruptGrace: grace, Runtime: testenv.DockerRuntime()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var kubeOwners atomic.Int64

// newKube opens a Kubernetes backend on the test cluster (the variables
// `eval "$(scripts/kube.sh up)"` sets), as a deployment of its own so that
// no other test's backend adopts or sweeps its pods. A missing cluster
// skips locally and fails under CI.
func newKube(t testing.TB) *kube.Backend {
	t.Helper()
	kc, ns, img := os.Getenv("TRIAD_KUBECONFIG"), os.Getenv("TRIAD_KUBE_NAMESPACE"), os.Getenv("TRIAD_KUBE_IMAGE")
	if kc == "" || ns == "" || img == "" {
		testenv.Missing(t, `the test cluster (TRIAD_KUBECONFIG, TRIAD_KUBE_NAMESPACE, TRIAD_KUBE_IMAGE: eval "$(scripts/kube.sh up)")`)
	}
	rc, err := kube.RestConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := kube.New(ctx, kube.Config{Rest: rc, Namespace: ns, Image: img,
		Owner:    fmt.Sprintf("ot%d-%d", os.Getpid()%100000, kubeOwners.Add(1)),
		Defaults: sandbox.Limits{MemoryBytes: 512 << 20, DiskBytes: 256 << 20}, MemoryRequest: 64 << 20, CPURequest: 0.05, TmpSize: 128 << 20})
	if err != nil {
		t.Fatalf("kube.New: %v", err)
	}
	return b
}
