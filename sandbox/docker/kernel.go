package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/go-units"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/hostdir"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/internal/relay"
	"github.com/triadhq/triad/sandbox/jupyter"
)

// Paths inside the container.
const (
	ctrWork    = image.Work
	ctrSockets = "/run/kernel"
)

// egressSock is the egress forwarder's host endpoint in the socket
// directory.
const egressSock = "egress"

// kernelCmd starts ipykernel as the container's main process. The shell
// only seeds matplotlib's font cache into the tmpfs home (the root
// filesystem is read-only, so the image's copy cannot be used in place)
// and then execs the kernel, so the kernel's exit is the container's exit
// (tini, the container's init, passes the status on). Plain tracebacks
// (NoColor) read better to an agent than ANSI colour codes; the history
// database is pointless for a throwaway kernel and costs a SQLite file per
// start. Figures show inline by default because MPLBACKEND names the inline
// backend (ipykernel would set it too).
//
// The egress forwarder (sandbox/internal/relay) starts first, in the
// background: it listens on sandbox.EgressAddr and on the socket egressSock
// in the bind-mounted socket directory, through which the host relays the
// sandbox's connections to Triad's egress proxy. It reaches nothing by
// itself, and refuses every connection of a run without a policy.
var kernelCmd = []string{"/bin/sh", "-c", `mkdir -p "$MPLCONFIGDIR" && cp -a ` + image.MPLSeed + `/. "$MPLCONFIGDIR"/ 2>/dev/null; ` +
	relay.Command("unix:"+ctrSockets+"/"+egressSock) + ` ` +
	`exec python3 -c '` + image.KernelLauncher + `' -f ` + ctrSockets + `/conn.json ` +
	`--InteractiveShell.colors=NoColor --HistoryManager.enabled=False --IPKernelApp.quiet=True`}

// Kernel is one ipykernel in a jailed container. It implements
// sandbox.Kernel.
type Kernel struct {
	b       *Backend
	id      string // also the name of its work and socket directories
	owner   string
	image   string // a template's image, or "" for Config.Image
	limits  sandbox.Limits
	sockDir string

	// files is the working directory as the core sees it; set by setup
	// before the kernel is handed out, closed first thing in Close.
	files *hostdir.Dir

	// egress relays the sandbox's connections to the host (the
	// container's kernel only; a context uses its parent's).
	egress *relay.Link

	// mu serializes Execute, Restart and the teardown in Close.
	mu          sync.Mutex
	wd          workdir
	containerID string
	// sharesRaised is set once the container runs at NormalCPUShares.
	sharesRaised bool
	client       *jupyter.Client  // nil while the kernel is down
	info         jupyter.ConnInfo // the current kernel's connection file
	exited       chan struct{}    // closed when the current container process exits
	stopWatch    context.CancelFunc

	// phases records how long the last setup and boot steps took, for the
	// start log.
	phases []any

	// A context (NewContext) is a Kernel whose interpreter is a docker
	// exec in its parent's container; parent is nil for the container's
	// own kernel. name prefixes the context's connection file, pid file
	// and sockets in the shared socket directory; cwd is where its
	// interpreter starts, in the container; language is its interpreter's
	// (sandbox.LanguagePython for the kernel); bootedAt tells a death
	// caused by the container's restart from one of its own. A kernel
	// keeps its live contexts in contexts, guarded by ctxMu.
	parent   *Kernel
	name     string
	cwd      string
	language string
	execID   string
	bootedAt time.Time
	ctxMu    sync.Mutex
	contexts map[*Kernel]struct{}

	// started is when the container last started, read by Usage without
	// k.mu: its cgroup, and so its CPU count, starts afresh each time.
	started atomic.Pointer[time.Time]

	closing   chan struct{} // closed by Close; aborts waits in Execute
	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.Kernel = (*Kernel)(nil)
	_ sandbox.Egress = (*Kernel)(nil)
)

var initTrue = true

