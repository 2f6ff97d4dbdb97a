package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/sandbox"
)

// Backend runs kernels as pods. It implements sandbox.Backend.
type Backend struct {
	cfg  Config
	rest *rest.Config
	cs   *kubernetes.Clientset
	log  *slog.Logger

	factory informers.SharedInformerFactory
	pods    corelisters.PodLister

	wmu     sync.Mutex
	watches map[string]map[*podWatch]struct{} // by pod name

	mu      sync.Mutex
	kernels map[*Kernel]struct{}
	// starting counts this replica's kernels being started, by run: their
	// pods (adopted, claimed or created) are not idle yet.
	starting map[string]int
	warm     []*podConn // this replica's connected warm pods, oldest first
	filling  int        // warm pods being made
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup
}

var (
	_ sandbox.Backend  = (*Backend)(nil)
	_ sandbox.Pool     = (*Backend)(nil)
	_ sandbox.Imager   = (*Backend)(nil)
	_ sandbox.Runtimer = (*Backend)(nil)
)

// New connects to the API server, makes sure the namespace's deny-all
// NetworkPolicy exists, registers this replica's instance Lease, starts
// watching the deployment's pods and starts the warm pool and the sweeper.
// An API server that does not answer, or refuses Triad's identity, is an
// error wrapping sandbox.ErrUnavailable.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	routeKlog(cfg.Logger)
	cs, err := kubernetes.NewForConfig(cfg.Rest)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w: %w", sandbox.ErrUnavailable, err)
	}
	b := &Backend{
		cfg:     cfg,
		rest:    cfg.Rest,
		cs:      cs,
		log:     cfg.Logger.With("instance", cfg.Instance),
		watches: map[string]map[*podWatch]struct{}{},
		kernels: map[*Kernel]struct{}{}, starting: map[string]int{},
		stop: make(chan struct{}),
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Pods(cfg.Namespace).List(pctx, metav1.ListOptions{Limit: 1}); err != nil {
		return nil, fmt.Errorf("list pods in namespace %s (check --kubeconfig and Triad's Role): %w: %w", cfg.Namespace, sandbox.ErrUnavailable, err)
	}
	if err := b.ensureNetworkPolicy(pctx); err != nil {
		return nil, err
	}
	if err := b.admitted(pctx); err != nil {
		return nil, err
	}
	if err := b.renewInstance(pctx); err != nil {
		return nil, fmt.Errorf("register instance lease: %w: %w", sandbox.ErrUnavailable, err)
	}
	b.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelOwner + "=" + cfg.Owner }))
	inf := b.factory.Core().V1().Pods()
	b.pods = inf.Lister()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.onPod(obj, false) },
		UpdateFunc: func(_, obj any) { b.onPod(obj, false) },
		DeleteFunc: func(obj any) { b.onPod(obj, true) },
	}); err != nil {
		return nil, err
	}
	b.factory.Start(b.stop)
	for typ, ok := range b.factory.WaitForCacheSync(pctx.Done()) {
		if !ok {
			close(b.stop)
			b.factory.Shutdown()
			return nil, fmt.Errorf("watch pods in %s (%v): %w", cfg.Namespace, typ, sandbox.ErrUnavailable)
		}
	}
	b.wg.Add(3)
	go b.heartbeat()
	go b.fill()
	go b.sweep()
	b.log.InfoContext(ctx, "kube sandbox ready", "namespace", cfg.Namespace, "image", cfg.Image, "owner", cfg.Owner, "warm", cfg.Warm, "runtime_class", cfg.RuntimeClass, "seccomp", cfg.SeccompProfile)
	return b, nil
}

// admitted asks the API server to admit a kernel pod without making it
// (a server-side dry run), so that a pod the cluster would refuse every
// time (a RuntimeClass that does not exist, as when gVisor is not
// installed; a pod the namespace's Pod Security level refuses) fails
// triad serve at startup with what to do, not every run's first cell.
// What only a node finds out (a runtime handler or seccomp profile it
// lacks, a CSI driver not running on it) shows when a kernel starts.
func (b *Backend) admitted(ctx context.Context) error {
	pod := b.podSpec(b.cfg.Defaults, b.cfg.Image, b.labels(b.cfg.Defaults, ""), nil)
	_, err := b.cs.CoreV1().Pods(b.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return nil
	case b.cfg.RuntimeClass != "" && strings.Contains(err.Error(), "RuntimeClass"):
		return fmt.Errorf("the cluster refuses kernel pods under RuntimeClass %q (install gVisor and its RuntimeClass, deploy/kubernetes/README.md, or run kernels under the cluster's default runtime with --kube-runtime-class=''): %w: %w", b.cfg.RuntimeClass, sandbox.ErrUnavailable, err)
	default:
		return fmt.Errorf("the cluster refuses a kernel pod (a dry run in namespace %s): %w: %w", b.cfg.Namespace, sandbox.ErrUnavailable, err)
	}
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "kube" }

// Image implements sandbox.Imager: the sandbox image as the nodes pull it.
func (b *Backend) Image() string { return b.cfg.Image }

