package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kubelease"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/kube/csi"
	"github.com/triadhq/triad/sandbox/template"
)

// sandboxConfig holds the sandbox flags.
type sandboxConfig struct {
	Backend        string
	Image          string
	DockerRuntime  string
	Memory         string
	CPUs           float64
	Pids           int64
	Disk           string
	CellTimeout    time.Duration
	MaxCellTimeout time.Duration
	InterruptGrace time.Duration
	IdleTTL        time.Duration
	UsageEvery     time.Duration
	Warm           int
	Starts         int
	StartShares    int64

	KubeNamespace     string
	KubeImage         string
	KubeRuntimeClass  string
	KubeSeccomp       string
	KubeWorkDriver    string
	Kubeconfig        string
	KubeOwner         string
	KubeRunWait       time.Duration
	KubeLeaseDuration time.Duration

	Templates   string
	EgressTrust string

	memory, disk int64
}

func (c *sandboxConfig) flags(f *flagSet) {
	f.str(&c.Backend, "sandbox", "auto", "sandbox backend: docker, wasm, kube, auto (docker when an engine answers, else wasm) or none")
	f.str(&c.DockerRuntime, "docker-runtime", docker.RuntimeAuto, "OCI runtime of Docker kernels: runsc (gVisor, a second kernel between a cell and the host's), runc (the host's kernel behind Triad's seccomp profile), or auto (runsc when the engine has it, else runc; scripts/gvisor.sh docker registers it)")
	f.str(&c.Image, "image", "", "sandbox image for --sandbox docker (default: the tag this build derives from its package list, built on first use)")
	f.str(&c.Memory, "memory", "2GiB", "memory per kernel, swap included")
	f.float(&c.CPUs, "cpus", 1, "CPUs per kernel")
	f.int64(&c.Pids, "pids", 256, "processes and threads per kernel")
	f.str(&c.Disk, "disk", "2GiB", "disk quota of each kernel's working directory")
	f.duration(&c.CellTimeout, "cell-timeout", 60*time.Second, "default cell deadline (timeout_s overrides it)")
	f.duration(&c.MaxCellTimeout, "max-cell-timeout", 10*time.Minute, "largest deadline a cell may ask for")
	f.duration(&c.InterruptGrace, "interrupt-grace", docker.DefaultGrace, "how long a stopped cell (past its deadline, abandoned by its caller, or over its output limit) has to end after an interrupt before its kernel is restarted and its state lost")
	f.duration(&c.IdleTTL, "idle-ttl", 30*time.Minute, "stop a run's kernel after this long unused (its files stay)")
	f.duration(&c.UsageEvery, "usage-every", 30*time.Second, "read each live kernel's CPU and memory this often for its run's usage, besides after each cell and before it stops (0: only then)")
	f.int(&c.Warm, "warm", 2, "ready kernels kept in the warm pool (with --sandbox kube: warm pods this replica adds to the pool all replicas share)")
	f.int(&c.Starts, "kernel-starts", autoStarts, "kernels starting at once; runs beyond it wait their turn in arrival order (0: no limit; -1: one more than the host's CPUs with --sandbox docker, no limit with wasm and kube)")
	f.int64(&c.StartShares, "kernel-start-cpu-shares", docker.NormalCPUShares, "CPU weight (cpu.shares, 2 to 1024) of a Docker kernel until it answers, so that starts yield to running cells; 1024, the normal weight, leaves starts unweighted (admission, --kernel-starts, is what spares running cells by default)")
	f.str(&c.KubeNamespace, "kube-namespace", "triad-kernels", "namespace of the kernel pods, their NetworkPolicy and Leases, for --sandbox kube")
	f.str(&c.KubeImage, "kube-image", "", "sandbox image as the cluster's nodes pull it, for --sandbox kube (default: `triad image tag`, imported into the nodes' runtime)")
	f.str(&c.KubeRuntimeClass, "kube-runtime-class", "", "RuntimeClass of kernel pods, e.g. gvisor (default: the cluster's default runtime); deploy/kubernetes sets gvisor")
	f.str(&c.KubeSeccomp, "kube-seccomp-profile", kube.DefaultSeccompProfile, "kernel pods' Localhost seccomp profile, under the kubelet's seccomp directory (install `triad image seccomp` there on every node); empty: the runtime's default profile")
	f.str(&c.KubeWorkDriver, "kube-work-driver", csi.DriverName, "CSI driver of kernel pods' working directories: Triad's node plugin (`triad csi-workdir` on every node) gives each a volume of exactly --disk, refusing writes past it; empty: an emptyDir, whose size the kubelet enforces only by evicting the pod afterwards")
	f.str(&c.Kubeconfig, "kubeconfig", "", "kubeconfig for --sandbox kube (default: the in-cluster ServiceAccount, else $KUBECONFIG or ~/.kube/config)")
	f.str(&c.KubeOwner, "kube-owner", "triad", "name of this Triad deployment on the cluster: replicas with the same name share kernel pods, the warm pool and run Leases")
	f.duration(&c.KubeRunWait, "kube-run-wait", 5*time.Minute, "how long a call waits for a run another replica is serving before failing with kind conflict")
	f.duration(&c.KubeLeaseDuration, "kube-lease-duration", 15*time.Second, "how long a run's Lease outlives a replica that stopped renewing it (died)")
	f.str(&c.Templates, "templates", "", "directory of sandbox templates, one NAME.yaml each: image additions, limits and an egress policy (docs/sandboxes.md, \"Templates\"); a run picks one at creation")
	f.str(&c.EgressTrust, "egress-trust", "", "PEM file of extra CA certificates the kernels of runs with egress trust (an internal package mirror's CA)")
}