// bootTimeout is how long a kernel's boot (container start to the first
// kernel_info reply) may take before it must show progress: a boot takes
// about a second on a quiet machine. After it, the boot goes on as long as
// the container keeps using CPU (sandbox.WhileProgressing): a loaded
// machine starves a boot, a stuck one uses nothing.
const bootTimeout = 2 * time.Minute

// socketDirSize caps the tmpfs behind a kernel's socket directory: room for
// conn.json and five sockets, not for data.
const socketDirSize = 1 << 20

// ID implements sandbox.Kernel: the container's short id, and a
// context's name after it.
func (k *Kernel) ID() string {
	if k.parent != nil {
		return shortID(k.containerID) + "/" + k.name
	}
	return shortID(k.containerID)
}

// Files implements sandbox.Kernel: the host directory mounted at /work,
// with the kernel's disk quota.
func (k *Kernel) Files() sandbox.WorkDir { return k.files }

// setup creates the working directory, the socket directory and the
// container, and starts the kernel. On error the caller tears down.
func (k *Kernel) setup(ctx context.Context) error {
	b := k.b
	dir := filepath.Join(b.cfg.WorkRoot, k.id)
	t := time.Now()
	// New made these, but a /tmp cleaner may have removed them since.
	for _, d := range []string{filepath.Join(b.cfg.WorkRoot, diskDir), b.cfg.SocketRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var err error
	if b.quotaOK {
		k.wd, err = b.quota.create(ctx, dir, k.limits.DiskBytes)
	} else {
		k.wd, err = b.quota.plain(dir)
	}
	if err != nil {
		return err
	}
	if k.files, err = hostdir.Open(k.wd.path, k.limits.DiskBytes); err != nil {
		return err
	}
	// The kernel binds its sockets here and the host connects to them;
	// connecting to a unix socket needs write permission on it, which the
	// kernel's uid grants itself, so the directory is the uid's alone.
	if err := os.Mkdir(k.sockDir, 0o700); err != nil {
		return fmt.Errorf("create socket dir: %w", err)
	}
	if b.quotaOK {
		// The kernel can write to its socket directory, which lives on the
		// host's /tmp: a small tmpfs keeps that from becoming a way around
		// the disk quota.
		if err := run(ctx, "mount", "-t", "tmpfs", "-o",
			fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d,nosuid,nodev,noexec", socketDirSize, socketDirInodes, b.cfg.UID, b.cfg.GID),
			"triad-sockets", k.sockDir); err != nil {
			return err
		}
	} else if os.Geteuid() == 0 {
		if err := os.Chown(k.sockDir, b.cfg.UID, b.cfg.GID); err != nil {
			return fmt.Errorf("chown socket dir: %w", err)
		}
	}
	k.phase("workdir", &t)
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	resp, err := b.cli.ContainerCreate(cctx, k.containerConfig(), k.hostConfig(), nil, nil, "triad-"+b.rootTag[:8]+"-"+k.id)
	if err != nil {
		return fmt.Errorf("create container: %w", err)
	}
	k.containerID = resp.ID
	k.phase("create", &t)
	return k.boot(ctx)
}

func (k *Kernel) containerConfig() *container.Config {
	b := k.b
	img := b.cfg.Image
	if k.image != "" {
		img = k.image
	}
	return &container.Config{
		Image:           img,
		User:            fmt.Sprintf("%d:%d", b.cfg.UID, b.cfg.GID),
		WorkingDir:      ctrWork,
		Cmd:             kernelCmd,
		Hostname:        "sandbox",
		NetworkDisabled: true,
		Env: append(image.KernelEnv(),
			"LANG=C.UTF-8",
			"PYTHONDONTWRITEBYTECODE=1",
			"PYTHONHASHSEED=0", // fixed for every kernel, pooled ones too; the run's seed is set when a run claims it
			// Numeric libraries size their thread pools by the host's CPUs,
			// not the container's quota; one CPU wants one thread.
			fmt.Sprintf("OMP_NUM_THREADS=%d", max(1, int(k.limits.CPUs+0.5))),
			fmt.Sprintf("OPENBLAS_NUM_THREADS=%d", max(1, int(k.limits.CPUs+0.5))),
		),
		Labels: b.labels(k.owner),
	}
}

func (k *Kernel) hostConfig() *container.HostConfig {
	b := k.b
	pids := k.limits.Pids
	// A segfaulting cell would otherwise drop a core file into /work,
	// eating the run's quota.
	ulimits := []*units.Ulimit{{Name: "core", Soft: 0, Hard: 0}}
	if b.runtime == RuntimeRunsc {
		// Under gVisor the host's pids cgroup counts the Sentry's own
		// threads and its systrap stubs, not the cell's processes: at the
		// cell's limit it would kill the whole sandbox. The cell's limit is
		// gVisor's RLIMIT_NPROC instead, which its kernel counts per
		// sandbox (every process and thread, all run as one uid) and
		// answers with EAGAIN, as the cgroup does under runc; the host
		// cgroup stays as a backstop with room for the Sentry. See
		// docs/DECISIONS.md, "gVisor: limits".
		ulimits = append(ulimits, &units.Ulimit{Name: "nproc", Soft: pids, Hard: pids})
		pids = RunscHostPids(pids)
	}
	return &container.HostConfig{
		Runtime:        b.engineRuntime,
		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges", seccompOpt},
		ReadonlyRootfs: true,
		IpcMode:        "private",
		Tmpfs: map[string]string{
			"/tmp": fmt.Sprintf("rw,nosuid,nodev,size=%d,mode=1777", b.cfg.TmpSize),
		},
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: k.wd.path, Target: ctrWork},
			{Type: mount.TypeBind, Source: k.sockDir, Target: ctrSockets},
			{Type: mount.TypeBind, Source: b.pythonDir(), Target: image.PythonDir, ReadOnly: true},
		},
		Resources: container.Resources{
			Memory:     k.limits.MemoryBytes,
			MemorySwap: k.limits.MemoryBytes, // equal: no swap beyond the memory limit
			NanoCPUs:   int64(k.limits.CPUs * 1e9),
			// Low until the kernel answers (raiseCPUShares): a start
			// yields to the cells of running kernels.
			CPUShares: b.cfg.StartCPUShares,
			PidsLimit: &pids,
			Ulimits:   ulimits,
		},
		// Under host memory pressure the sandbox dies before Triad does
		// (under gVisor, raiseOOMScores completes it).
		OomScoreAdj: oomScoreAdj,
		// tini as PID 1 reaps the orphans a cell leaves (a fork bomb's
		// children, daemonised subprocesses); with the kernel as PID 1 they
		// would stay zombies holding pids until the next restart. The
		// kernel's exit still ends the container, with its exit status.
		Init: &initTrue,
		// The kernel's own stdout is only diagnostics (cell output goes over
		// ZMQ); cap it so a cell writing to fd 1 cannot fill the host disk.
		LogConfig:     container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
	}
}

