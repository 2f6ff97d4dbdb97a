package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestConformance runs the sandbox conformance suite against kernel pods
// on the test cluster, one deployment (owner) per backend.
func TestConformance(t *testing.T) {
	c := needCluster(t)
	sandboxtest.Run(t, sandboxtest.Options{
		New: func(t *testing.T) sandbox.Backend {
			// A generous grace, as for Docker: the suite's kernels share
			// two cores with the cluster itself.
			return c.newBackend(t, kube.Config{InterruptGrace: 10 * time.Second})
		},
		Interrupts: true,
		Commands:   true, // pods/exec into the kernel container, under the supervisor
		Egress:     true, // the forwarder on the pod's loopback, by port-forward
	})
}

// TestJail: inside a run's pod the kernel is not root, has no capabilities,
// cannot write its root filesystem, reaches neither the internet nor the
// API server nor the node, sees no ServiceAccount token, and is bounded
// in processes.
func TestJail(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{Defaults: sandbox.Limits{Pids: 64}})
	k := startKernel(t, b, sandbox.Spec{Owner: "jail"})
	got := value(t, k, `import os, socket, json, threading, time
def reach(addr):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(addr)
        return "reached"
    except OSError as e:
        return "unreachable"
    finally:
        s.close()
try:
    open("/probe", "w")
    root = "writable"
except OSError as e:
    root = e.strerror
rootro = any(l.split()[1] == "/" and "ro" in l.split()[3].split(",") for l in open("/proc/self/mounts"))
capeff = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
host = os.environ.get("KUBERNETES_SERVICE_HOST", "10.96.0.1")
threads, stop = 0, threading.Event()
try:
    for _ in range(1000):
        threading.Thread(target=stop.wait, daemon=True).start()
        threads += 1
except RuntimeError:
    pass
stop.set()
json.dumps({
    "uid": os.getuid(), "capeff": capeff, "root": root, "rootro": rootro,
    "internet": reach(("1.1.1.1", 443)), "apiserver": reach((host, 443)),
    "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "service_env": [k for k in os.environ if k.endswith("_SERVICE_HOST") and k != "KUBERNETES_SERVICE_HOST"],
    "threads": threads,
})`)
	var j struct {
		UID                 int
		CapEff, Root        string
		RootRO              bool
		Internet, Apiserver string
		Token               bool
		ServiceEnv          []string `json:"service_env"`
		Threads             int
	}
	t.Logf("inside the pod: %s", got)
	if err := json.Unmarshal([]byte(strings.Trim(got, "'")), &j); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if j.UID == 0 {
		t.Errorf("uid: got 0, want non-root")
	}
	if j.CapEff != "0000000000000000" {
		t.Errorf("CapEff: got %s, want 0", j.CapEff)
	}
	// The root is mounted read-only. Writing to it fails with EROFS under
	// runc; gVisor checks the directory's permissions first and answers
	// EACCES (the uid does not own /), on the same read-only mount.
	if !j.RootRO || (j.Root != "Read-only file system" && j.Root != "Permission denied") {
		t.Errorf("writing /: got %q (mounted read-only: %v), want it refused on a read-only mount", j.Root, j.RootRO)
	}
	if j.Internet != "unreachable" || j.Apiserver != "unreachable" {
		t.Errorf("network: 1.1.1.1 %s, API server %s; want both unreachable", j.Internet, j.Apiserver)
	}
	// enableServiceLinks false: no variables for the namespace's
	// services (the kubelet always sets the API server's own).
	if j.Token || len(j.ServiceEnv) > 0 {
		t.Errorf("ServiceAccount token mounted %v, service env vars %v; want neither", j.Token, j.ServiceEnv)
	}
	// ulimit -p 64 counts every task of the pod's uid: the kernel's own
	// threads and the agent's take some, the rest is what a cell gets.
	if j.Threads >= 64 || j.Threads == 0 {
		t.Errorf("threads a cell could start: %d, want some but fewer than the limit of 64", j.Threads)
	}
}