func (c *sandboxConfig) validate() error {
	switch c.Backend {
	case "docker", "wasm", "kube", "auto", "none":
	default:
		return fmt.Errorf("--sandbox %q: want docker, wasm, kube, auto or none", c.Backend)
	}
	switch c.DockerRuntime {
	case docker.RuntimeRunsc, docker.RuntimeRunc, docker.RuntimeAuto:
	default:
		return fmt.Errorf("--docker-runtime %q: want runsc, runc or auto", c.DockerRuntime)
	}
	if c.UsageEvery < 0 {
		return fmt.Errorf("--usage-every %v: want a positive duration, or 0 to read kernels only after each cell and before they stop", c.UsageEvery)
	}
	if c.Backend == "kube" {
		if c.KubeNamespace == "" {
			return fmt.Errorf("--sandbox kube needs --kube-namespace (TRIAD_KUBE_NAMESPACE)")
		}
		if c.KubeRunWait <= 0 || c.KubeLeaseDuration < 3*time.Second {
			return fmt.Errorf("--kube-run-wait must be positive and --kube-lease-duration at least 3s")
		}
	}
	var err error
	if c.memory, err = parseBytes(c.Memory); err != nil {
		return fmt.Errorf("--memory: %w", err)
	}
	if c.disk, err = parseBytes(c.Disk); err != nil {
		return fmt.Errorf("--disk: %w", err)
	}
	if c.StartShares < 2 || c.StartShares > docker.NormalCPUShares {
		return fmt.Errorf("--kernel-start-cpu-shares %d: want 2 to %d", c.StartShares, docker.NormalCPUShares)
	}
	if c.CPUs <= 0 || c.Pids <= 0 || c.Warm < 0 || c.Starts < autoStarts || c.CellTimeout <= 0 || c.MaxCellTimeout < c.CellTimeout {
		return fmt.Errorf("--cpus and --pids must be positive, --warm not negative, --kernel-starts at least -1, and --max-cell-timeout at least --cell-timeout")
	}
	if c.InterruptGrace <= 0 {
		return fmt.Errorf("--interrupt-grace %s: want a positive duration, like 3s", c.InterruptGrace)
	}
	return nil
}

