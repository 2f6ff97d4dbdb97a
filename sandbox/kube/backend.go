package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
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

// NetworkPolicyName is the deny-all NetworkPolicy New makes sure exists in
// the namespace (deploy/kubernetes ships the same object).
const NetworkPolicyName = "deny-all"

// labelKind marks this package's Leases: instance Leases say which
// replicas are alive.
const (
	labelKind    = "triad.dev/kind"
	kindInstance = "instance"
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

var _ sandbox.Backend = (*Backend)(nil)

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
	b.log.InfoContext(ctx, "kube sandbox ready", "namespace", cfg.Namespace, "image", cfg.Image, "owner", cfg.Owner, "warm", cfg.Warm, "runtime_class", cfg.RuntimeClass)
	return b, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "kube" }

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

// ensureNetworkPolicy creates the namespace's deny-all policy when it is
// missing. Triad may create and read NetworkPolicies but not change or
// delete them, so it cannot loosen one it finds; it only says so.
func (b *Backend) ensureNetworkPolicy(ctx context.Context) error {
	api := b.cs.NetworkingV1().NetworkPolicies(b.cfg.Namespace)
	np, err := api.Get(ctx, NetworkPolicyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		np, err = api.Create(ctx, denyAll(b.cfg.Namespace), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			np, err = api.Get(ctx, NetworkPolicyName, metav1.GetOptions{})
		}
		if err == nil {
			b.log.InfoContext(ctx, "created the deny-all NetworkPolicy", "namespace", b.cfg.Namespace)
		}
	}
	if err != nil {
		return fmt.Errorf("deny-all NetworkPolicy in %s: %w: %w", b.cfg.Namespace, sandbox.ErrUnavailable, err)
	}
	if !isDenyAll(np) {
		b.log.ErrorContext(ctx, "the NetworkPolicy "+NetworkPolicyName+" does not deny all traffic; kernel pods may reach the network", "namespace", b.cfg.Namespace)
	}
	return nil
}

func denyAll(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "triad"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// isDenyAll reports whether np selects every pod and allows nothing.
func isDenyAll(np *networkingv1.NetworkPolicy) bool {
	s := np.Spec
	if len(s.PodSelector.MatchLabels) > 0 || len(s.PodSelector.MatchExpressions) > 0 || len(s.Ingress) > 0 || len(s.Egress) > 0 {
		return false
	}
	var in, out bool
	for _, t := range s.PolicyTypes {
		in = in || t == networkingv1.PolicyTypeIngress
		out = out || t == networkingv1.PolicyTypeEgress
	}
	return in && out
}

// --- watching pods -----------------------------------------------------------

// podWatch follows one pod in the informer: gone closes when its kernel
// has ended for good (kernelGone) or the pod was deleted.
type podWatch struct {
	name string
	gone chan struct{}
	once sync.Once
	last atomic.Pointer[corev1.Pod] // nil once deleted
}

func (w *podWatch) end() { w.once.Do(func() { close(w.gone) }) }

// watchPod starts following pod name.
func (b *Backend) watchPod(name string) *podWatch {
	w := &podWatch{name: name, gone: make(chan struct{})}
	b.wmu.Lock()
	if b.watches[name] == nil {
		b.watches[name] = map[*podWatch]struct{}{}
	}
	b.watches[name][w] = struct{}{}
	b.wmu.Unlock()
	if p, err := b.pods.Pods(b.cfg.Namespace).Get(name); err == nil {
		w.last.Store(p)
		if kernelGone(p) {
			w.end()
		}
	}
	return w
}

func (b *Backend) unwatch(w *podWatch) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	delete(b.watches[w.name], w)
	if len(b.watches[w.name]) == 0 {
		delete(b.watches, w.name)
	}
}

func (b *Backend) onPod(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	for w := range b.watches[p.Name] {
		if deleted {
			w.last.Store(nil)
			w.end()
			continue
		}
		w.last.Store(p)
		if kernelGone(p) {
			w.end()
		}
	}
}

// waitRunning waits until both containers of pod name run. A pod that
// will never run (its image cannot be pulled, it failed) fails at once.
func (b *Backend) waitRunning(ctx context.Context, name string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var last *corev1.Pod
	for {
		p, err := b.pods.Pods(b.cfg.Namespace).Get(name)
		if err == nil {
			last = p
			if running(p, kernelContainer) && running(p, agentContainer) {
				return nil
			}
			if msg := waitingProblem(p); msg != "" {
				return errors.New(msg)
			}
		}
		select {
		case <-ctx.Done():
			status := "not seen yet"
			if last != nil {
				status = fmt.Sprintf("phase %s, %s", last.Status.Phase, conditions(last))
			}
			return fmt.Errorf("pod %s did not start: %w (%s)", name, context.Cause(ctx), status)
		case <-t.C:
		}
	}
}