// RunscHostPids is the host pids cgroup limit of a gVisor sandbox whose
// cell may have pids processes and threads: gVisor runs each of the cell's
// threads on a host thread of a systrap stub process, beside the Sentry's
// own (measured: 380 host tasks for 250 of the cell's), so the host limit
// leaves four per cell task and 256 for the Sentry, and only a runaway
// Sentry meets it.
func RunscHostPids(pids int64) int64 { return 4*pids + 256 }

// boot starts the kernel's interpreter with a fresh connection file, dials
// it and waits until it answers: the (created or exited) container for a
// kernel, a docker exec in the running container for a context.
func (k *Kernel) boot(ctx context.Context) error {
	b := k.b
	t := time.Now()
	// Stale sockets from an earlier life would let the dial succeed against
	// nothing; ipykernel rewrites the connection file itself, so start
	// from scratch. Only this interpreter's own files go: the contexts'
	// live beside them.
	k.removeSockFiles()
	info := jupyter.NewConnInfo(ctrSockets + "/" + k.sockName())
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	// ipykernel must be able to read this as the kernel uid, or it silently
	// falls back to TCP with a new key.
	conn := filepath.Join(k.sockDir, k.connFile())
	if err := os.WriteFile(conn, data, 0o600); err != nil {
		return fmt.Errorf("write connection file: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(conn, b.cfg.UID, b.cfg.GID); err != nil {
			return fmt.Errorf("chown connection file: %w", err)
		}
	}
	if k.parent != nil {
		if err := k.startExec(ctx); err != nil {
			return err
		}
	} else if err := k.startContainer(ctx); err != nil {
		return err
	}
	exited := k.exited
	k.phase("start", &t)
	// A kernel that dies while booting (a broken image, a too-small memory
	// limit) must fail the boot at once rather than at ctx's deadline; one
	// that neither answers nor exits fails once it stops using CPU after
	// bootTimeout, because restarts run on contexts without a deadline.
	tctx, tcancel := sandbox.WhileProgressing(ctx, bootTimeout, k.cpuUsed)
	defer tcancel()
	bctx, bcancel := context.WithCancelCause(tctx)
	defer bcancel(nil)
	go func() {
		select {
		case <-exited:
			what := "the kernel's container"
			if k.parent != nil {
				what = "the context's interpreter"
			}
			bcancel(errors.New(what + " exited while booting"))
		case <-k.closing:
			bcancel(sandbox.ErrClosed)
		case <-bctx.Done():
		}
	}()
	c, err := jupyter.Dial(bctx, info, k.sockPrefix(), k.dialOptions())
	if err != nil {
		return k.bootError(ctx, bctx, fmt.Errorf("dial kernel: %w", err))
	}
	k.phase("dial", &t)
	if err := c.WaitReady(bctx); err != nil {
		c.Close()
		return k.bootError(ctx, bctx, fmt.Errorf("wait for kernel: %w", err))
	}
	k.phase("ready", &t)
	if k.parent == nil && b.runtime == RuntimeRunsc {
		k.raiseOOMScores(ctx)
	}
	if k.parent == nil && !k.sharesRaised {
		if err := k.raiseCPUShares(ctx); err != nil {
			c.Close()
			return err
		}
		k.phase("weight", &t)
	}
	k.client, k.info, k.bootedAt = c, info, time.Now()
	return nil
}

