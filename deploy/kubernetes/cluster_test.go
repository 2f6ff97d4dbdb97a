package kubernetes_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRestrictedPolicyRejectsPods shows the kernels' namespace enforcing the
// restricted Pod Security Standard at admission: each pod below differs
// from a kernel pod by one thing the standard forbids, and creating it as
// Triad is refused, while the kernel pod itself is admitted.
func TestRestrictedPolicyRejectsPods(t *testing.T) {
	c := needCluster(t)
	ctx := t.Context()
	pods := c.triadClient.CoreV1().Pods(c.namespace)

	// The control: the unmodified kernel pod passes admission.
	if _, err := pods.Create(ctx, c.kernelPod("sleep", "1"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("a kernel pod was refused: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.Pod)
		want   string
	}{
		{"keeps capabilities", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Capabilities = nil }, "unrestricted capabilities"},
		{"adds SYS_ADMIN", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}, "unrestricted capabilities"},
		{"runs as root", func(p *corev1.Pod) {
			p.Spec.SecurityContext.RunAsNonRoot = nil
			p.Spec.SecurityContext.RunAsUser = ptr(int64(0))
		}, "runAsUser=0"},
		{"allows privilege escalation", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr(true)
		}, "allowPrivilegeEscalation != false"},
		{"has no seccomp profile", func(p *corev1.Pod) { p.Spec.SecurityContext.SeccompProfile = nil }, "seccompProfile"},
		{"uses the host network", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "host namespaces"},
		{"mounts a hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "restricted volume types"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := c.kernelPod("sleep", "1")
			tc.mutate(pod)
			created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			if err == nil {
				c.deletePod(created.Name)
				t.Fatalf("pod %s was admitted, want it refused by Pod Security", created.Name)
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want Forbidden: violates PodSecurity \"restricted:latest\": …%s…", err, tc.want)
			}
		})
	}
}