// conditions summarises a pod's conditions that are not true, for errors.
func conditions(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			out = append(out, fmt.Sprintf("%s=%s %s %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	if len(out) == 0 {
		return "no failing conditions"
	}
	return fmt.Sprint(out)
}

// --- creating, claiming and deleting pods ---------------------------------------

// labels are the labels of a new pod; run is "" for a warm pod.
func (b *Backend) labels(l sandbox.Limits, run string) map[string]string {
	m := map[string]string{
		"app.kubernetes.io/part-of":   "triad",
		"app.kubernetes.io/component": "kernel",
		LabelOwner:                    b.cfg.Owner,
		LabelInstance:                 b.cfg.Instance,
		LabelLimits:                   limitsKey(l),
		LabelState:                    stateWarm,
	}
	if run != "" {
		m[LabelState] = stateRun
		m[LabelRun] = RunKey(run)
	}
	return m
}

// createPod creates a pod for run ("" for a warm pod) and waits until it
// runs.
func (b *Backend) createPod(ctx context.Context, l sandbox.Limits, run string) (string, error) {
	now := stamp(time.Now())
	ann := map[string]string{}
	if run != "" {
		ann[AnnotationRun], ann[AnnotationClaimed], ann[AnnotationUsed] = run, now, now
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	p, err := b.cs.CoreV1().Pods(b.cfg.Namespace).Create(cctx, b.podSpec(l, "", b.labels(l, run), ann), metav1.CreateOptions{})
	cancel()
	if err != nil {
		return "", fmt.Errorf("create kernel pod: %w", err)
	}
	if err := b.waitRunning(ctx, p.Name); err != nil {
		b.deletePod(p.Name, "")
		return "", err
	}
	return p.Name, nil
}

// claim relabels pod name from warm to run's kernel. The patch carries the
// pod's resourceVersion, so of two replicas claiming one pod, one wins and
// the other gets a conflict.
func (b *Backend) claim(ctx context.Context, name, run string) (bool, error) {
	for try := 0; try < 3; try++ {
		p, err := b.cs.CoreV1().Pods(b.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if p.Labels[LabelState] != stateWarm || p.DeletionTimestamp != nil || !running(p, kernelContainer) || !running(p, agentContainer) {
			return false, nil
		}
		now := stamp(time.Now())
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": p.ResourceVersion,
			"labels":          map[string]string{LabelState: stateRun, LabelRun: RunKey(run)},
			"annotations":     map[string]string{AnnotationRun: run, AnnotationClaimed: now, AnnotationUsed: now},
		}})
		_, err = b.cs.CoreV1().Pods(b.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsConflict(err):
			continue // changed meanwhile: look again
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, err
		}
	}
	return false, nil
}

// deletePod deletes a pod at once. A non-empty rv makes it conditional:
// the pod is left alone if it changed since (claimed by another replica).
func (b *Backend) deletePod(name, rv string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	if rv != "" {
		opts.Preconditions = &metav1.Preconditions{ResourceVersion: &rv}
	}
	err := b.cs.CoreV1().Pods(b.cfg.Namespace).Delete(ctx, name, opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		b.log.Warn("delete kernel pod", "pod", name, "err", err)
		return err
	}
	return nil
}

// touch records that the run's pod was used now, for the idle sweep.
func (b *Backend) touch(name string) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationUsed: stamp(time.Now())}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.cs.CoreV1().Pods(b.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		b.log.Warn("mark kernel pod used", "pod", name, "err", err)
	}
}

