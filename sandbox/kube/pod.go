package kube

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/internal/relay"
	"github.com/triadhq/triad/sandbox/kube/csi"
)

// Labels and annotations of the objects this package makes. Values of
// LabelRun are hashes: run ids may be 64 characters long or end in a dot,
// which label values may not; the id itself is in AnnotationRun.
const (
	// LabelOwner names the Triad deployment (Config.Owner): the pods and
	// Leases a backend may adopt, sweep and, as the last replica out,
	// delete.
	LabelOwner = "triad.dev/owner"
	// LabelInstance names the replica that created a pod (Config.Instance).
	LabelInstance = "triad.dev/instance"
	// LabelState is "warm" for a pooled pod and "run" for a run's kernel.
	LabelState = "triad.dev/state"
	// LabelRun holds RunKey of the run whose kernel the pod is.
	LabelRun = "triad.dev/run"
	// LabelLimits holds a hash of the pod's limits: a warm pod serves a
	// run only if its limits are the ones the run asks for.
	LabelLimits = "triad.dev/limits"
	// AnnotationRun holds the run id (sandbox.Spec.Owner).
	AnnotationRun = "triad.dev/run-id"
	// AnnotationClaimed is when the pod became the run's kernel (RFC
	// 3339): with two pods for one run (a replica died mid-restart), the
	// later claim is the kernel.
	AnnotationClaimed = "triad.dev/claimed-at"
	// AnnotationUsed is when a replica last used the pod (RFC 3339); any
	// replica deletes run pods unused for Config.IdleTTL.
	AnnotationUsed = "triad.dev/last-used"

	stateWarm = "warm"
	stateRun  = "run"
)

// Container names in a kernel pod.
const (
	kernelContainer = "kernel"
	agentContainer  = "agent"
)

// Paths inside the pod.
const (
	podWork = image.Work // /work in the image is a symlink to it
	podRun  = "/run/kernel"
)

// kernelPorts are the kernel's shell, iopub, stdin, control and heartbeat
// ports on the pod's loopback. Nothing listens on the pod's address: Triad
// reaches them by port-forward through the API server, which the kubelet
// serves from inside the pod's network namespace.
var kernelPorts = [5]int{50551, 50552, 50553, 50554, 50555}

// egressPort is the egress forwarder's host endpoint on the pod's
// loopback, which Triad reaches by port-forward like the kernel's ports;
// the forwarder also listens on sandbox.EgressAddr for the kernel's
// processes (sandbox/internal/relay).
const egressPort = 50556

// RunKey is the value of LabelRun for a run id: 32 hex digits of its
// SHA-256.
func RunKey(run string) string {
	h := sha256.Sum256([]byte(run))
	return hex.EncodeToString(h[:16])
}

// limitsKey is the value of LabelLimits for l.
func limitsKey(l sandbox.Limits) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d/%g/%d/%d", l.MemoryBytes, l.CPUs, l.Pids, l.DiskBytes))
	return hex.EncodeToString(h[:8])
}

// connWriter writes the kernel's connection file: tcp on 127.0.0.1, the
// fixed ports, and a key made in the pod, so that the key never appears in
// the pod's spec (reading pods does not give access to kernels). It is
// quoted for sh without single quotes.
var connWriter = fmt.Sprintf(`import json, os, secrets
info = {"transport": "tcp", "ip": "127.0.0.1", "shell_port": %d, "iopub_port": %d, "stdin_port": %d,
        "control_port": %d, "hb_port": %d, "key": secrets.token_hex(32),
        "signature_scheme": "hmac-sha256", "kernel_name": "python3"}
fd = os.open("%[6]s/conn.json.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, json.dumps(info).encode())
os.close(fd)
os.rename("%[6]s/conn.json.tmp", "%[6]s/conn.json")
`, kernelPorts[0], kernelPorts[1], kernelPorts[2], kernelPorts[3], kernelPorts[4], podRun)

