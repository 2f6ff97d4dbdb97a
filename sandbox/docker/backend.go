package docker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/internal/relay"
)

// Labels every container of this package carries.
const (
	// LabelManaged marks a container as Triad's sandbox kernel.
	LabelManaged = "dev.triad.managed"
	// LabelRoot holds a hash of the backend's WorkRoot: the containers a
	// backend owns, and removes at New, are those with its root label.
	LabelRoot = "dev.triad.root"
	// LabelOwner holds Spec.Owner (a run id).
	LabelOwner = "dev.triad.owner"
	// LabelInstance holds Config.Instance, for operators.
	LabelInstance = "dev.triad.instance"
)

// Defaults of Config.
const (
	DefaultMemory      = 2 << 30 // bytes, swap included
	DefaultCPUs        = 1.0
	DefaultPids        = 256
	DefaultDisk        = 2 << 30 // bytes
	DefaultTmpSize     = 256 << 20
	DefaultGrace       = 3 * time.Second
	DefaultCellTimeout = 60 * time.Second
	defaultUID         = 1000

	// NormalCPUShares is a running kernel's CPU weight: Docker's default
	// (cgroup v1 cpu.shares 1024; on cgroup v2 the engine converts it to
	// cpu.weight).
	NormalCPUShares = 1024
	// DefaultStartCPUShares is a starting kernel's CPU weight: an eighth
	// of a running kernel's, so warm cells win a contended CPU, while a
	// start still gets a ninth of a CPU against a busy cell (the least
	// weight, 2, starved starts behind other containers: 2.3–3.9× longer
	// bursts, measured), and all of an idle one. See docs/DECISIONS.md,
	// "Kernel start CPU weight".
	DefaultStartCPUShares = 128
)

// Runtimes of Config.Runtime.
const (
	// RuntimeRunc is the engine's runc: containers on the host's kernel.
	RuntimeRunc = "runc"
	// RuntimeRunsc is gVisor, registered with the engine under this name
	// (scripts/gvisor.sh docker does it).
	RuntimeRunsc = "runsc"
	// RuntimeAuto is runsc when the engine has it, else runc.
	RuntimeAuto = "auto"
)

// Config configures a Backend. Image and WorkRoot are required.
type Config struct {
	// Image is the sandbox image reference, e.g. image.Tag().
	Image string
	// WorkRoot is the host directory under which each kernel gets its own
	// working directory. The backend owns it: New removes whatever an
	// earlier process left there, and one process at a time may use it.
	WorkRoot string
	// SocketRoot is the host directory for the kernels' ZMQ ipc sockets,
	// one subdirectory per kernel. Unix socket paths must stay under about
	// 100 bytes, so it must be short. Backends may share it. Empty means
	// os.TempDir()/triad-<hash of WorkRoot>.
	SocketRoot string
	// UID and GID run the kernel. Zero means the service's own uid/gid
	// when that is not root, else 1000:1000 (the image's sandbox user).
	UID, GID int
	// Defaults are the limits for a Spec that leaves fields zero. Zero
	// fields here mean 2 GiB memory (swap included), 1 CPU, 256 pids, a
	// 2 GiB disk quota and sandbox.DefaultOutputBytes of output per cell.
	Defaults sandbox.Limits
	// TmpSize caps the container's /tmp tmpfs (it counts against memory
	// too). Zero means 256 MiB.
	TmpSize int64
	// InterruptGrace is how long a cell being stopped (timed out, over
	// its output limit, or abandoned by the caller) has, after the
	// interrupt, to end before the kernel is restarted. Zero means 3 s.
	InterruptGrace time.Duration
	// CellTimeout bounds a cell when Execute is given no timeout. Zero
	// means 60 s.
	CellTimeout time.Duration
	// StartCPUShares is the CPU weight (cpu.shares) a kernel's container
	// starts with, raised to NormalCPUShares once the kernel answers its
	// first kernel_info, so kernels that are starting (importing
	// ipykernel) yield the CPU to kernels running cells. Zero means
	// DefaultStartCPUShares; NormalCPUShares turns the lowering off.
	// Either way the kernel's CPU limit (Limits.CPUs) holds from the
	// start. See docs/DECISIONS.md, "Kernel start CPU weight".
	StartCPUShares int64
	// Runtime is the OCI runtime the kernels' containers run under, as the
	// engine names it: RuntimeRunc (the host's kernel behind Triad's
	// seccomp profile), RuntimeRunsc (gVisor: a second kernel between the
	// cell and the host's), or RuntimeAuto or "" for runsc when the
	// engine has it and runc otherwise. See docs/DECISIONS.md, "gVisor".
	Runtime string
	// RunscName is the name the engine registered gVisor under; zero
	// means RuntimeRunsc. A second registration of the same runsc with
	// other flags (profiling, overlay or file-access modes) is measured
	// by naming it here: kernels still get gVisor's limits (see
	// hostConfig), and Runtime() still answers RuntimeRunsc.
	RunscName string
	// Instance names this Triad instance in a label, for operators.
	Instance string
	// Labels are extra container labels.
	Labels map[string]string
	// Logger receives structured logs; nil is silent.
	Logger *slog.Logger
}

