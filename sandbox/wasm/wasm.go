// Package wasm is the sandbox.Backend that runs cells in CPython compiled to WASI, embedded in the binary and run by wazero.
//
// Each Kernel is one wasm instance of python.wasm running a small driver
// (driver.py) that execs cells in one namespace. The guest sees two mounts
// and nothing else of the host: the kernel's working directory at /work
// (read-write, the cwd) and the standard library as a zip at
// /lib/python311.zip (read-only, from the binary). It has no network, no
// subprocesses, no threads and no signals; its memory is capped by the VM.
// Because there are no signals, a cell that overruns its timeout is stopped
// by closing its instance, and the kernel starts a fresh interpreter.
//
// The driver shares its interpreter with the cells it runs, so the host
// believes nothing the guest says about limits or completion: output is
// counted at the file descriptors, deadlines are host timers, and a cell is
// over when the guest blocks reading its next command (Kernel.Execute).
//
// python.wasm and the stdlib zip are built by tools/wasi-python/build.sh
// from Debian's packages and sources; python/PROVENANCE records how.
package wasm

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/hostdir"
)

var (
	//go:embed python/python.wasm
	pythonWasm []byte

	//go:embed python/lib/python311.zip
	stdlibFS embed.FS

	//go:embed driver.py
	driverSource string

	//go:embed python/PROVENANCE
	provenance string
)

// Provenance returns the PROVENANCE record of the embedded interpreter: how
// it was built, from which sources, and the sha256 of each file.
func Provenance() string { return provenance }

// DefaultMemoryLimit is the memory cap of a kernel when neither Config nor
// the kernel's Spec sets one.
const DefaultMemoryLimit = 1 << 30

// Defaults of Config.
const (
	DefaultCellTimeout = 60 * time.Second
	DefaultDiskBytes   = 2 << 30
	DefaultGrace       = 3 * time.Second
)

// startTimeout bounds an interpreter start that Restart or Execute performs
// on the kernel's own behalf (after a timeout or death), when the caller's
// context may already be done.
const startTimeout = 30 * time.Second

// Config configures a Backend. The zero value is usable except for
// WorkRoot, which New fills with a private temporary directory.
type Config struct {
	// WorkRoot is the host directory under which each kernel gets its own
	// fresh working directory. Empty means a new temporary directory that
	// Close removes.
	WorkRoot string
	// CacheDir holds wazero's compilation cache, so that a new process
	// loads compiled code in a fraction of a second instead of compiling
	// python.wasm for seconds. Empty means no disk cache.
	CacheDir string
	// MemoryLimitBytes caps each kernel's memory (the wasm linear memory),
	// default DefaultMemoryLimit. A Spec may ask for less, not more.
	MemoryLimitBytes int64
	// OutputBytes bounds each cell's output (stdout, stderr, display and
	// result data together, as the guest writes them); a Spec may ask for
	// less, not more. Zero means sandbox.DefaultOutputBytes.
	OutputBytes int64
	// DiskBytes is the quota on a kernel's working directory when its Spec
	// sets none. Zero means DefaultDiskBytes, as on Docker.
	DiskBytes int64
	// CellTimeout bounds a cell whose sandbox.Cell has no timeout. Zero
	// means DefaultCellTimeout.
	CellTimeout time.Duration
	// InterruptGrace is how long a cell over its output limit has to end
	// (its writes fail) before its interpreter is restarted. Zero means
	// DefaultGrace.
	InterruptGrace time.Duration
	// Logger receives the backend's logs; nil is silent.
	Logger *slog.Logger
}

// Backend starts wasm kernels. It compiles python.wasm once; every kernel is
// a new instance of that compiled module.
type Backend struct {
	log         *slog.Logger
	workRoot    string
	ownsRoot    bool     // WorkRoot was created by New and is removed by Close
	lock        *os.File // flock on WorkRoot/.lock; nil where there is none
	memLimit    uint64
	outLimit    int64
	diskLimit   int64
	cellTimeout time.Duration
	grace       time.Duration

	rt       wazero.Runtime
	cache    wazero.CompilationCache
	compiled wazero.CompiledModule
	libFS    fs.FS

	mu      sync.Mutex
	kernels map[*Kernel]struct{}
	// programs are the running StartProgram instances; Close ends them
	// before it releases the runtime they run on.
	programs map[*Program]struct{}
	closed   bool
	leaked   bool // an instance did not stop: the runtime must stay open
}

