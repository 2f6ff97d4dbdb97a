package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"

	"github.com/triadhq/triad/internal/testenv"
)

// cluster is the test cluster scripts/kube.sh runs, seen through the
// variables `scripts/kube.sh env` prints.
type cluster struct {
	// triad is Triad's own least-privilege identity; admin is cluster-admin.
	triad, admin             *rest.Config
	triadClient              *clientset.Clientset
	kubectl, adminKubeconfig string
	namespace, image         string
}

// needCluster returns the running test cluster, or skips (locally) or fails
// (under CI) when there is none.
func needCluster(t testing.TB) *cluster {
	t.Helper()
	const hint = ` (eval "$(scripts/kube.sh up)" sets it)`
	vars := map[string]string{}
	for _, v := range []string{"TRIAD_KUBECONFIG", "TRIAD_KUBE_ADMIN_KUBECONFIG", "TRIAD_KUBECTL", "TRIAD_KUBE_NAMESPACE", "TRIAD_KUBE_IMAGE"} {
		vars[v] = os.Getenv(v)
		if vars[v] == "" {
			testenv.Missing(t, v+hint)
		}
	}
	c := &cluster{
		kubectl:         vars["TRIAD_KUBECTL"],
		adminKubeconfig: vars["TRIAD_KUBE_ADMIN_KUBECONFIG"],
		namespace:       vars["TRIAD_KUBE_NAMESPACE"],
		image:           vars["TRIAD_KUBE_IMAGE"],
	}
	var err error
	if c.triad, err = clientcmd.BuildConfigFromFlags("", vars["TRIAD_KUBECONFIG"]); err != nil {
		t.Fatalf("TRIAD_KUBECONFIG: %v", err)
	}
	if c.admin, err = clientcmd.BuildConfigFromFlags("", c.adminKubeconfig); err != nil {
		t.Fatalf("TRIAD_KUBE_ADMIN_KUBECONFIG: %v", err)
	}
	if c.triadClient, err = clientset.NewForConfig(c.triad); err != nil {
		t.Fatal(err)
	}
	if _, err := c.triadClient.Discovery().ServerVersion(); err != nil {
		testenv.Missing(t, "a running cluster (scripts/kube.sh up): "+err.Error())
	}
	return c
}

// kernelPod is a pod shaped like a run's kernel: the sandbox image, non-root,
// read-only root, no capabilities, RuntimeDefault seccomp, no token, no
// service links, memory-backed /tmp and a size-limited workdir. It passes the
// restricted Pod Security Standard.
func (c *cluster) kernelPod(command ...string) *corev1.Pod {
	no, yes := false, true
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "deploy-test-",
			Namespace:    c.namespace,
			Labels:       map[string]string{"app.kubernetes.io/part-of": "triad", "triad.dev/test": "deploy-kubernetes"},
		},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			// No cluster DNS, and no network to use one.
			DNSPolicy: corev1.DNSDefault,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "kernel",
				Image:           c.image,
				ImagePullPolicy: corev1.PullNever,
				Command:         command,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits: corev1.ResourceList{
						corev1.ResourceCPU:              resource.MustParse("500m"),
						corev1.ResourceMemory:           resource.MustParse("256Mi"),
						corev1.ResourceEphemeralStorage: resource.MustParse("256Mi"),
					},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}, {Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr(resource.MustParse("128Mi"))}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("64Mi"))}}},
			},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// runPod creates pod as Triad, waits until it is Running and Ready, and