// freshPod returns a connected pod that is run's kernel from now on: one
// of this replica's warm pods, another replica's, or a new one.
func (b *Backend) freshPod(ctx context.Context, l sandbox.Limits, run string) (*podConn, error) {
	// Warm pods were made, and their clients dialled, for the default
	// limits, output limit included.
	pooled := l == b.cfg.Defaults
	for pooled {
		b.mu.Lock()
		var pc *podConn
		if len(b.warm) > 0 {
			pc, b.warm = b.warm[0], b.warm[1:]
		}
		b.mu.Unlock()
		if pc == nil {
			break
		}
		ok, err := b.claim(ctx, pc.name, run)
		if ok && !pc.gone() {
			b.log.DebugContext(ctx, "claimed own warm pod", "pod", pc.name, "run", run)
			return pc, nil
		}
		pc.close()
		if ok {
			b.deletePod(pc.name, "")
		} else if err != nil {
			b.log.WarnContext(ctx, "claim warm pod", "pod", pc.name, "err", err)
		}
	}
	if pooled {
		sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner, LabelState: stateWarm, LabelLimits: limitsKey(l)})
		pods, _ := b.pods.Pods(b.cfg.Namespace).List(sel)
		sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
		for _, p := range pods {
			if p.Labels[LabelInstance] == b.cfg.Instance || !running(p, kernelContainer) || !running(p, agentContainer) {
				continue // ours are in b.warm or being made
			}
			ok, err := b.claim(ctx, p.Name, run)
			if err != nil || !ok {
				continue
			}
			pc, err := b.connect(ctx, p.Name, false, l)
			if err != nil {
				b.log.WarnContext(ctx, "connect to a claimed warm pod", "pod", p.Name, "err", err)
				b.deletePod(p.Name, "")
				continue
			}
			b.log.DebugContext(ctx, "claimed another replica's warm pod", "pod", p.Name, "run", run)
			return pc, nil
		}
	}
	name, err := b.createPod(ctx, l, run)
	if err != nil {
		return nil, err
	}
	pc, err := b.connect(ctx, name, false, l)
	if err != nil {
		b.deletePod(name, "")
		return nil, err
	}
	return pc, nil
}

// --- starting kernels ---------------------------------------------------------------

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
	k := newKernel(b, run, b.limits(spec.Limits))
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

// --- the warm pool ------------------------------------------------------------------