// kernelScript is the kernel container's command (dash). ulimit -p
// (RLIMIT_NPROC) bounds the pod's processes and threads: the pod runs under
// a uid of its own (podUID), so the per-uid count is the pod's (Kubernetes
// has no per-pod pids limit in the pod spec). ulimit -c 0: a segfaulting
// cell must not drop a core file into /work. Then, as on Docker, matplotlib's font cache
// is seeded into the home on /tmp, the connection file is written, and
// ipykernel is exec'd through image.KernelLauncher, so the kernel's exit is
// the container's exit and its termination reason (OOMKilled, the exit
// code) is the pod status's. The egress forwarder starts in the
// background before the kernel, under the same process limit.
func kernelScript(pids int64) string {
	return fmt.Sprintf(`ulimit -p %d || exit 90
ulimit -c 0
mkdir -p "$MPLCONFIGDIR" && cp -a %s/. "$MPLCONFIGDIR"/ 2>/dev/null
python3 -c '%s' || exit 91
%s
exec python3 -c '%s' -f %s/conn.json --InteractiveShell.colors=NoColor --HistoryManager.enabled=False --IPKernelApp.quiet=True`,
		pids, image.MPLSeed, connWriter, relay.Command(fmt.Sprintf("tcp:127.0.0.1:%d", egressPort)), image.KernelLauncher, podRun)
}

// podUID picks the uid a new pod runs as: a random one from a range of a
// billion, so that no two live pods share one and ulimit -u counts only the
// pod's own processes. The image does not depend on a passwd entry.
func podUID() int64 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1_000_000 + int64(binary.BigEndian.Uint32(b[:])%1_000_000_000)
}

// agentLimits bound the agent container: a Python process streaming files
// in 256 KiB chunks.
var agentLimits = corev1.ResourceList{
	corev1.ResourceCPU:              resource.MustParse("500m"),
	corev1.ResourceMemory:           resource.MustParse("128Mi"),
	corev1.ResourceEphemeralStorage: resource.MustParse("64Mi"),
}

// podSpec is a kernel pod: see docs/DECISIONS.md, "Kubernetes", for each
// choice. It passes the restricted Pod Security Standard.
func (b *Backend) podSpec(l sandbox.Limits, img string, labels, annotations map[string]string) *corev1.Pod {
	no, yes := false, true
	zero := int64(0)
	uid := podUID()
	gid := int64(image.GID)
	threads := strconv.Itoa(max(1, int(l.CPUs+0.5)))
	sec := &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		RunAsNonRoot:             &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	// The environment is the Docker backend's (image.KernelEnv): HOME is the
	// working directory, and the caches tools keep for themselves (matplotlib's
	// font list, IPython's profile) live in Scratch on the pod's /tmp, never in
	// the run's files.
	env := []corev1.EnvVar{
		{Name: "LANG", Value: "C.UTF-8"},
		{Name: "PYTHONDONTWRITEBYTECODE", Value: "1"},
		{Name: "OMP_NUM_THREADS", Value: threads},
		{Name: "OPENBLAS_NUM_THREADS", Value: threads},
	}
	for _, kv := range image.KernelEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	// The working directory's emptyDir is evicted past its sizeLimit; the
	// container's own ephemeral storage is only its logs (the root is
	// read-only).
	kernelLimits := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(int64(l.CPUs*1000), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(l.MemoryBytes, resource.BinarySI),
		corev1.ResourceEphemeralStorage: resource.MustParse("64Mi"),
	}
	kernelRequests := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(int64(b.cfg.CPURequest*1000), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(min(b.cfg.MemoryRequest, l.MemoryBytes), resource.BinarySI),
		corev1.ResourceEphemeralStorage: resource.MustParse("16Mi"),
	}
	work := resource.NewQuantity(l.DiskBytes, resource.BinarySI)
	tmp := resource.NewQuantity(b.cfg.TmpSize, resource.BinarySI)
	runDir := resource.MustParse("1Mi")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "triad-kernel-",
			Namespace:    b.cfg.Namespace,
			Labels:       labels,
			Annotations:  annotations,
		},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			// The pause process is PID 1 and reaps the orphans a cell
			// leaves, as tini does on Docker; and the agent can stop the
			// kernel's processes for a restart.
			ShareProcessNamespace: &yes,
			Hostname:              "sandbox",
			DNSPolicy:             corev1.DNSDefault,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				FSGroup:        &gid,
				SeccompProfile: b.seccomp(),
			},
			Containers: []corev1.Container{{
				Name:            kernelContainer,
				Image:           img,
				ImagePullPolicy: b.cfg.PullPolicy,
				Command:         []string{"/bin/sh", "-c", kernelScript(l.Pids)},
				WorkingDir:      podWork,
				Env:             env,
				SecurityContext: sec,
				Resources:       corev1.ResourceRequirements{Limits: kernelLimits, Requests: kernelRequests},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "work", MountPath: podWork},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "run", MountPath: podRun},
				},
			}, {
				Name:            agentContainer,
				Image:           img,
				ImagePullPolicy: b.cfg.PullPolicy,
				Command:         []string{"sleep", "infinity"},
				WorkingDir:      podWork,
				Env:             []corev1.EnvVar{{Name: "LANG", Value: "C.UTF-8"}, {Name: "PYTHONDONTWRITEBYTECODE", Value: "1"}},
				SecurityContext: sec,
				Resources: corev1.ResourceRequirements{Limits: agentLimits, Requests: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse("10m"),
					corev1.ResourceMemory: resource.MustParse("32Mi"),
				}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "work", MountPath: podWork},
					{Name: "run", MountPath: podRun, ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "work", VolumeSource: b.workVolume(l, work, uid, gid)},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: tmp}}},
				{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &runDir}}},
			},
		},
	}
	if b.cfg.RuntimeClass != "" {
		rc := b.cfg.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	return pod
}