var (
	_ sandbox.Backend = (*Backend)(nil)
	_ sandbox.Imager  = (*Backend)(nil)
)

// New compiles the embedded interpreter and returns a Backend ready to start
// kernels. With a warm CacheDir this takes well under a second; cold, a few
// seconds. It fails with sandbox.ErrUnavailable on a platform that wazero
// cannot compile for: the interpreter engine would be hundreds of times
// slower, which is not a usable sandbox.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	rc, err := compilerConfig()
	if err != nil {
		return nil, err
	}
	if cfg.MemoryLimitBytes < 0 || cfg.OutputBytes < 0 || cfg.DiskBytes < 0 || cfg.CellTimeout < 0 || cfg.InterruptGrace < 0 {
		return nil, errors.New("wasm backend: negative MemoryLimitBytes, OutputBytes, DiskBytes, CellTimeout or InterruptGrace")
	}
	b := &Backend{
		log:         cfg.Logger,
		memLimit:    uint64(cfg.MemoryLimitBytes),
		outLimit:    cmp.Or(cfg.OutputBytes, sandbox.DefaultOutputBytes),
		diskLimit:   cmp.Or(cfg.DiskBytes, DefaultDiskBytes),
		cellTimeout: cmp.Or(cfg.CellTimeout, DefaultCellTimeout),
		grace:       cmp.Or(cfg.InterruptGrace, DefaultGrace),
		kernels:     map[*Kernel]struct{}{},
		programs:    map[*Program]struct{}{},
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if b.memLimit == 0 {
		b.memLimit = DefaultMemoryLimit
	}
	if b.memLimit < 32<<20 || b.memLimit > 4<<30 {
		return nil, fmt.Errorf("wasm backend: MemoryLimitBytes %d is outside [32 MiB, 4 GiB]", b.memLimit)
	}
	b.memLimit -= b.memLimit % page
	b.libFS, err = fs.Sub(stdlibFS, "python/lib")
	if err != nil {
		return nil, fmt.Errorf("wasm backend: embedded stdlib: %w", err)
	}

	b.workRoot = cfg.WorkRoot
	if b.workRoot == "" {
		if b.workRoot, err = os.MkdirTemp("", "triad-wasm-"); err != nil {
			return nil, fmt.Errorf("wasm backend: work root: %w", err)
		}
		b.ownsRoot = true
	} else if err = os.MkdirAll(b.workRoot, 0o700); err != nil {
		return nil, fmt.Errorf("wasm backend: work root: %w", err)
	}
	if b.workRoot, err = filepath.Abs(b.workRoot); err != nil {
		return nil, fmt.Errorf("wasm backend: work root: %w", err)
	}
	if b.lock, err = lockWorkRoot(b.workRoot); err != nil {
		if b.ownsRoot {
			_ = os.RemoveAll(b.workRoot)
		}
		return nil, fmt.Errorf("wasm backend: %w", err)
	}
	if err := b.open(ctx, rc, cfg.CacheDir); err != nil {
		// b, not a named result: a named result is nil by the time a
		// deferred cleanup would run, and the cleanup's panic would hide
		// err.
		b.closeRuntime()
		b.unlock()
		if b.ownsRoot {
			_ = os.RemoveAll(b.workRoot)
		}
		return nil, err
	}
	return b, nil
}