// TestTriadIdentityRunsKernels acts as Triad's ServiceAccount with the
// deployed Role: it runs a kernel pod, execs into it over both stream
// protocols, reads its logs and holds a Lease, and inside the pod finds the
// jail the Role's pods get.
func TestTriadIdentityRunsKernels(t *testing.T) {
	c := needCluster(t)
	ctx := t.Context()
	pod := c.runPod(t, c.kernelPod("sh", "-c", "echo kernel-started; exec sleep infinity"))

	// 1.1.1.1 stands for the internet, 10.96.0.1 is the API server's
	// service address, and the node's own address carries the kubelet (and
	// would carry the API server if it listened there).
	probe := `id -u
grep CapEff /proc/self/status
touch /probe 2>&1 || true
touch /work/probe && echo workdir-writable
python3 - <<'EOF'
import socket
for addr in [("1.1.1.1", 443), ("10.96.0.1", 443), ("` + pod.Status.HostIP + `", 10250)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(addr)
        print("reached", addr)
    except OSError as e:
        print("unreachable", addr, e.strerror)
EOF`
	for _, proto := range []struct {
		name      string
		websocket bool
	}{{"SPDY", false}, {"WebSocket", true}} {
		t.Run("exec over "+proto.name, func(t *testing.T) {
			stdout, stderr, err := execIn(ctx, c.triad, pod, proto.websocket, nil, "sh", "-c", probe)
			if err != nil {
				t.Fatalf("exec: %v; stderr %q", err, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			if len(lines) != 7 {
				t.Fatalf("got %q, want seven lines", stdout)
			}
			if lines[0] == "0" {
				t.Errorf("uid: got 0, want non-root")
			}
			if got := strings.Fields(lines[1]); len(got) != 2 || got[1] != "0000000000000000" {
				t.Errorf("got %q, want CapEff 0000000000000000", lines[1])
			}
			if !strings.Contains(lines[2], "Read-only file system") {
				t.Errorf("touch /probe: got %q, want Read-only file system", lines[2])
			}
			if lines[3] != "workdir-writable" {
				t.Errorf("touch /work/probe: got %q, want workdir-writable", lines[3])
			}
			for _, l := range lines[4:] {
				if !strings.HasPrefix(l, "unreachable") || !strings.Contains(l, "Network is unreachable") {
					t.Errorf("got %q, want the address unreachable (no route out of the pod)", l)
				}
			}
		})
	}

	logs, err := c.triadClient.CoreV1().Pods(c.namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "kernel-started") {
		t.Errorf("logs: got %q, %v; want kernel-started", logs, err)
	}

	leases := c.triadClient.CoordinationV1().Leases(c.namespace)
	lease, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "deploy-test-run-"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr("replica-a"), LeaseDurationSeconds: ptr(int32(15))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	lease.Spec.HolderIdentity = ptr("replica-b")
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Errorf("take over lease: %v", err)
	}
	if err := leases.Delete(ctx, lease.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete lease: %v", err)
	}
}

// TestTriadIdentityIsLeastPrivilege shows what the Role does not grant:
// Secrets (even in Triad's own namespaces), any other namespace, changing
// or deleting the NetworkPolicy, RBAC and the nodes are all Forbidden to
// Triad. (It may read and create the deny-all policy, which New does.)
func TestTriadIdentityIsLeastPrivilege(t *testing.T) {
	c := needCluster(t)
	ctx := t.Context()
	core := c.triadClient.CoreV1()
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"list secrets in the kernels' namespace", func() error {
			_, err := core.Secrets(c.namespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get a secret in triad", func() error { _, err := core.Secrets("triad").Get(ctx, "triad-s3", metav1.GetOptions{}); return err }},
		{"list pods in default", func() error { _, err := core.Pods("default").List(ctx, metav1.ListOptions{}); return err }},
		{"create a pod in default", func() error {
			p := c.kernelPod("sleep", "1")
			p.Namespace = "default"
			_, err := core.Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"list pods in kube-system", func() error { _, err := core.Pods("kube-system").List(ctx, metav1.ListOptions{}); return err }},
		{"list pods in every namespace", func() error { _, err := core.Pods("").List(ctx, metav1.ListOptions{}); return err }},
		{"create a configmap", func() error {
			_, err := core.ConfigMaps(c.namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"delete the NetworkPolicy", func() error {
			return c.triadClient.NetworkingV1().NetworkPolicies(c.namespace).Delete(ctx, "deny-all", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"loosen the NetworkPolicy", func() error {
			np, err := c.triadClient.NetworkingV1().NetworkPolicies(c.namespace).Get(ctx, "deny-all", metav1.GetOptions{})
			if err != nil {
				return err
			}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
			_, err = c.triadClient.NetworkingV1().NetworkPolicies(c.namespace).Update(ctx, np, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"list NetworkPolicies", func() error {
			_, err := c.triadClient.NetworkingV1().NetworkPolicies(c.namespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"grant itself a Role", func() error {
			_, err := c.triadClient.RbacV1().Roles(c.namespace).Create(ctx, &rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Name: "more"},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}},
			}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"list nodes", func() error { _, err := core.Nodes().List(ctx, metav1.ListOptions{}); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !apierrors.IsForbidden(err) {
				t.Fatalf("got %v, want Forbidden", err)
			}
		})
	}
}

// TestPortForwardToLoopbackListener is the kube backend's transport to a
// kernel: a server bound to 127.0.0.1 inside a restricted pod, reached from
// Triad only through the API server's port-forward stream (no pod-network
// route, no local listener on Triad's side). The page served is a file an
// exec wrote, so both streams reach the same pod.
func TestPortForwardToLoopbackListener(t *testing.T) {
	c := needCluster(t)
	ctx := t.Context()
	pod := c.runPod(t, c.kernelPod("python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp"))
	if _, stderr, err := execIn(ctx, c.triad, pod, false, strings.NewReader("hello from the pod\n"), "sh", "-c", "cat > /tmp/hello.txt"); err != nil {
		t.Fatalf("exec: %v %s", err, stderr)
	}
	fw, err := forward(c.triad, pod)
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()

	// The server may not listen yet when the pod turns Ready.
	var resp string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err = httpGet(fw, 8000, "/hello.txt")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GET through port-forward: %v", err)
	}
	if !strings.HasPrefix(resp, "HTTP/1.0 200") || !strings.HasSuffix(resp, "\r\n\r\nhello from the pod\n") {
		t.Fatalf("got %q, want 200 and the file", resp)
	}
	// Several connections over the one forwarding connection, as a ZMQ
	// client opens one per socket.
	for i := range 5 {
		if resp, err := httpGet(fw, 8000, "/hello.txt"); err != nil || !strings.HasPrefix(resp, "HTTP/1.0 200") {
			t.Fatalf("connection %d: got %q, %v", i, resp, err)
		}
	}
	// A port nobody listens on is reported on the stream's error channel.
	if _, err := httpGet(fw, 8001, "/"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("GET on a closed port: got %v, want connection refused", err)
	}
}

// httpGet sends one HTTP/1.0 GET over a new forwarded connection and
// returns the whole response.
func httpGet(fw *forwarder, port int, path string) (string, error) {
	s, err := fw.Dial(port)
	if err != nil {
		return "", err
	}
	defer s.Release()
	if _, err := fmt.Fprintf(s, "GET %s HTTP/1.0\r\nHost: kernel\r\n\r\n", path); err != nil {
		return "", err
	}
	// Half-close: containerd ends a forwarded connection only when both
	// directions are done, and otherwise waits a second for this one.
	if err := s.Close(); err != nil {
		return "", err
	}
	b, err := io.ReadAll(s)
	if len(b) == 0 {
		if e := s.Err(); e != "" {
			return "", fmt.Errorf("port-forward: %s", e)
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
	}
	return string(b), err
}

// echoSession is one long-lived exec of cat: the shape of the file agent's
// stdio session, where each request is a write and each answer a read.
type echoSession struct {
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

func (c *cluster) echo(ctx context.Context, pod *corev1.Pod) *echoSession {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &echoSession{in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	go func() {
		err := execStream(ctx, c.triad, pod, false, inR, outW, io.Discard, "cat")
		outW.CloseWithError(err)
		s.done <- err
	}()
	return s
}

func (s *echoSession) roundTrip(line string) error {
	if _, err := io.WriteString(s.in, line+"\n"); err != nil {
		return err
	}
	got, err := s.out.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("got %q, want %q", got, line)
	}
	return nil
}

func (s *echoSession) close() error {
	s.in.Close()
	return <-s.done
}

// TestExecSessionCarriesManyMessages keeps one exec stream open and sends
// many request/answer pairs through it, as the file agent will.
func TestExecSessionCarriesManyMessages(t *testing.T) {
	c := needCluster(t)
	pod := c.runPod(t, c.kernelPod("sleep", "infinity"))
	s := c.echo(t.Context(), pod)
	for i := range 50 {
		if err := s.roundTrip(fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*100))); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if err := s.close(); err != nil {
		t.Fatalf("exec session: %v", err)
	}
}