// Backend starts jailed ipykernel containers. It implements
// sandbox.Backend.
type Backend struct {
	cfg           Config
	cli           *client.Client
	log           *slog.Logger
	rootTag       string // value of LabelRoot
	quota         quotaFS
	quotaOK       bool // loop-mounted quotas work here
	lock          *os.File
	runtime       string // RuntimeRunc or RuntimeRunsc, resolved by open
	engineRuntime string // the engine's name for runtime (Config.RunscName for runsc)

	mu      sync.Mutex
	kernels map[*Kernel]struct{}
	closed  bool
}

var (
	_ sandbox.Backend  = (*Backend)(nil)
	_ sandbox.Imager   = (*Backend)(nil)
	_ sandbox.Runtimer = (*Backend)(nil)
)

// New connects to the Docker engine (DOCKER_HOST and friends, with API
// version negotiation), checks the image is present, takes ownership of
// WorkRoot and removes the containers, mounts and directories an earlier
// process of the same WorkRoot left behind. An engine that does not answer
// or a missing image is an error wrapping sandbox.ErrUnavailable.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client: %w: %w", sandbox.ErrUnavailable, err)
	}
	b := &Backend{
		cfg:     cfg,
		cli:     cli,
		log:     cfg.Logger,
		rootTag: rootHash(cfg.WorkRoot),
		quota:   quotaFS{root: cfg.WorkRoot, uid: cfg.UID, gid: cfg.GID},
		kernels: map[*Kernel]struct{}{},
	}
	if err := b.open(ctx); err != nil {
		b.release()
		return nil, err
	}
	return b, nil
}