// autoStarts is --kernel-starts' default: admission sized to the host
// for Docker (startsFor).
const autoStarts = -1

// startsFor is how many kernels may start at once on the named backend.
// With the default, a Docker host admits one more start than it has CPUs,
// and runs beyond that wait in arrival order: a start is a Python
// interpreter importing ipykernel, CPU-bound, so more at once only share
// the same cores, and the extra one covers a start's waits on the engine
// (docs/DECISIONS.md, "Kernel start admission"). wasm starts are cheap
// and in-process, and kube starts run on the cluster's nodes, not this
// host's CPUs: neither is limited unless asked.
func (c *sandboxConfig) startsFor(backend string) int {
	if c.Starts != autoStarts {
		return c.Starts
	}
	if backend == "docker" {
		return runtime.NumCPU() + 1
	}
	return 0
}

func (c *sandboxConfig) limits() sandbox.Limits {
	return sandbox.Limits{MemoryBytes: c.memory, CPUs: c.CPUs, Pids: c.Pids, DiskBytes: c.disk}
}

// openSandbox starts the configured backend. progress receives the image
// build's output on first use. It returns nil for --sandbox none.
func openSandbox(ctx context.Context, c *config, log *slog.Logger, progress io.Writer) (sandbox.Backend, error) {
	sc := &c.Sandbox
	if sc.Backend == "none" {
		return nil, nil
	}
	if sc.Backend == "kube" {
		return openKube(ctx, c, log)
	}
	if sc.Backend == "docker" || sc.Backend == "auto" {
		b, err := openDocker(ctx, c, log, progress)
		if err == nil || sc.Backend == "docker" {
			return b, err
		}
		log.Warn("no Docker engine answers; using the embedded wasm sandbox", "err", err)
	}
	return openWasm(ctx, c, log)
}

func openDocker(ctx context.Context, c *config, log *slog.Logger, progress io.Writer) (sandbox.Backend, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = cli.Ping(pctx)
	cancel()
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: no Docker engine answers: %v", sandbox.ErrUnavailable, err)
	}
	tag := c.Sandbox.Image
	if tag == "" {
		tag, err = image.Ensure(ctx, cli, image.Options{Progress: progress, Logger: log})
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("sandbox image: %w", err)
		}
	}
	cli.Close()
	return docker.New(ctx, docker.Config{
		Image:          tag,
		Runtime:        c.Sandbox.DockerRuntime,
		WorkRoot:       filepath.Join(c.Data, "work", "docker"),
		Defaults:       c.Sandbox.limits(),
		CellTimeout:    c.Sandbox.CellTimeout,
		InterruptGrace: c.Sandbox.InterruptGrace,
		StartCPUShares: c.Sandbox.StartShares,
		Logger:         log,
	})
}