// fill keeps Config.Warm connected warm pods of this replica.
func (b *Backend) fill() {
	defer b.wg.Done()
	backoff := time.Second
	for {
		b.mu.Lock()
		need := !b.closed && len(b.warm)+b.filling < b.cfg.Warm
		if need {
			b.filling++
		}
		b.mu.Unlock()
		if !need {
			select {
			case <-b.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		go func() {
			select {
			case <-b.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		pc, err := b.warmPod(ctx)
		cancel()
		b.mu.Lock()
		b.filling--
		if err == nil && !b.closed {
			b.warm = append(b.warm, pc)
			pc = nil
		}
		b.mu.Unlock()
		if pc != nil { // closed meanwhile
			pc.close()
			b.deletePod(pc.name, "")
		}
		if err != nil {
			if b.isClosed() {
				return
			}
			b.log.Warn("warm pool: start pod", "err", err, "retry_in", backoff)
			select {
			case <-b.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = time.Second
	}
}

// warmPod creates one warm pod and connects to its kernel.
func (b *Backend) warmPod(ctx context.Context) (*podConn, error) {
	name, err := b.createPod(ctx, b.cfg.Defaults, "")
	if err != nil {
		return nil, err
	}
	pc, err := b.connect(ctx, name, false, b.cfg.Defaults)
	if err != nil {
		b.deletePod(name, "")
		return nil, err
	}
	return pc, nil
}

// Pooled returns how many connected warm pods this replica holds.
func (b *Backend) Pooled() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.warm)
}

// --- instance Leases and the sweeper ---------------------------------------------------

// instanceLease names this replica's Lease.
func (b *Backend) instanceLease() string {
	return "triad-instance-" + RunKey(b.cfg.Owner+"/"+b.cfg.Instance)
}

// renewInstance creates or renews this replica's instance Lease.
func (b *Backend) renewInstance(ctx context.Context) error {
	api := b.cs.CoordinationV1().Leases(b.cfg.Namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(b.cfg.InstanceTTL / time.Second)
	l, err := api.Get(ctx, b.instanceLease(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: b.instanceLease(), Namespace: b.cfg.Namespace, Labels: map[string]string{
				"app.kubernetes.io/part-of": "triad", LabelOwner: b.cfg.Owner, LabelInstance: b.cfg.Instance, labelKind: kindInstance,
			}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &b.cfg.Instance, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds, l.Spec.HolderIdentity = &now, &secs, &b.cfg.Instance
	_, err = api.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the instance Lease.
func (b *Backend) heartbeat() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.InstanceTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.InstanceTTL/3)
		if err := b.renewInstance(ctx); err != nil {
			b.log.Warn("renew instance lease", "err", err)
		}
		cancel()
	}
}

// liveInstances returns the replicas of this deployment whose instance
// Lease is current, this one excluded unless mine.
func (b *Backend) liveInstances(ctx context.Context, mine bool) (map[string]bool, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner, labelKind: kindInstance})
	list, err := b.cs.CoordinationV1().Leases(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, l := range list.Items {
		inst := l.Labels[LabelInstance]
		if inst == b.cfg.Instance && !mine {
			continue
		}
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
			time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			live[inst] = true
		}
	}
	return live, nil
}

// deleteDeadInstances deletes the instance Leases of replicas that stopped
// renewing them longer than after ago (they were killed).
func (b *Backend) deleteDeadInstances(ctx context.Context, after time.Duration) {
	sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner, labelKind: kindInstance})
	list, err := b.cs.CoordinationV1().Leases(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return
	}
	for _, l := range list.Items {
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
			time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second+after {
			rv := l.ResourceVersion
			_ = b.cs.CoordinationV1().Leases(b.cfg.Namespace).Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		}
	}
}

// sweep deletes, from time to time, what no replica will use: warm pods of
// replicas that are gone, this replica's warm pods it lost track of, and
// run pods unused for IdleTTL. Every deletion is conditional on the pod
// not having changed since it was looked at, so a claim wins over it.
func (b *Backend) sweep() {
	defer b.wg.Done()
	every := 30 * time.Second
	if b.cfg.IdleTTL > 0 {
		every = min(max(b.cfg.IdleTTL/4, time.Second), every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		b.sweepOnce()
	}
}

// startGrace is how long the sweep leaves a run pod that is not running
// yet: longer than any start waits.
const startGrace = 10 * time.Minute

func (b *Backend) sweepOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	live, err := b.liveInstances(ctx, true)
	if err != nil {
		b.log.Warn("sweep: list instance leases", "err", err)
		return
	}
	b.deleteDeadInstances(ctx, 4*b.cfg.InstanceTTL)
	b.mu.Lock()
	mine := map[string]bool{}
	for _, pc := range b.warm {
		mine[pc.name] = true
	}
	filling := b.filling
	b.mu.Unlock()
	busy := b.busyRuns()
	pods, err := b.pods.Pods(b.cfg.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		age := time.Since(p.CreationTimestamp.Time)
		var why string
		switch p.Labels[LabelState] {
		case stateWarm:
			inst := p.Labels[LabelInstance]
			switch {
			case inst != b.cfg.Instance && !live[inst] && age > b.cfg.InstanceTTL:
				why = "warm pod of a replica that is gone"
			case inst == b.cfg.Instance && !mine[p.Name] && filling == 0 && age > time.Minute:
				why = "warm pod this replica lost track of"
			}
		case stateRun:
			used := parseStamp(p.Annotations[AnnotationUsed])
			// A pod still starting is not idle, however slow the start:
			// its kernel has not served a call yet. (One whose replica
			// died while starting it goes once it is old.)
			starting := !running(p, kernelContainer) && age < startGrace
			if b.cfg.IdleTTL > 0 && !busy[p.Annotations[AnnotationRun]] && !starting && time.Since(used) > b.cfg.IdleTTL && age > b.cfg.IdleTTL {
				why = "run's kernel unused for " + b.cfg.IdleTTL.String()
			}
		}
		if why != "" {
			b.log.Info("sweeping kernel pod", "pod", p.Name, "run", p.Annotations[AnnotationRun], "why", why)
			b.deletePod(p.Name, p.ResourceVersion)
		}
	}
}

// --- closing -------------------------------------------------------------------------------

// lastOut reports whether no other replica of the deployment is alive. A
// replica killed a moment ago still has a current instance Lease, so one
// that looks alive counts only once it renews its Lease; a replica that
// does not within its Lease's lifetime is dead.
func (b *Backend) lastOut(ctx context.Context) (bool, error) {
	first, err := b.renewals(ctx)
	if err != nil || len(first) == 0 {
		return err == nil, err
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
		now, err := b.renewals(ctx)
		if err != nil {
			return false, err
		}
		for inst, renewed := range now {
			if before, ok := first[inst]; !ok || renewed.After(before) {
				return false, nil // it renewed (or is new): alive
			}
		}
		if len(now) == 0 {
			return true, nil // every other Lease expired unrenewed
		}
	}
}

// renewals returns the last renewal of every other replica whose instance
// Lease is current.
func (b *Backend) renewals(ctx context.Context) (map[string]time.Time, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelOwner: b.cfg.Owner, labelKind: kindInstance})
	list, err := b.cs.CoordinationV1().Leases(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, l := range list.Items {
		inst := l.Labels[LabelInstance]
		if inst == b.cfg.Instance || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		if time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			out[inst] = l.Spec.RenewTime.Time
		}
	}
	return out, nil
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