// open sweeps the work root and compiles the interpreter; New undoes what
// it did when it fails.
func (b *Backend) open(ctx context.Context, rc wazero.RuntimeConfig, cacheDir string) error {
	var err error
	if b.lock != nil {
		if err = b.removeLeftovers(ctx); err != nil {
			return err
		}
	}

	rc = rc.
		// Closing an instance whose context is done is how a runaway cell
		// is stopped: WASI has no signals to interrupt it with.
		WithCloseOnContextDone(true).
		// One page over the limit: wazero refuses growth past this itself,
		// silently, so the allocator (newAllocator) is what enforces the
		// exact limit, and it records the refusal that explains an OOM.
		WithMemoryLimitPages(uint32(min(b.memLimit/page+1, 1<<16)))
	if cacheDir != "" {
		if err = os.MkdirAll(cacheDir, 0o700); err != nil {
			return fmt.Errorf("wasm backend: cache dir: %w", err)
		}
		if b.cache, err = wazero.NewCompilationCacheWithDir(cacheDir); err != nil {
			return fmt.Errorf("wasm backend: compilation cache: %w", err)
		}
		rc = rc.WithCompilationCache(b.cache)
	}
	b.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err = wasi_snapshot_preview1.Instantiate(ctx, b.rt); err != nil {
		return fmt.Errorf("wasm backend: wasi: %w", err)
	}
	t0 := time.Now()
	if b.compiled, err = b.rt.CompileModule(ctx, pythonWasm); err != nil {
		return fmt.Errorf("wasm backend: compile python.wasm: %w", err)
	}
	b.log.LogAttrs(ctx, slog.LevelInfo, "wasm backend ready",
		slog.Duration("compile", time.Since(t0)), slog.Bool("disk_cache", cacheDir != ""),
		slog.Uint64("memory_limit", b.memLimit))
	return nil
}

// page is the size of a wasm memory page.
const page = 64 << 10

// compilerConfig returns wazero's compiler configuration, or
// sandbox.ErrUnavailable where wazero has no compiler (it panics there).
func compilerConfig() (rc wazero.RuntimeConfig, err error) {
	unavailable := fmt.Errorf("wasm backend on %s/%s: wazero has no compiler for this platform: %w",
		runtime.GOOS, runtime.GOARCH, sandbox.ErrUnavailable)
	switch runtime.GOARCH {
	case "amd64", "arm64":
	default:
		return nil, unavailable
	}
	defer func() {
		if r := recover(); r != nil {
			rc, err = nil, fmt.Errorf("%w (%v)", unavailable, r)
		}
	}()
	return wazero.NewRuntimeConfigCompiler(), nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "wasm" }

// RunsCommands reports that wasm kernels run no commands: a WASI module
// has no processes (orchestrator/kernels asks, for the API's contract).
func (b *Backend) RunsCommands() bool { return false }

// Image names the embedded interpreter by the hash of python.wasm, recorded
// per run so a replay can tell when it ran on another build.
func (b *Backend) Image() string { return "python.wasm@sha256:" + wasmDigest() }

var wasmDigest = sync.OnceValue(func() string {
	sum := sha256.Sum256(pythonWasm)
	return hex.EncodeToString(sum[:6])
})

// Start implements sandbox.Backend: a fresh working directory under WorkRoot
// and an interpreter that has answered its first frame.
//
// Of spec.Limits, MemoryBytes (capped at Config.MemoryLimitBytes, at least
// 16 MiB), DiskBytes (a quota on the working directory, Config.DiskBytes
// when zero) and OutputBytes
// (capped at Config.OutputBytes) apply. CPUs and Pids need nothing: a
// kernel is one goroutine and can start no process.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, sandbox.ErrClosed
	}
	id := "wasm-" + randomHex(6)
	dir, err := os.MkdirTemp(b.workRoot, dirPrefix(spec.Owner))
	if err != nil {
		return nil, fmt.Errorf("start wasm kernel: working directory: %w", err)
	}
	limit := b.memLimit
	if m := spec.Limits.MemoryBytes; m > 0 && uint64(m) < limit {
		limit = max(uint64(m), 16<<20)
	}
	out := b.outLimit
	if o := spec.Limits.OutputBytes; o > 0 && o < out {
		out = o
	}
	disk := spec.Limits.DiskBytes
	if disk <= 0 {
		disk = b.diskLimit
	}
	files, err := hostdir.Open(dir, disk)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start wasm kernel: %w", err)
	}
	k := &Kernel{b: b, id: id, owner: spec.Owner, workDir: dir, files: files, memLimit: limit, outLimit: out, closing: make(chan struct{})}
	k.quota = &diskQuota{dir: dir, limit: disk}
	t0 := time.Now()
	inst, err := b.launch(ctx, k)
	if err != nil {
		_ = files.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start wasm kernel: %w", err)
	}
	k.setInstance(inst)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		k.stop()
		_ = files.Close()
		_ = os.RemoveAll(dir)
		return nil, sandbox.ErrClosed
	}
	b.kernels[k] = struct{}{}
	b.mu.Unlock()
	b.log.LogAttrs(ctx, slog.LevelDebug, "wasm kernel started", slog.String("kernel", id),
		slog.String("owner", spec.Owner), slog.Duration("took", time.Since(t0)))
	return k, nil
}

