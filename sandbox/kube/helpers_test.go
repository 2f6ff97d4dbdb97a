package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
)

// cluster is the test cluster (scripts/kube.sh up prints the variables).
type cluster struct {
	kubeconfig, namespace, image string
	cs                           *kubernetes.Clientset
}

func needCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{
		kubeconfig: os.Getenv("TRIAD_KUBECONFIG"),
		namespace:  os.Getenv("TRIAD_KUBE_NAMESPACE"),
		image:      os.Getenv("TRIAD_KUBE_IMAGE"),
	}
	for name, v := range map[string]string{"TRIAD_KUBECONFIG": c.kubeconfig, "TRIAD_KUBE_NAMESPACE": c.namespace, "TRIAD_KUBE_IMAGE": c.image} {
		if v == "" {
			testenv.Missing(t, name+` (eval "$(scripts/kube.sh up)" sets it)`)
		}
	}
	rc, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.cs, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	return c
}

// testWriter sends a backend's logs to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var owners atomic.Int64

// owner is a deployment name of the test's own, so that backends of
// different tests never adopt, claim or sweep each other's pods.
func owner(t testing.TB) string {
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-", " ", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return strings.Trim(fmt.Sprintf("t%d-%s-%d", os.Getpid()%10000, name, owners.Add(1)), "-.")
}

// runtimeDefault, as a test's Config.RuntimeClass, asks for the cluster's
// default runtime (runc) whatever TRIAD_KUBE_RUNTIME_CLASS says.
const runtimeDefault = "-"

// config is a backend configuration for the test cluster.
func (c *cluster) config(t testing.TB, cfg kube.Config) kube.Config {
	t.Helper()
	rc, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rest, cfg.Namespace, cfg.Image = rc, c.namespace, c.image
	// The runtime and profile triad serve would use on this cluster
	// (scripts/kube.sh env; scripts/test.sh runs the kube suites under
	// runc and under gVisor).
	switch cfg.RuntimeClass {
	case "":
		cfg.RuntimeClass = os.Getenv("TRIAD_KUBE_RUNTIME_CLASS")
	case runtimeDefault:
		cfg.RuntimeClass = ""
	}
	if cfg.SeccompProfile == "" {
		cfg.SeccompProfile = os.Getenv("TRIAD_KUBE_SECCOMP_PROFILE")
	}
	if cfg.WorkDriver == "" {
		cfg.WorkDriver = os.Getenv("TRIAD_KUBE_WORK_DRIVER")
	}
	if cfg.Owner == "" {
		cfg.Owner = owner(t)
	}
	if cfg.Defaults.MemoryBytes == 0 {
		cfg.Defaults.MemoryBytes = 512 << 20
	}
	if cfg.Defaults.DiskBytes == 0 {
		cfg.Defaults.DiskBytes = 256 << 20
	}
	if cfg.MemoryRequest == 0 {
		cfg.MemoryRequest = 64 << 20
	}
	if cfg.CPURequest == 0 {
		cfg.CPURequest = 0.05
	}
	if cfg.TmpSize == 0 {
		cfg.TmpSize = 64 << 20
	}
	if cfg.Logger == nil {
		level := slog.LevelInfo
		if _, bench := t.(*testing.B); bench {
			level = slog.LevelWarn // a benchmark prints what it logs
		}
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	}
	return cfg
}

// newBackend opens a backend on the test cluster, closed when the test
// ends; since it is its deployment's only replica, closing it deletes its
// pods.
func (c *cluster) newBackend(t testing.TB, cfg kube.Config) *kube.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := kube.New(ctx, c.config(t, cfg))
	if err != nil {
		t.Fatalf("kube.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// pods lists the live pods of a deployment.
func (c *cluster) pods(t testing.TB, owner string) []string {
	t.Helper()
	list, err := c.cs.CoreV1().Pods(c.namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelOwner + "=" + owner})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

func startKernel(t testing.TB, b sandbox.Backend, spec sandbox.Spec) sandbox.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// run runs code and fails the test if the call errs.
func run(t testing.TB, k sandbox.Kernel, code string, timeout time.Duration) (*sandbox.Result, *sandbox.Collector) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+3*time.Minute)
	defer cancel()
	var col sandbox.Collector
	res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: timeout, Output: col.Add})
	if err != nil {
		t.Fatalf("Execute(%q): %v", code, err)
	}
	return res, &col
}

// value runs code that must succeed and returns its text/plain result.
func value(t testing.TB, k sandbox.Kernel, code string) string {
	t.Helper()
	res, col := run(t, k, code, time.Minute)
	if !res.OK {
		t.Fatalf("%q failed: %+v stdout=%q stderr=%q", code, res.Error, col.Stdout.String(), col.Stderr.String())
	}
	if col.Value == nil {
		t.Fatalf("%q: no result", code)
	}
	var s string
	if err := json.Unmarshal(col.Value.Data["text/plain"], &s); err != nil {
		t.Fatal(err)
	}
	return s
}