func (b *Backend) open(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.cli.Ping(pctx); err != nil {
		return fmt.Errorf("docker engine does not answer (start dockerd): %w: %w", sandbox.ErrUnavailable, err)
	}
	if err := b.resolveRuntime(pctx); err != nil {
		return err
	}
	if _, err := b.cli.ImageInspect(pctx, b.cfg.Image); err != nil {
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("sandbox image %s is not in the engine (run `triad image build`): %w", b.cfg.Image, sandbox.ErrUnavailable)
		}
		return fmt.Errorf("inspect sandbox image %s: %w: %w", b.cfg.Image, sandbox.ErrUnavailable, err)
	}
	for _, d := range []string{b.cfg.WorkRoot, filepath.Join(b.cfg.WorkRoot, diskDir), b.cfg.SocketRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// An exclusive lock on WorkRoot: cleaning up "leftovers" under a
	// WorkRoot that another live process uses would kill its kernels. The
	// kernel drops the lock when its holder dies, kill -9 included.
	lock, err := os.OpenFile(filepath.Join(b.cfg.WorkRoot, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock work root: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return fmt.Errorf("work root %s is in use by another live backend (one per WorkRoot): %w", b.cfg.WorkRoot, err)
	}
	b.lock = lock
	if err := b.removeLeftovers(ctx); err != nil {
		return err
	}
	// Triad's Python modules, mounted read-only into every kernel.
	if err := image.WritePython(b.pythonDir()); err != nil {
		return fmt.Errorf("write the kernels' Python modules: %w", err)
	}
	if err := b.quota.probe(ctx); err != nil {
		b.log.WarnContext(ctx, "sandbox disk quota unavailable: working directories are plain directories limited only by the host disk", "err", err)
	} else {
		b.quotaOK = true
	}
	return nil
}

// resolveRuntime settles Config.Runtime against the runtimes the engine
// has registered.
func (b *Backend) resolveRuntime(ctx context.Context) error {
	info, err := b.cli.Info(ctx)
	if err != nil {
		return fmt.Errorf("docker engine info: %w: %w", sandbox.ErrUnavailable, err)
	}
	_, hasRunsc := info.Runtimes[b.cfg.RunscName]
	defer func() {
		b.engineRuntime = b.runtime
		if b.runtime == RuntimeRunsc {
			b.engineRuntime = b.cfg.RunscName
		}
	}()
	switch want := b.cfg.Runtime; want {
	case RuntimeAuto:
		b.runtime = RuntimeRunc
		if hasRunsc {
			b.runtime = RuntimeRunsc
		} else {
			b.log.WarnContext(ctx, "the docker engine has no runtime runsc, so kernels run under runc, on the host's kernel behind Triad's seccomp profile; register gVisor with `scripts/gvisor.sh docker` (or pass --docker-runtime runc to say so)")
		}
	case RuntimeRunsc:
		if !hasRunsc {
			return fmt.Errorf("the docker engine has no runtime %q (register gVisor with `scripts/gvisor.sh docker`, or choose runc): %w", b.cfg.RunscName, sandbox.ErrUnavailable)
		}
		b.runtime = want
	default:
		b.runtime = RuntimeRunc
	}
	return nil
}

func (cfg Config) withDefaults() (Config, error) {
	switch cfg.Runtime {
	case "":
		cfg.Runtime = RuntimeAuto
	case RuntimeAuto, RuntimeRunc, RuntimeRunsc:
	default:
		return cfg, fmt.Errorf("docker backend: Runtime %q: want %s, %s or %s", cfg.Runtime, RuntimeRunsc, RuntimeRunc, RuntimeAuto)
	}
	if cfg.RunscName == "" {
		cfg.RunscName = RuntimeRunsc
	}
	if cfg.Image == "" {
		return cfg, errors.New("docker backend: Config.Image is required")
	}
	if cfg.WorkRoot == "" {
		return cfg, errors.New("docker backend: Config.WorkRoot is required")
	}
	root, err := filepath.Abs(cfg.WorkRoot)
	if err != nil {
		return cfg, err
	}
	cfg.WorkRoot = root
	if cfg.SocketRoot == "" {
		cfg.SocketRoot = filepath.Join(os.TempDir(), "triad-"+rootHash(root)[:8])
	}
	if cfg.SocketRoot, err = filepath.Abs(cfg.SocketRoot); err != nil {
		return cfg, err
	}
	// <SocketRoot>/<12-hex id>/egress.ports (its longest name) must fit in sun_path with room to spare.
	if n := len(cfg.SocketRoot) + len("/0123456789ab/"+egressSock+relay.PortsSuffix); n > 100 {
		return cfg, fmt.Errorf("docker backend: SocketRoot %q is too long for unix socket paths (%d bytes > 100); pick a shorter directory", cfg.SocketRoot, n)
	}
	if cfg.UID == 0 {
		cfg.UID, cfg.GID = os.Getuid(), os.Getgid()
		if cfg.UID == 0 {
			cfg.UID, cfg.GID = defaultUID, defaultUID
		}
	}
	if cfg.GID == 0 {
		cfg.GID = cfg.UID
	}
	cfg.Defaults = cfg.Defaults.Or(sandbox.Limits{MemoryBytes: DefaultMemory, CPUs: DefaultCPUs,
		Pids: DefaultPids, DiskBytes: DefaultDisk, OutputBytes: sandbox.DefaultOutputBytes})
	if cfg.TmpSize == 0 {
		cfg.TmpSize = DefaultTmpSize
	}
	if cfg.InterruptGrace == 0 {
		cfg.InterruptGrace = DefaultGrace
	}
	if cfg.CellTimeout == 0 {
		cfg.CellTimeout = DefaultCellTimeout
	}
	if cfg.StartCPUShares == 0 {
		cfg.StartCPUShares = DefaultStartCPUShares
	}
	if cfg.StartCPUShares < 2 || cfg.StartCPUShares > NormalCPUShares {
		return cfg, fmt.Errorf("docker backend: StartCPUShares %d: want 2 to %d", cfg.StartCPUShares, NormalCPUShares)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// pythonDir holds the modules image.WritePython writes, mounted at
// image.PythonDir in every kernel.
func (b *Backend) pythonDir() string { return filepath.Join(b.cfg.SocketRoot, "python") }

// rootHash names a WorkRoot in labels and default socket paths.
func rootHash(root string) string {
	h := sha256.Sum256([]byte(root))
	return hex.EncodeToString(h[:8])
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "docker" }

// Image is the sandbox image every kernel runs, recorded per run so a
// replay can tell when it ran on another image.
func (b *Backend) Image() string { return b.cfg.Image }

// Runtime implements sandbox.Runtimer: the OCI runtime every kernel runs
// under, "runc" or "runsc".
func (b *Backend) Runtime() string { return b.runtime }

// Quota reports whether working directories carry a real disk quota (a
// loop-mounted ext4 image) rather than being plain directories.
func (b *Backend) Quota() bool { return b.quotaOK }

// Start implements sandbox.Backend: it creates a working directory with the
// spec's disk quota, starts a jailed container running ipykernel and
// returns once the kernel answers. ctx bounds the wait only.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	k, err := b.start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func (b *Backend) start(ctx context.Context, spec sandbox.Spec) (*Kernel, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	b.mu.Unlock()

	if l := spec.Limits; l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 || l.OutputBytes < 0 {
		// Docker reads a negative pids or memory limit as "unlimited".
		return nil, fault.Badf("give positive limits, or 0 for the server's default", "negative sandbox limit in %+v", l)
	}
	lim := b.limits(spec.Limits)
	id := newID()
	k := &Kernel{
		b:        b,
		id:       id,
		owner:    spec.Owner,
		image:    spec.Image,
		limits:   lim,
		sockDir:  filepath.Join(b.cfg.SocketRoot, id),
		language: sandbox.LanguagePython,
		closing:  make(chan struct{}),
	}
	k.egress = relay.NewLink(k.dialEgress, b.log.With("kernel", id))
	t0 := time.Now()
	if err := k.setup(ctx); err != nil {
		k.teardown()
		return nil, fmt.Errorf("start kernel for %q: %w", spec.Owner, err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		k.teardown()
		return nil, sandbox.ErrClosed
	}
	b.kernels[k] = struct{}{}
	b.mu.Unlock()
	b.log.InfoContext(ctx, "sandbox kernel started", "kernel", k.ID(), "owner", spec.Owner, "duration", time.Since(t0).Round(time.Millisecond), slog.Group("phases", k.phases...))
	k.phases = nil
	return k, nil
}

func (b *Backend) limits(l sandbox.Limits) sandbox.Limits { return l.Or(b.cfg.Defaults) }

func (b *Backend) forget(k *Kernel) {
	b.mu.Lock()
	delete(b.kernels, k)
	b.mu.Unlock()
}

// labels are the labels of a new container.
func (b *Backend) labels(owner string) map[string]string {
	l := maps.Clone(b.cfg.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelManaged] = "1"
	l[LabelRoot] = b.rootTag
	l[LabelOwner] = owner
	if b.cfg.Instance != "" {
		l[LabelInstance] = b.cfg.Instance
	}
	return l
}

// removeLeftovers removes the containers, mounts, working directories and
// socket directories of an earlier process of this WorkRoot (one that was
// killed before it could Close).
func (b *Backend) removeLeftovers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	list, err := b.cli.ContainerList(ctx, container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", LabelRoot+"="+b.rootTag)),
	})
	if err != nil {
		return fmt.Errorf("list leftover containers: %w", err)
	}
	// ids are the kernels the earlier process left: their socket
	// directories go too, and nothing else in SocketRoot is touched (it
	// may be shared with other backends).
	ids := map[string]bool{}
	for _, c := range list {
		if err := b.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("remove leftover container %s: %w", shortID(c.ID), err)
		}
		for _, n := range c.Names {
			if i := strings.LastIndexByte(n, '-'); i >= 0 && isKernelName(n[i+1:]) {
				ids[n[i+1:]] = true
			}
		}
		b.log.InfoContext(ctx, "removed leftover sandbox container", "container", shortID(c.ID), "owner", c.Labels[LabelOwner])
	}
	if err := unmountAll(b.cfg.WorkRoot); err != nil {
		return err
	}
	// Only names this package makes are removed, so a WorkRoot pointed at
	// the wrong directory costs nothing but this backend's own debris.
	entries, err := os.ReadDir(b.cfg.WorkRoot)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if isKernelName(e.Name()) || e.Name() == probeName {
			ids[e.Name()] = true
			if err := os.RemoveAll(filepath.Join(b.cfg.WorkRoot, e.Name())); err != nil {
				return fmt.Errorf("remove leftover workdir: %w", err)
			}
		}
	}
	disks, err := os.ReadDir(filepath.Join(b.cfg.WorkRoot, diskDir))
	if err != nil {
		return err
	}
	for _, d := range disks {
		if name, ok := strings.CutSuffix(d.Name(), ".ext4"); ok && (isKernelName(name) || name == probeName) {
			if err := os.Remove(filepath.Join(b.cfg.WorkRoot, diskDir, d.Name())); err != nil {
				return fmt.Errorf("remove leftover disk image: %w", err)
			}
		}
	}
	for id := range ids {
		if !isKernelName(id) {
			continue
		}
		dir := filepath.Join(b.cfg.SocketRoot, id)
		if err := unmountAll(dir); err != nil {
			return err
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove leftover socket dir: %w", err)
		}
	}
	if len(list) > 0 {
		b.log.InfoContext(ctx, "removed leftovers of an earlier process", "work_root", b.cfg.WorkRoot, "containers", len(list))
	}
	return nil
}