// TestDiskLimit: a cell that writes past the working directory's size. With
// Triad's CSI driver (what triad serve and CI use) the write fails with
// ENOSPC at the limit and the kernel keeps its state, as on Docker; with a
// plain emptyDir the kubelet evicts the pod afterwards, and the cell's
// result is kernel_died with the eviction as the reason.
func TestDiskLimit(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{Defaults: sandbox.Limits{DiskBytes: 64 << 20}})
	k := startKernel(t, b, sandbox.Spec{Owner: "disk"})
	if c.config(t, kube.Config{}).WorkDriver != "" {
		value(t, k, "x = 7\nx")
		res, col := run(t, k, fillCell(128), 5*time.Minute)
		var mib int
		var tag string
		if _, err := fmt.Sscan(col.Stdout.String(), &tag, &mib); !res.OK || err != nil || tag != "ENOSPC" || mib > 64 {
			t.Fatalf("128 MiB into 64 MiB: got ok=%v %+v stdout=%q, want ENOSPC within 64 MiB", res.OK, res.Error, col.Stdout.String())
		}
		if got := value(t, k, "import os; os.remove('fill.bin'); open('small', 'wb').write(b'1' * (1 << 20)); x * 6"); got != "42" {
			t.Errorf("after ENOSPC: got %s, want 42 (state kept, space back)", got)
		}
		return
	}
	// 128 MiB into a 64 MiB directory; then wait for the kubelet, which
	// measures volumes every few seconds.
	res, col := run(t, k, `import os, time
with open("big.bin", "wb") as f:
    for _ in range(128):
        f.write(os.urandom(1 << 20))
print("written", flush=True)
time.sleep(300)`, 5*time.Minute)
	e := res.Error
	if res.OK || e == nil || e.Kind != sandbox.KindKernelDied || !res.Restarted {
		t.Fatalf("got %+v restarted=%v stdout=%q, want kind kernel_died with Restarted", e, res.Restarted, col.Stdout.String())
	}
	if !strings.HasPrefix(e.Reason, "Evicted") || !strings.Contains(e.Reason, "work") {
		t.Errorf("reason: got %q, want the eviction of the work volume", e.Reason)
	}
	if got := value(t, k, "1 + 1"); got != "2" {
		t.Errorf("after the eviction: got %s, want 2", got)
	}
}

// fillCell writes up to mib MiB into fill.bin and prints "ENOSPC n" or
// "WROTE n" with the MiB it wrote.
func fillCell(mib int) string {
	return fmt.Sprintf(`import errno, os
n = 0
try:
    with open("fill.bin", "wb") as f:
        for _ in range(%d):
            f.write(b"\1" * (1 << 20)); f.flush(); os.fsync(f.fileno()); n += 1
    print("WROTE", n)
except OSError as e:
    print("ENOSPC" if e.errno == errno.ENOSPC else e, n)`, mib)
}