// raiseCPUShares gives a kernel that has answered its first kernel_info
// the normal CPU weight: it is warm now, in the pool or serving a run. The
// container keeps the weight across restarts, so only the first boot
// raises it. Only cpu.shares changes: the engine leaves every resource
// that is zero in the update as it was, the CPU limit included. See
// docs/DECISIONS.md, "Kernel start CPU weight".
func (k *Kernel) raiseCPUShares(ctx context.Context) error {
	b := k.b
	if b.cfg.StartCPUShares == NormalCPUShares {
		k.sharesRaised = true
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
	defer cancel()
	if _, err := b.cli.ContainerUpdate(uctx, k.containerID, container.UpdateConfig{
		Resources: container.Resources{CPUShares: NormalCPUShares},
	}); err != nil {
		return fmt.Errorf("raise the kernel's CPU weight: %w", err)
	}
	k.sharesRaised = true
	return nil
}

// startContainer starts the container, its exit watched from before the
// start so even an instant crash is seen. The watch lives until the kernel
// is restarted or closed.
func (k *Kernel) startContainer(ctx context.Context) error {
	b := k.b
	wctx, stop := context.WithCancel(context.Background())
	waitC, errC := b.cli.ContainerWait(wctx, k.containerID, container.WaitConditionNextExit)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-waitC:
		case <-errC:
			// The watch failed (engine gone, container removed, or we
			// stopped it): treat the container as exited, which only makes
			// the next Execute check harder.
		}
	}()
	k.exited, k.stopWatch = exited, stop
	now := time.Now()
	k.started.Store(&now)
	sctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	if err := b.cli.ContainerStart(sctx, k.containerID, container.StartOptions{}); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	return nil
}

// sockName is the prefix of this interpreter's sockets, as ipykernel
// binds them ("k-1" … "k-5" for the kernel, "<name>-1" … for a context).
func (k *Kernel) sockName() string {
	if k.parent != nil {
		return k.name
	}
	return "k"
}

// connFile is the name of this interpreter's connection file.
func (k *Kernel) connFile() string {
	if k.parent != nil {
		return k.name + ".json"
	}
	return "conn.json"
}