// workVolume is the working directory's volume: with a WorkDriver, an
// inline volume of that CSI driver (sandbox/kube/csi), sized and owned by
// the kernel, whose writes past the size fail with ENOSPC; without one, an
// emptyDir whose size limit the kubelet enforces by evicting the pod once
// it notices.
func (b *Backend) workVolume(l sandbox.Limits, size *resource.Quantity, uid, gid int64) corev1.VolumeSource {
	if d := b.cfg.WorkDriver; d != "" {
		return corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: d, VolumeAttributes: map[string]string{
			csi.AttrSize: strconv.FormatInt(l.DiskBytes, 10),
			csi.AttrUID:  strconv.FormatInt(uid, 10),
			csi.AttrGID:  strconv.FormatInt(gid, 10),
		}}}
	}
	return corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size}}
}

// seccomp is the pods' seccomp profile: Triad's, installed on the node as
// a Localhost profile, or the runtime's default.
func (b *Backend) seccomp() *corev1.SeccompProfile {
	if p := b.cfg.SeccompProfile; p != "" {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &p}
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
}

// containerState returns the pod's status of the named container.
func containerState(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// running reports whether the named container runs.
func running(p *corev1.Pod, name string) bool {
	cs := containerState(p, name)
	return cs != nil && cs.State.Running != nil
}

// kernelGone reports whether the pod's kernel has ended for good: its
// container terminated, the pod failed (evicted) or is being deleted.
func kernelGone(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return true
	}
	cs := containerState(p, kernelContainer)
	return cs != nil && cs.State.Terminated != nil
}

// deathReason says why the pod's kernel ended, from the pod's status: the
// eviction's message, the kernel container's termination reason
// (OOMKilled) or its exit code.
func deathReason(p *corev1.Pod) string {
	if p == nil {
		return "the kernel's pod was deleted"
	}
	if p.Status.Reason == "Evicted" {
		return "Evicted: " + strings.TrimSpace(p.Status.Message)
	}
	if cs := containerState(p, kernelContainer); cs != nil && cs.State.Terminated != nil {
		t := cs.State.Terminated
		switch {
		case t.Reason == "OOMKilled":
			return "OOMKilled"
		case t.ExitCode > 128:
			return fmt.Sprintf("killed by signal %d (exit code %d)", t.ExitCode-128, t.ExitCode)
		case t.ExitCode == 90:
			return "the kernel's process limit could not be set (exit code 90)"
		default:
			return fmt.Sprintf("exited with code %d", t.ExitCode)
		}
	}
	if p.DeletionTimestamp != nil {
		return "the kernel's pod was deleted"
	}
	if p.Status.Phase == corev1.PodFailed {
		return "the kernel's pod failed: " + strings.TrimSpace(p.Status.Reason+" "+p.Status.Message)
	}
	return "the kernel stopped answering"
}

// waitingProblem returns why a pod that is not running yet never will
// (its image cannot be pulled, a container cannot be created), or "".
func waitingProblem(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return fmt.Sprintf("pod %s ended before it ran: %s", p.Name, deathReason(p))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "", "ContainerCreating", "PodInitializing":
			default:
				return fmt.Sprintf("pod %s: container %s is waiting: %s: %s", p.Name, cs.Name, w.Reason, w.Message)
			}
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("pod %s: container %s ended at start: %s", p.Name, cs.Name, deathReason(p))
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return fmt.Sprintf("pod %s cannot be scheduled: %s", p.Name, c.Message)
		}
	}
	return ""
}

// stamp formats a time for annotations.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseStamp reads an annotation stamp; the zero time when absent or bad.
func parseStamp(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}