// TestDiskFillLeavesOthersAlone: one run fills its working directory to
// the limit and keeps it full; meanwhile another run's new kernel starts
// and answers as usual, and the node never reports DiskPressure. (Before
// Triad's CSI driver, such a run wrote past its limit until the kubelet
// noticed, and the node's DiskPressure taint kept every tenant's new
// kernels from starting for minutes.)
func TestDiskFillLeavesOthersAlone(t *testing.T) {
	c := needCluster(t)
	if c.config(t, kube.Config{}).WorkDriver == "" {
		testenv.Missing(t, `TRIAD_KUBE_WORK_DRIVER (eval "$(scripts/kube.sh env)" sets it)`)
	}
	node := c.admin(t)
	pressure := make(chan string, 1)
	watchCtx, stopWatch := context.WithCancel(t.Context())
	var watched sync.WaitGroup
	watched.Add(1)
	go func() { // every second until the test ends: any DiskPressure is a failure
		defer watched.Done()
		defer close(pressure)
		for {
			nodes, err := node.CoreV1().Nodes().List(watchCtx, metav1.ListOptions{})
			if err == nil {
				for _, n := range nodes.Items {
					for _, cond := range n.Status.Conditions {
						if cond.Type == corev1.NodeDiskPressure && cond.Status == corev1.ConditionTrue {
							pressure <- n.Name + ": " + cond.Message
							return
						}
					}
				}
			}
			select {
			case <-watchCtx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	b := c.newBackend(t, kube.Config{Defaults: sandbox.Limits{DiskBytes: 256 << 20}})
	filler := startKernel(t, b, sandbox.Spec{Owner: "filler"})
	res, col := run(t, filler, fillCell(4096), 10*time.Minute)
	var mib int
	var tag string
	if _, err := fmt.Sscan(col.Stdout.String(), &tag, &mib); !res.OK || err != nil || tag != "ENOSPC" || mib > 256 {
		t.Fatalf("filling 256 MiB: got ok=%v %+v stdout=%q, want ENOSPC within 256 MiB", res.OK, res.Error, col.Stdout.String())
	}
	// The filler's directory stays full while another run starts.
	other := startKernel(t, b, sandbox.Spec{Owner: "bystander"})
	if got := value(t, other, "open('ok', 'w').write('fine'); 6 * 7"); got != "42" {
		t.Errorf("another run's new kernel during the fill: got %s, want 42", got)
	}
	stopWatch()
	watched.Wait()
	if p, ok := <-pressure; ok {
		t.Errorf("node DiskPressure during the fill: %s", p)
	}
}

// admin returns a cluster-admin client, for what Triad's identity may not
// read (nodes).
func (c *cluster) admin(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	adminKC := os.Getenv("TRIAD_KUBE_ADMIN_KUBECONFIG")
	if adminKC == "" {
		testenv.Missing(t, `TRIAD_KUBE_ADMIN_KUBECONFIG (eval "$(scripts/kube.sh up)" sets it)`)
	}
	rc, err := kube.RestConfig(adminKC)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestIOUringRefused: with Triad's profile as the pods' Localhost seccomp
// profile, io_uring_setup and the other calls Triad refuses fail with EPERM
// in a kernel pod, under runc and under gVisor alike (where the Sentry
// applies the profile: oci-seccomp). RuntimeDefault would allow io_uring.
func TestIOUringRefused(t *testing.T) {
	c := needCluster(t)
	if c.config(t, kube.Config{}).SeccompProfile == "" {
		testenv.Missing(t, `TRIAD_KUBE_SECCOMP_PROFILE (eval "$(scripts/kube.sh env)" sets it)`)
	}
	b := c.newBackend(t, kube.Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "uring"})
	got := value(t, k, `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = []
for name, nr, args in [("io_uring_setup", 425, (1, 0)), ("io_uring_enter", 426, (0, 0, 0, 0, 0)), ("keyctl", 250, (0, -3, 0, 0, 0)),
                       ("userfaultfd", 323, (0,)), ("bpf", 321, (0, 0, 0)), ("unshare", 272, (0x10000000,))]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    out.append(name + " " + (os.strerror(ctypes.get_errno()) if r == -1 else "succeeded"))
"; ".join(out)`)
	got = strings.Trim(got, "'")
	want := "io_uring_setup Operation not permitted; io_uring_enter Operation not permitted; keyctl Operation not permitted; userfaultfd Operation not permitted; bpf Operation not permitted; unshare Operation not permitted"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestKillInit: a cell that kills the pod's init (the pause process, PID
// 1 of the pod's shared process namespace) takes the whole pod down; the
// cell answers kernel_died and the run's next cell runs in a fresh kernel,
// as on Docker. (The run's files come back from the store: the core puts
// them into a working directory that lost them, sandbox.Losable.)
func TestKillInit(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "killinit"})
	value(t, k, "x = 5\nopen('kept.txt', 'w').write('kept')\nx")
	res, col := run(t, k, "import os, signal, time\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGTERM)\ntime.sleep(120)", 3*time.Minute)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || !res.Restarted {
		t.Fatalf("got ok=%v %+v restarted=%v stdout=%q, want kernel_died with a fresh kernel", res.OK, res.Error, res.Restarted, col.Stdout.String())
	}
	t.Logf("reason: %s", res.Error.Reason)
	if got := value(t, k, "1 + 1"); got != "2" {
		t.Errorf("next cell: got %s, want 2", got)
	}
	if r, _ := run(t, k, "x", time.Minute); r.OK || r.Error == nil || r.Error.Ename != "NameError" {
		t.Errorf("x after the pod died: got %+v, want NameError (a fresh kernel)", r.Error)
	}
}

// TestKillEveryOtherProcess: a cell kills every process its uid may signal
// (kill -1), the agent container's and, under gVisor, the relays' among
// them, while the kernel lives. The pod's working directory stays
// reachable (through the kernel container when the agent's is gone), and
// the cell either ends normally with the kernel's state kept (runc) or
// answers kernel_died with a fresh kernel (gVisor, whose relays died);
// never an error that leaves the run stuck.
func TestKillEveryOtherProcess(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "killall"})
	value(t, k, "x = 5\nx")
	res, col := run(t, k, "import os, signal\nos.kill(-1, signal.SIGKILL)\n'survived'", 2*time.Minute)
	switch {
	case res.OK:
		if got := value(t, k, "x + 1"); got != "6" {
			t.Errorf("the kernel after the cell: got %s, want 6 (state kept)", got)
		}
	case res.Error != nil && res.Error.Kind == sandbox.KindKernelDied && res.Restarted:
		t.Logf("kernel_died: %s", res.Error.Reason)
	default:
		t.Fatalf("got ok=%v %+v restarted=%v stdout=%q, want the cell to end or kernel_died with a fresh kernel", res.OK, res.Error, res.Restarted, col.Stdout.String())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := k.Files().Put(ctx, "after.txt", strings.NewReader("ok")); err != nil {
		t.Fatalf("working directory after kill -1: %v", err)
	}
	l, err := k.Files().Scan(ctx)
	if err != nil || !slices.ContainsFunc(l.Files, func(e sandbox.Entry) bool { return e.Path == "after.txt" }) {
		t.Fatalf("scan after kill -1: %+v, %v", l, err)
	}
	if got := value(t, k, "open('after.txt').read()"); got != "'ok'" {
		t.Errorf("the next cell: got %s, want 'ok'", got)
	}
}

// TestOOM: an 8 GiB allocation in a 512 MiB kernel is OOMKilled, which the
// cell reports as kernel_died with the reason from the pod status, while
// another run's kernel, which keeps its state, goes on working.
func TestOOM(t *testing.T) {
	c := needCluster(t)
	b := c.newBackend(t, kube.Config{})
	k := startKernel(t, b, sandbox.Spec{Owner: "oom"})
	other := startKernel(t, b, sandbox.Spec{Owner: "bystander"})
	value(t, other, "x = 21\nx")
	res, _ := run(t, k, "b = bytearray(8 << 30)\nb[::4096] = b'x' * len(b[::4096])", 2*time.Minute)
	e := res.Error
	if res.OK || e == nil || e.Kind != sandbox.KindKernelDied || e.Reason != "OOMKilled" || !res.Restarted {
		t.Fatalf("got %+v restarted=%v, want kernel_died, reason OOMKilled, Restarted", e, res.Restarted)
	}
	if got := value(t, other, "x * 2"); got != "42" {
		t.Errorf("the other run's kernel: got %s, want 42", got)
	}
	if got := value(t, k, "1 + 1"); got != "2" {
		t.Errorf("after the OOM: got %s, want 2", got)
	}
}

// TestAdoption: a second backend of the same deployment (another replica,
// or this one restarted) that starts a kernel for a run adopts the run's
// live pod, with its interpreter state and files; the first one detaches
// without deleting it.
func TestAdoption(t *testing.T) {
	c := needCluster(t)
	owner := owner(t)
	a := c.newBackend(t, kube.Config{Owner: owner})
	ka, err := a.Start(t.Context(), sandbox.Spec{Owner: "adopted-run"})
	if err != nil {
		t.Fatal(err)
	}
	value(t, ka, "x = 21\nopen('kept.txt', 'w').write('kept')")
	pod := ka.ID()
	if err := ka.(sandbox.Detacher).Detach(); err != nil {
		t.Fatal(err)
	}
	b := c.newBackend(t, kube.Config{Owner: owner})
	kb := startKernel(t, b, sandbox.Spec{Owner: "adopted-run"})
	if kb.ID() != pod {
		t.Errorf("adopted pod: got %s, want %s", kb.ID(), pod)
	}
	if got := value(t, kb, "x * 2, open('kept.txt').read()"); got != "(42, 'kept')" {
		t.Errorf("state in the adopted kernel: got %s, want (42, 'kept')", got)
	}
	// A run without a pod gets a fresh one.
	kc := startKernel(t, b, sandbox.Spec{Owner: "another-run"})
	if kc.ID() == pod {
		t.Errorf("another run adopted %s", pod)
	}
	if got := value(t, kc, "'x' in globals()"); got != "False" {
		t.Errorf("another run sees x: %s", got)
	}
}

// TestWarmPoolShared: warm pods are shared by the replicas of a
// deployment. Two replicas claiming at once get different pods, a claimed
// pod runs the run's cells, and a replica that closes while another lives
// leaves the run pods alone, while the last one out deletes them all.
func TestWarmPoolShared(t *testing.T) {
	c := needCluster(t)
	owner := owner(t)
	a := c.newBackend(t, kube.Config{Owner: owner, Warm: 2})
	b := c.newBackend(t, kube.Config{Owner: owner})
	deadline := time.Now().Add(3 * time.Minute)
	for a.Pooled() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool has %d pods after 3 minutes, want 2", a.Pooled())
		}
		time.Sleep(100 * time.Millisecond)
	}
	warm := map[string]bool{}
	for _, p := range c.pods(t, owner) {
		warm[p] = true
	}
	// b has no warm pods of its own: it claims a's, racing a itself.
	var ka, kb sandbox.Kernel
	var wg sync.WaitGroup
	for _, x := range []struct {
		be  *kube.Backend
		run string
		k   *sandbox.Kernel
	}{{a, "run-a", &ka}, {b, "run-b", &kb}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := x.be.Start(t.Context(), sandbox.Spec{Owner: x.run})
			if err != nil {
				t.Error(err)
				return
			}
			*x.k = k
		}()
	}
	wg.Wait()
	if ka == nil || kb == nil {
		t.FailNow()
	}
	if ka.ID() == kb.ID() || !warm[ka.ID()] || !warm[kb.ID()] {
		t.Errorf("claims: a got %s, b got %s, from warm pods %v; want two different warm pods", ka.ID(), kb.ID(), warm)
	}
	if got := value(t, kb, "y = 2\ny"); got != "2" {
		t.Errorf("a claimed pod runs cells: got %s", got)
	}
	// b closes while a lives: run-b's pod stays for a to adopt.
	podB := kb.ID()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.pods(t, owner), podB) {
		t.Errorf("run-b's pod %s went with b, want it kept for the other replica", podB)
	}
	kb2 := startKernel(t, a, sandbox.Spec{Owner: "run-b"})
	if got := value(t, kb2, "y * 21"); got != "42" {
		t.Errorf("run-b adopted by a: got %s, want 42", got)
	}
	// a is the last one out: every pod of the deployment goes.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if left := c.pods(t, owner); len(left) != 0 {
		t.Errorf("pods left after the last replica closed: %v", left)
	}
}

// TestNetworkPolicyCreated: New makes sure the namespace has the deny-all
// NetworkPolicy, creating it when missing (here in a namespace of the
// test's own, as cluster-admin, since Triad's Role may not delete the
// shared one to show this).
func TestNetworkPolicyCreated(t *testing.T) {
	c := needCluster(t)
	adminKC := os.Getenv("TRIAD_KUBE_ADMIN_KUBECONFIG")
	if adminKC == "" {
		testenv.Missing(t, `TRIAD_KUBE_ADMIN_KUBECONFIG (eval "$(scripts/kube.sh up)" sets it)`)
	}
	admin, err := kube.RestConfig(adminKC)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := "triad-np-" + strings.ToLower(owner(t))
	if len(ns) > 60 {
		ns = ns[:60]
	}
	ns = strings.TrimRight(ns, "-.")
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	cfg := c.config(t, kube.Config{})
	cfg.Rest, cfg.Namespace = admin, ns
	b, err := kube.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), kube.NetworkPolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the deny-all policy: %v", err)
	}
	if len(np.Spec.PodSelector.MatchLabels) != 0 || len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 || len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("policy: got %+v, want every pod, ingress and egress, no rules", np.Spec)
	}
}