// removeSockFiles removes this interpreter's connection file, sockets and
// pid file from the socket directory.
func (k *Kernel) removeSockFiles() {
	entries, _ := os.ReadDir(k.sockDir)
	for _, e := range entries {
		n := e.Name()
		if n == k.connFile() || strings.HasPrefix(n, k.sockName()+"-") || k.parent != nil && n == k.name+".pid" {
			_ = os.Remove(filepath.Join(k.sockDir, n))
		}
	}
}

// sockPrefix is the host path prefix of the interpreter's sockets.
func (k *Kernel) sockPrefix() string { return filepath.Join(k.sockDir, k.sockName()) }

// dialOptions are the Jupyter client's options for this kernel: every
// message it reads is bounded by the kernel's output limit plus headroom
// (kernelLimits), for boots and redials alike.
func (k *Kernel) dialOptions() jupyter.Options {
	return jupyter.Options{Logger: k.b.log.With("kernel", k.ID()), Limits: kernelLimits(k.limits.OutputBytes), StdioBarrier: stdioBarriers[k.language]}
}

// phase notes the time since *t under name and resets *t.
func (k *Kernel) phase(name string, t *time.Time) {
	now := time.Now()
	k.phases = append(k.phases, slog.Duration(name, now.Sub(*t).Round(time.Millisecond)))
	*t = now
}

// bootError adds why the container exited, when it did, to a boot failure.
func (k *Kernel) bootError(ctx, bctx context.Context, err error) error {
	if cause := context.Cause(bctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		reason := k.deathReason(ctx)
		return fmt.Errorf("%w (%s; %s)", err, cause, reason)
	}
	return err
}

// deathReason asks the engine why the container's process ended, unless
// the client gave up on a kernel that broke the protocol.
func (k *Kernel) deathReason(ctx context.Context) string {
	if v := k.protocolViolation(); v != "" {
		return v
	}
	if k.parent != nil {
		return k.contextDeathReason(ctx)
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
	defer cancel()
	info, err := k.b.cli.ContainerInspect(ictx, k.containerID)
	if err != nil {
		return "unknown: " + err.Error()
	}
	st := info.State
	switch {
	case st == nil:
		return "unknown"
	case st.OOMKilled:
		return "OOMKilled"
	case st.Running:
		return "the kernel stopped answering"
	case st.ExitCode > 128:
		return fmt.Sprintf("killed by signal %d (exit code %d)", st.ExitCode-128, st.ExitCode)
	default:
		return fmt.Sprintf("exited with code %d", st.ExitCode)
	}
}

// Restart implements sandbox.Kernel: the container's process is replaced,
// the working directory kept.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.isClosing() {
		return sandbox.ErrClosed
	}
	return k.restartLocked(ctx)
}