// Close implements sandbox.Backend: it closes every kernel the backend
// started, then the runtime. It is safe to call twice.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ks := make([]*Kernel, 0, len(b.kernels))
	for k := range b.kernels {
		ks = append(ks, k)
	}
	ps := make([]*Program, 0, len(b.programs))
	for p := range b.programs {
		ps = append(ps, p)
	}
	b.mu.Unlock()
	var errs []error
	for _, k := range ks {
		errs = append(errs, k.Close())
	}
	for _, p := range ps {
		errs = append(errs, p.Close())
	}
	b.closeRuntime()
	if b.ownsRoot {
		errs = append(errs, os.RemoveAll(b.workRoot))
	}
	b.unlock()
	return errors.Join(errs...)
}

func (b *Backend) unlock() {
	if b.lock != nil {
		_ = b.lock.Close() // closing the descriptor drops the flock
		b.lock = nil
	}
}

// removeLeftovers deletes the working directories an earlier process left
// under WorkRoot (it died before closing its kernels). Only names this
// package makes are touched, so a WorkRoot pointed at the wrong directory
// costs nothing but this backend's own debris.
func (b *Backend) removeLeftovers(ctx context.Context) error {
	entries, err := os.ReadDir(b.workRoot)
	if err != nil {
		return fmt.Errorf("wasm backend: read work root: %w", err)
	}
	n := 0
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), workDirPrefix) {
			if err := os.RemoveAll(filepath.Join(b.workRoot, e.Name())); err != nil {
				return fmt.Errorf("wasm backend: remove leftover %s: %w", e.Name(), err)
			}
			n++
		}
	}
	if n > 0 {
		b.log.InfoContext(ctx, "removed leftovers of an earlier process", "work_root", b.workRoot, "dirs", n)
	}
	return nil
}

// closeRuntime releases the compiled module and the runtime, unless an
// instance never stopped: closing the runtime frees every instance's memory,
// and freeing memory under running guest code would crash the process.
func (b *Backend) closeRuntime() {
	b.mu.Lock()
	leaked := b.leaked
	b.mu.Unlock()
	if leaked {
		b.log.Error("wasm backend: an instance did not stop; leaving the runtime open")
		return
	}
	ctx := context.Background()
	if b.rt != nil {
		_ = b.rt.Close(ctx)
	}
	if b.cache != nil {
		_ = b.cache.Close(ctx)
	}
}

func (b *Backend) forget(k *Kernel) {
	b.mu.Lock()
	delete(b.kernels, k)
	b.mu.Unlock()
}

func (b *Backend) markLeaked() {
	b.mu.Lock()
	b.leaked = true
	b.mu.Unlock()
}

// workDirPrefix starts the name of every kernel working directory, which is
// how removeLeftovers knows what it may delete.
const workDirPrefix = "wk-"

// dirPrefix makes a working directory name pattern for os.MkdirTemp that
// carries the owner (a run id), so logs and leftovers say whose it was.
func dirPrefix(owner string) string {
	var sb strings.Builder
	sb.WriteString(workDirPrefix)
	for _, r := range owner {
		if sb.Len() >= 40+len(workDirPrefix) {
			break
		}
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			sb.WriteRune(r)
		}
	}
	if sb.Len() == len(workDirPrefix) {
		return workDirPrefix + "kernel-*"
	}
	return sb.String() + "-*"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