// Runtime implements sandbox.Runtimer: the kernel pods' RuntimeClass
// ("gvisor"), or "" for the cluster's default runtime, which Triad cannot
// see.
func (b *Backend) Runtime() string { return b.cfg.RuntimeClass }

// Instance returns this replica's name (Config.Instance).
func (b *Backend) Instance() string { return b.cfg.Instance }

// executor opens exec sessions: WebSocket first, SPDY when the server
// refuses the upgrade.
func (b *Backend) executor(u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(b.rest, "GET", u.String())
	if err != nil {
		return nil, err
	}
	sp, err := remotecommand.NewSPDYExecutor(b.rest, "POST", u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, sp, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// Start implements sandbox.Backend. For a run (spec.Owner) whose pod is
// alive, in this replica or any other, it adopts that pod: the kernel's
// interpreter state is intact. Otherwise it claims a warm pod or creates
// one. ctx bounds the wait only.
func (b *Backend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	k, err := b.start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func (b *Backend) start(ctx context.Context, spec sandbox.Spec) (*Kernel, error) {
	if b.isClosed() {
		return nil, sandbox.ErrClosed
	}
	if l := spec.Limits; l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 || l.OutputBytes < 0 {
		return nil, fault.Badf("give positive limits, or 0 for the server's default", "negative sandbox limit in %+v", l)
	}
	run := spec.Owner
	if run == "" {
		run = "anonymous-" + newID() // never adopted by anyone
	}
	k := newKernel(b, run, b.limits(spec.Limits), spec.Image)
	t0 := time.Now()
	b.mu.Lock()
	b.starting[run]++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if b.starting[run]--; b.starting[run] <= 0 {
			delete(b.starting, run)
		}
		b.mu.Unlock()
	}()
	if err := k.place(ctx, spec.Owner != ""); err != nil {
		return nil, fmt.Errorf("start kernel for %q: %w", spec.Owner, err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		k.Close()
		return nil, sandbox.ErrClosed
	}
	b.kernels[k] = struct{}{}
	b.mu.Unlock()
	b.log.InfoContext(ctx, "sandbox kernel started", "kernel", k.ID(), "owner", spec.Owner, "duration", time.Since(t0).Round(time.Millisecond), "how", k.how)
	return k, nil
}

func (b *Backend) limits(l sandbox.Limits) sandbox.Limits { return l.Or(b.cfg.Defaults) }

// runPods lists run's pods from the API server (not the informer's
// cache: adoption must see a pod another replica claimed a moment ago),
// latest claim first.
func (b *Backend) runPods(ctx context.Context, run string) ([]corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner, LabelState: stateRun, LabelRun: RunKey(run)})
	list, err := b.cs.CoreV1().Pods(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list the run's pods: %w", err)
	}
	pods := list.Items
	sort.SliceStable(pods, func(i, j int) bool {
		return parseStamp(pods[i].Annotations[AnnotationClaimed]).After(parseStamp(pods[j].Annotations[AnnotationClaimed]))
	})
	return pods, nil
}

func (b *Backend) forget(k *Kernel) {
	b.mu.Lock()
	delete(b.kernels, k)
	b.mu.Unlock()
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// busyRuns are the runs of this replica's kernels in use (a cell, a
// working-directory operation, a restart) or being started: their pods,
// whichever they are at the moment, are not idle.
func (b *Backend) busyRuns() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]bool{}
	for k := range b.kernels {
		if k.busy() {
			out[k.run] = true
		}
	}
	for run := range b.starting {
		out[run] = true
	}
	return out
}

// Close implements sandbox.Backend. It stops this replica's warm pool and
// releases its kernels. Run pods stay for the other replicas to adopt,
// unless this is the last live replica of the deployment: then it deletes
// every pod the deployment has, so nothing leaks once all replicas have
// stopped. It is safe to call twice.
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
	warm := b.warm
	b.warm = nil
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// This replica's Lease goes first: of two replicas closing at once,
	// the one that looks last sees the other gone, so one of them always
	// cleans up.
	zero := int64(0)
	if err := b.cs.CoordinationV1().Leases(b.cfg.Namespace).Delete(ctx, b.instanceLease(), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		b.log.Warn("delete instance lease", "err", err)
	}
	last, err := b.lastOut(ctx)
	if err != nil {
		b.log.Warn("list live replicas; leaving run pods for them", "err", err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, k := range kernels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if last {
				err = k.Close()
			} else {
				err = k.Detach()
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	for _, pc := range warm {
		pc.close()
		wg.Add(1)
		go func() { defer wg.Done(); b.deletePod(pc.name, "") }()
	}
	wg.Wait()
	if last {
		sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner}).String()
		list, err := b.cs.CoreV1().Pods(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil {
			for _, p := range list.Items {
				b.deletePod(p.Name, "")
			}
			if len(list.Items) > 0 {
				b.log.Info("last replica out: deleted the deployment's kernel pods", "pods", len(list.Items))
			}
			b.deleteDeadInstances(ctx, 0)
		} else {
			errs = append(errs, err)
		}
	}
	b.factory.Shutdown()
	return errors.Join(errs...)
}