// openKube starts the Kubernetes backend: kernels as pods in
// --kube-namespace, reached through the API server.
func openKube(ctx context.Context, c *config, log *slog.Logger) (sandbox.Backend, error) {
	sc := &c.Sandbox
	rc, err := kube.RestConfig(sc.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	img := sc.KubeImage
	if img == "" {
		img = image.Tag()
	}
	return kube.New(ctx, kube.Config{
		Rest:           rc,
		Namespace:      sc.KubeNamespace,
		Image:          img,
		RuntimeClass:   sc.KubeRuntimeClass,
		SeccompProfile: sc.KubeSeccomp,
		WorkDriver:     sc.KubeWorkDriver,
		Owner:          sc.KubeOwner,
		Warm:           sc.Warm,
		IdleTTL:        sc.IdleTTL,
		Defaults:       sc.limits(),
		CellTimeout:    sc.CellTimeout,
		InterruptGrace: sc.InterruptGrace,
		Logger:         log,
	})
}

// runLock is the run lock the sandbox needs: a Lease per run when kernels
// are pods that several replicas share, else nil (the orchestrator's
// in-process lock). The returned func closes it.
func runLock(c *config, backend sandbox.Backend, log *slog.Logger) (lock orchestrator.RunLock, replica string, closeLock func(), err error) {
	kb, ok := backend.(*kube.Backend)
	if !ok {
		return nil, "", func() {}, nil
	}
	rc, err := kube.RestConfig(c.Sandbox.Kubeconfig)
	if err != nil {
		return nil, "", nil, err
	}
	// The replica's name holds its run Leases, and names it in the record
	// of a call in progress, so a call it was serving when it died says so.
	l, err := kubelease.New(kubelease.Config{
		Rest: rc, Namespace: c.Sandbox.KubeNamespace, Owner: c.Sandbox.KubeOwner, Holder: kb.Instance(),
		Duration: c.Sandbox.KubeLeaseDuration, Wait: c.Sandbox.KubeRunWait, Logger: log,
	})
	if err != nil {
		return nil, "", nil, err
	}
	return l, kb.Instance(), func() { l.Close() }, nil
}

// parseBytes reads "2GiB", "512MiB", "2g", "1048576".
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%q is not a size like 2GiB, 512MiB or 1048576", s)
	}
	return int64(f * float64(mult)), nil
}

// sandboxChoice is what runs may choose their sandbox from: the server's
// templates, with their images present, and the egress proxy for the
// backends whose kernels can reach the network through it.
type sandboxChoice struct {
	templates *template.Set
	proxy     *egress.Proxy
	trust     []byte
	digest    func(ctx context.Context, ref string) (string, error)
}

// openTemplates loads --templates and makes each template's image present
// on a Docker backend (built offline and cached by content on first use,
// like the sandbox image); a Kubernetes backend's nodes must have them
// (`triad image export --template NAME`).
func openTemplates(ctx context.Context, c *config, backend sandbox.Backend, m egress.Metrics, log *slog.Logger, progress io.Writer) (sandboxChoice, error) {
	var ch sandboxChoice
	set, err := template.Load(c.Sandbox.Templates, nil)
	if err != nil {
		return ch, err
	}
	ch.templates = set
	if backend == nil {
		return ch, nil
	}
	if c.Sandbox.EgressTrust != "" {
		if ch.trust, err = os.ReadFile(c.Sandbox.EgressTrust); err != nil {
			return ch, fmt.Errorf("--egress-trust: %w", err)
		}
	}
	switch backend.Name() {
	case "docker", "kube":
		ch.proxy = egress.New(egress.Config{Metrics: m, Logger: log.With("component", "egress")})
	}
	for _, t := range set.All() {
		if t.Variant == nil {
			continue
		}
		tag, err := t.Variant.Tag()
		if err != nil {
			return ch, err
		}
		switch backend.Name() {
		case "docker":
			cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
			if err != nil {
				return ch, err
			}
			_, err = image.EnsureVariant(ctx, cli, image.Options{Progress: progress, Logger: log}, *t.Variant)
			cli.Close()
			if err != nil {
				return ch, fmt.Errorf("template %s: %w", t.Name, err)
			}
		case "kube":
			log.Info("template image: the cluster's nodes must have it (triad image export --template)", "template", t.Name, "image", tag)
		default:
			return ch, fmt.Errorf("template %s adds to the sandbox image, which --sandbox %s has none of: use docker or kube", t.Name, backend.Name())
		}
	}
	if backend.Name() == "docker" {
		ch.digest = func(ctx context.Context, ref string) (string, error) {
			cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
			if err != nil {
				return "", err
			}
			defer cli.Close()
			return image.Digest(ctx, cli, ref)
		}
	}
	log.Info("sandbox templates", "templates", strings.Join(set.Names(), ", "), "egress", ch.proxy != nil)
	return ch, nil
}
