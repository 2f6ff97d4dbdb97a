package kube

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/triadhq/triad/sandbox"
)

// Defaults of Config.
const (
	DefaultOwner         = "triad"
	DefaultMemory        = 2 << 30
	DefaultCPUs          = 1.0
	DefaultPids          = 256
	DefaultDisk          = 2 << 30
	DefaultTmpSize       = 256 << 20
	DefaultGrace         = 3 * time.Second
	DefaultCellTimeout   = 60 * time.Second
	DefaultCPURequest    = 0.1
	DefaultMemoryRequest = 256 << 20
	// DefaultInstanceTTL is how long a replica's instance Lease lasts
	// without renewal: past it, the replica counts as gone and its warm
	// pods as orphans.
	DefaultInstanceTTL = 15 * time.Second
	// DefaultSeccompProfile is where scripts/kube.sh installs Triad's
	// seccomp profile on a node, as a Localhost profile names it.
	DefaultSeccompProfile = "triad-kernel.json"
)

// Config configures a Backend. Rest, Namespace and Image are required.
type Config struct {
	// Rest reaches the API server as Triad's ServiceAccount (see
	// RestConfig).
	Rest *rest.Config
	// Namespace holds the kernel pods, the NetworkPolicy and the Leases.
	// It should enforce the restricted Pod Security Standard, as
	// deploy/kubernetes's does.
	Namespace string
	// Image is the sandbox image as the nodes pull it (`triad image tag`,
	// pushed to a registry, or imported into each node's runtime).
	Image string
	// PullPolicy is the kernel containers' image pull policy; empty means
	// IfNotPresent.
	PullPolicy corev1.PullPolicy
	// RuntimeClass, when set, runs kernel pods under that RuntimeClass
	// (gVisor's "gvisor", say). Such pods are reached through exec
	// sessions, not port-forward (see dialerFor).
	RuntimeClass string
	// SeccompProfile, when set, is the kernel pods' Localhost seccomp
	// profile: a path under the kubelet's seccomp directory holding
	// Triad's profile in OCI form (`triad image seccomp` prints it;
	// scripts/kube.sh installs it as DefaultSeccompProfile). Empty means
	// the runtime's default profile (RuntimeDefault), which allows
	// io_uring and does not refuse what Triad's does.
	SeccompProfile string
	// WorkDriver, when set, names the CSI driver of the kernels' working
	// directories: csi.DriverName, Triad's node plugin (sandbox/kube/csi),
	// which must run on every node, gives each pod a volume of exactly
	// its disk limit. Empty means an emptyDir with a size limit, which the
	// kubelet enforces only by evicting the pod after the bytes are
	// written (see docs/DECISIONS.md, "The kube working directory's
	// quota").
	WorkDriver string
	// Owner names the Triad deployment in LabelOwner: the replicas of one
	// deployment share pods, warm pool and Leases; two deployments in one
	// namespace leave each other alone. Empty means "triad".
	Owner string
	// Instance names this replica; empty means the host name plus a random
	// suffix. It must be unique among live replicas.
	Instance string
	// Warm is how many ready pods this replica keeps in the shared warm
	// pool (any replica may claim any of them).
	Warm int
	// IdleTTL deletes a run's pod once no replica has used it for this
	// long (its files stay in the store); 0 never.
	IdleTTL time.Duration
	// InstanceTTL is how long this replica's instance Lease lasts without
	// renewal; zero means DefaultInstanceTTL.
	InstanceTTL time.Duration
	// Defaults are the limits for a Spec that leaves fields zero; zero
	// fields here mean 2 GiB memory, 1 CPU, 256 pids, a 2 GiB working
	// directory and sandbox.DefaultOutputBytes of output per cell.
	Defaults sandbox.Limits
	// TmpSize caps the memory-backed /tmp (counted against memory too).
	// Zero means 256 MiB.
	TmpSize int64
	// CPURequest and MemoryRequest are what a kernel asks the scheduler
	// for (its limits are Defaults'); zero means 0.1 CPU and 256 MiB.
	CPURequest    float64
	MemoryRequest int64
	// InterruptGrace and CellTimeout are as in sandbox/docker: zero means
	// 3 s and 60 s.
	InterruptGrace time.Duration
	CellTimeout    time.Duration
	// Logger receives structured logs; nil is silent.
	Logger *slog.Logger
}

// RestConfig returns the client configuration for kubeconfig, or, when it
// is empty, the in-cluster configuration (a pod's ServiceAccount) falling
// back to $KUBECONFIG and ~/.kube/config.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	return cfg, nil
}

// labelValue matches what a label value may be.
var labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)

func (cfg Config) withDefaults() (Config, error) {
	if cfg.Rest == nil {
		return cfg, errors.New("kube backend: Config.Rest is required")
	}
	if cfg.Namespace == "" {
		return cfg, errors.New("kube backend: Config.Namespace is required (--kube-namespace)")
	}
	if cfg.Image == "" {
		return cfg, errors.New("kube backend: Config.Image is required (--kube-image)")
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	if cfg.Owner == "" {
		cfg.Owner = DefaultOwner
	}
	if cfg.Instance == "" {
		host, _ := os.Hostname()
		host = strings.Trim(regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(host, "-"), "-_.")
		if len(host) > 40 {
			host = host[:40]
		}
		var r [3]byte
		_, _ = rand.Read(r[:])
		cfg.Instance = strings.TrimLeft(host+"-"+hex.EncodeToString(r[:]), "-")
	}
	for _, v := range []struct{ name, value string }{{"Owner", cfg.Owner}, {"Instance", cfg.Instance}} {
		if !labelValue.MatchString(v.value) || len(v.value) > 63 {
			return cfg, fmt.Errorf("kube backend: %s %q is not a valid label value (at most 63 letters, digits, '-', '_' and '.')", v.name, v.value)
		}
	}
	if cfg.Warm < 0 {
		return cfg, errors.New("kube backend: Config.Warm is negative")
	}
	if cfg.InstanceTTL <= 0 {
		cfg.InstanceTTL = DefaultInstanceTTL
	}
	cfg.Defaults = cfg.Defaults.Or(sandbox.Limits{MemoryBytes: DefaultMemory, CPUs: DefaultCPUs,
		Pids: DefaultPids, DiskBytes: DefaultDisk, OutputBytes: sandbox.DefaultOutputBytes})
	if cfg.TmpSize == 0 {
		cfg.TmpSize = DefaultTmpSize
	}
	if cfg.CPURequest == 0 {
		cfg.CPURequest = DefaultCPURequest
	}
	if cfg.MemoryRequest == 0 {
		cfg.MemoryRequest = DefaultMemoryRequest
	}
	if cfg.InterruptGrace == 0 {
		cfg.InterruptGrace = DefaultGrace
	}
	if cfg.CellTimeout == 0 {
		cfg.CellTimeout = DefaultCellTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Kernels make many small requests (pods, exec and port-forward
	// streams, Leases); client-go's default of 5 per second would queue
	// them.
	r := rest.CopyConfig(cfg.Rest)
	if r.QPS == 0 {
		r.QPS, r.Burst = 100, 200
	}
	cfg.Rest = r
	return cfg, nil
}