// deletes it when the test ends.
func (c *cluster) runPod(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	created, err := c.triadClient.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	t.Cleanup(func() { c.deletePod(created.Name) })
	ready, err := c.waitReady(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	return ready
}

func (c *cluster) deletePod(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = c.triadClient.CoreV1().Pods(c.namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
}

// waitReady watches pod until it is Ready, and fails fast when it ends or
// its container cannot start.
func (c *cluster) waitReady(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	w, err := c.triadClient.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("watch pod %s: %w", pod.Name, err)
	}
	defer w.Stop()
	last := pod
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pod %s not Ready: %w; last status %+v", pod.Name, ctx.Err(), last.Status)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("watch of pod %s ended", pod.Name)
			}
			if ev.Type == watch.Error {
				return nil, fmt.Errorf("watch pod %s: %v", pod.Name, ev.Object)
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			last = p
			switch p.Status.Phase {
			case corev1.PodSucceeded, corev1.PodFailed:
				return nil, fmt.Errorf("pod %s ended: %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
			}
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
					return nil, fmt.Errorf("pod %s: container %s waiting: %s: %s", p.Name, cs.Name, w.Reason, w.Message)
				}
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return p, nil
				}
			}
		}
	}
}

// execIn runs command in the pod's container as cfg's identity, over SPDY
// (POST) or WebSocket (GET), and returns its stdout and stderr.
func execIn(ctx context.Context, cfg *rest.Config, pod *corev1.Pod, websocket bool, stdin io.Reader, command ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := execStream(ctx, cfg, pod, websocket, stdin, &stdout, &stderr, command...)
	return stdout.String(), stderr.String(), err
}

// execStream runs command with the given streams; it returns when the
// command exits.
func execStream(ctx context.Context, cfg *rest.Config, pod *corev1.Pod, websocket bool, stdin io.Reader, stdout, stderr io.Writer, command ...string) error {
	cs, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: pod.Spec.Containers[0].Name, Command: command, Stdin: stdin != nil, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	var ex remotecommand.Executor
	if websocket {
		ex, err = remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	} else {
		ex, err = remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	}
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// forwarder holds one port-forward connection to a pod, through the API
// server and the kubelet, and opens a TCP connection inside the pod's
// network namespace per Dial: the transport the kube backend's kernels use
// (docs/DECISIONS.md, "Kubernetes"). Unlike portforward.PortForwarder it
// opens no local listener, so no other process on Triad's host can reach
// the kernel.
type forwarder struct {
	conn httpstream.Connection
	next atomic.Int64
}

func forward(cfg *rest.Config, pod *corev1.Pod) (*forwarder, error) {
	cs, err := clientset.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	url := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", url)
	conn, proto, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s: %w", pod.Name, err)
	}
	if proto != portforward.PortForwardProtocolV1Name {
		conn.Close()
		return nil, fmt.Errorf("port-forward to %s: server chose protocol %q", pod.Name, proto)
	}
	return &forwarder{conn: conn}, nil
}

// stream is one forwarded TCP connection: its data stream, and the error
// stream on which the kubelet reports a failed dial inside the pod.
type stream struct {
	httpstream.Stream
	f       *forwarder
	errs    httpstream.Stream
	errText chan string
}

// Dial opens a TCP connection to port on the pod's loopback.
func (f *forwarder) Dial(port int) (*stream, error) {
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, strconv.FormatInt(f.next.Add(1), 10))
	errs, err := f.conn.CreateStream(h)
	if err != nil {
		return nil, err
	}
	errs.Close() // nothing to send on it
	s := &stream{f: f, errs: errs, errText: make(chan string, 1)}
	go func() {
		b, _ := io.ReadAll(errs)
		s.errText <- string(b)
	}()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	if s.Stream, err = f.conn.CreateStream(h); err != nil {
		f.conn.RemoveStreams(errs)
		return nil, err
	}
	return s, nil
}

// Err returns what the kubelet reported for this connection, once the data
// stream is done ("" for nothing).
func (s *stream) Err() string {
	select {
	case e := <-s.errText:
		return e
	case <-time.After(5 * time.Second):
		return ""
	}
}

// Release frees both streams of the connection.
func (s *stream) Release() {
	_ = s.Stream.Reset()
	s.f.conn.RemoveStreams(s.errs, s.Stream)
}

func (f *forwarder) Close() error { return f.conn.Close() }