// restartLocked kills the container's process and boots the kernel again
// in the same container: same mounts and labels, a fresh /tmp, a fresh
// interpreter.
func (k *Kernel) restartLocked(ctx context.Context) error {
	if k.isClosing() {
		return sandbox.ErrClosed // Close is waiting for the lock; don't make it wait longer
	}
	k.stopKernel()
	if k.parent != nil {
		return k.restartContext(ctx)
	}
	kctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	if err := k.b.cli.ContainerKill(kctx, k.containerID, "KILL"); err != nil && !isNotRunning(err) {
		return fmt.Errorf("kill kernel container: %w", err)
	}
	select {
	case <-k.exited:
	case <-kctx.Done():
		return fmt.Errorf("kernel container did not exit after SIGKILL: %w", kctx.Err())
	}
	k.stopWatch()
	// The exit watch can fire (on a watch error) a moment before the
	// engine marks the container stopped; starting it then would fail.
	for {
		info, err := k.b.cli.ContainerInspect(kctx, k.containerID)
		if err != nil {
			return fmt.Errorf("inspect kernel container: %w", err)
		}
		if info.State == nil || !info.State.Running {
			break
		}
		select {
		case <-kctx.Done():
			return fmt.Errorf("kernel container still running after SIGKILL: %w", kctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	k.phases = nil
	t := time.Now()
	if err := k.boot(ctx); err != nil {
		return err
	}
	k.b.log.InfoContext(ctx, "sandbox kernel restarted", "kernel", k.ID(), "owner", k.owner, "duration", time.Since(t).Round(time.Millisecond), slog.Group("phases", k.phases...))
	k.phases = nil
	return nil
}

// isNotRunning reports the engine's "container is not running" answer to a
// kill, which means the work is already done.
func isNotRunning(err error) bool {
	return cerrdefs.IsConflict(err) || strings.Contains(err.Error(), "is not running")
}

// stopKernel drops the host side of the current kernel: the client and the
// exit watch's context (its goroutine ends when the watch errors out).
func (k *Kernel) stopKernel() {
	if k.client != nil {
		_ = k.client.Close()
		k.client = nil
	}
}

func (k *Kernel) isClosing() bool {
	select {
	case <-k.closing:
		return true
	default:
		return false
	}
}

// Close implements sandbox.Kernel: it removes the container, unmounts and
// deletes the working directory and removes the socket directory. A cell
// running at the time ends with sandbox.ErrClosed. Close is safe to call
// twice.
func (k *Kernel) Close() error {
	k.closeOnce.Do(func() {
		close(k.closing)
		if k.parent != nil {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.closeErr = k.teardownContext()
			return
		}
		// A harvest in progress fails loudly from here on instead of
		// reading a directory that is being removed.
		if k.files != nil {
			_ = k.files.Close()
		}
		// The contexts go with the container; they need not be killed
		// one by one first.
		k.ctxMu.Lock()
		ctxs := slices.Collect(maps.Keys(k.contexts))
		k.contexts = nil
		k.ctxMu.Unlock()
		for _, c := range ctxs {
			c.closeOnce.Do(func() {
				close(c.closing)
				c.mu.Lock()
				defer c.mu.Unlock()
				c.stopKernel()
				if c.stopWatch != nil {
					c.stopWatch()
				}
			})
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		k.closeErr = k.teardown()
		k.b.forget(k)
	})
	return k.closeErr
}

// EgressReady implements sandbox.Egress: the forwarder in the container
// answers on its socket.
func (k *Kernel) EgressReady(ctx context.Context) error {
	if k.parent != nil {
		return k.parent.EgressReady(ctx)
	}
	if k.isClosing() {
		return sandbox.ErrClosed
	}
	return k.egress.Ready(ctx)
}

// AcceptEgress implements sandbox.Egress.
func (k *Kernel) AcceptEgress(ctx context.Context) (net.Conn, error) {
	if k.parent != nil {
		return k.parent.AcceptEgress(ctx)
	}
	return k.egress.Accept(ctx)
}

// dialEgress connects to the forwarder's socket.
func (k *Kernel) dialEgress(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", filepath.Join(k.sockDir, egressSock))
}

// teardown releases everything setup made, whatever state it reached.
func (k *Kernel) teardown() error {
	var errs []error
	if k.egress != nil {
		_ = k.egress.Close()
	}
	k.stopKernel()
	if k.containerID != "" {
		ctx, cancel := context.WithTimeout(context.Background(), engineCallTimeout)
		err := k.b.cli.ContainerRemove(ctx, k.containerID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		cancel()
		if err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove kernel container: %w", err))
		}
	}
	if k.stopWatch != nil {
		k.stopWatch()
	}
	if k.files != nil {
		_ = k.files.Close()
	}
	if err := k.wd.remove(); err != nil {
		errs = append(errs, err)
	}
	if err := unmountAll(k.sockDir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(k.sockDir); err != nil {
		errs = append(errs, fmt.Errorf("remove socket dir: %w", err))
	}
	return errors.Join(errs...)
}

// cpuUsed is the CPU time the kernel's container has used, as the engine
// reports it (its cgroup, under either runtime).
func (k *Kernel) cpuUsed(ctx context.Context) (time.Duration, error) {
	st, err := k.stats(ctx, k.containerID, true)
	return time.Duration(st.CPUStats.CPUUsage.TotalUsage), err
}