// Close implements sandbox.Backend: it closes every kernel this backend
// started and releases the WorkRoot. It is safe to call twice.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	kernels := make([]*Kernel, 0, len(b.kernels))
	for k := range b.kernels {
		kernels = append(kernels, k)
	}
	b.mu.Unlock()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, k := range kernels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := k.Close(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// The socket root is this backend's alone; it goes once it is empty
	// (Remove fails harmlessly if a caller put something else there).
	_ = os.RemoveAll(b.pythonDir())
	_ = os.Remove(b.cfg.SocketRoot)
	b.release()
	return errors.Join(errs...)
}

func (b *Backend) release() {
	if b.lock != nil {
		_ = b.lock.Close() // closing the descriptor drops the flock
		b.lock = nil
	}
	if b.cli != nil {
		_ = b.cli.Close()
	}
}

// isKernelName reports whether name is a kernel id as newID makes them.
func isKernelName(name string) bool {
	if len(name) != 12 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil && strings.ToLower(name) == name
}

func newID() string {
	var r [6]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(r[:])
}

// shortID trims a container id for logs.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// engineCallTimeout bounds one call to the Docker engine beyond the
// caller's own deadline. It is there for an engine that hangs, not for one
// that is slow: 30 s bounds were deadlines load could miss (the CI of
// 07cf28a saw a container start under gVisor at load 30 run past 30 s and
// fail a kernel's start). See docs/DECISIONS.md, "Engine calls wait for a
// slow engine".
const engineCallTimeout = 5 * time.Minute
