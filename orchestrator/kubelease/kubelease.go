// Package kubelease keeps a run's single writer across Triad replicas with one coordination.k8s.io Lease per run.
//
// A replica holds a run's Lease for the duration of a call and renews it
// while a long call runs; the other replicas wait for it, up to a bound,
// and then fail with a fault of kind conflict that names the holder. A
// replica that dies mid-call stops renewing, its Lease expires, and the
// next replica takes it over, Stale: the call the dead one had begun is in
// the store's records (package journal's call-in-progress record), and
// the orchestrator records it as interrupted. Each replica remembers the
// Lease's resourceVersion as it left it, so a later acquisition that finds
// another version knows another replica held the run since (Stale).
// Within one replica, calls on a run queue on a local lock first, so only
// one of them watches the Lease. See docs/DECISIONS.md, "Several
// replicas".
package kubelease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox/kube"
)

// Labels of run Leases.
const (
	labelKind = "triad.dev/kind"
	kindRun   = "run"
)

// Defaults of Config.
const (
	DefaultDuration = 15 * time.Second
	DefaultWait     = 5 * time.Minute
	DefaultKeep     = 24 * time.Hour
)

// Config configures a Lock. Rest, Namespace and Holder are required.
type Config struct {
	Rest      *rest.Config
	Namespace string
	// Owner names the deployment (as sandbox/kube's Config.Owner): its
	// replicas share Leases. Empty means "triad".
	Owner string
	// Holder names this replica in the Leases it holds (sandbox/kube's
	// Backend.Instance).
	Holder string
	// Duration is how long a Lease lasts without renewal: how long the
	// other replicas wait for a run whose holder died. Renewals come every
	// third of it. Zero means 15 s.
	Duration time.Duration
	// Wait bounds how long a call waits for a run another replica holds.
	// Zero means 5 minutes.
	Wait time.Duration
	// Keep is how long a released Lease stays before the sweep deletes
	// it; zero means 24 hours.
	Keep   time.Duration
	Logger *slog.Logger
}

// Lock is a RunLock over Leases. It implements orchestrator.RunLock.
type Lock struct {
	cfg Config
	cs  *kubernetes.Clientset
	log *slog.Logger

	mu    sync.Mutex
	local map[runid.ID]*queue // this replica's queue per run, while a call holds or awaits it
	left  map[runid.ID]string // the Lease's resourceVersion as this replica left it

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var _ orchestrator.RunLock = (*Lock)(nil)

// New returns a Lock and starts its sweep of old released Leases.
func New(cfg Config) (*Lock, error) {
	if cfg.Rest == nil || cfg.Namespace == "" || cfg.Holder == "" {
		return nil, errors.New("kubelease: Config.Rest, Namespace and Holder are required")
	}
	if cfg.Owner == "" {
		cfg.Owner = kube.DefaultOwner
	}
	if cfg.Duration <= 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cs, err := kubernetes.NewForConfig(cfg.Rest)
	if err != nil {
		return nil, err
	}
	l := &Lock{cfg: cfg, cs: cs, log: cfg.Logger, local: map[runid.ID]*queue{}, left: map[runid.ID]string{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.sweep()
	return l, nil
}

// Close stops the sweep. Held runs stay held until released.
func (l *Lock) Close() error {
	l.once.Do(func() { close(l.stop); <-l.done })
	return nil
}

// name is the Lease of run.
func (l *Lock) name(run runid.ID) string {
	return "triad-run-" + kube.RunKey(l.cfg.Owner+"/"+run.String())
}

func (l *Lock) leases() leaseAPI { return l.cs.CoordinationV1().Leases(l.cfg.Namespace) }

type leaseAPI interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// queue is a run's local queue: a token, and the calls holding or awaiting
// it. It goes with the last of them, so that the map holds only runs in use.
type queue struct {
	tok  chan struct{}
	refs int
}

// token returns run's local queue, counting the caller in; leave counts it
// out.
func (l *Lock) token(run runid.ID) *queue {
	l.mu.Lock()
	defer l.mu.Unlock()
	q, ok := l.local[run]
	if !ok {
		q = &queue{tok: make(chan struct{}, 1)}
		q.tok <- struct{}{}
		l.local[run] = q
	}
	q.refs++
	return q
}

// leave counts a caller of token out of run's queue.
func (l *Lock) leave(run runid.ID, q *queue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q.refs--; q.refs == 0 && l.local[run] == q {
		delete(l.local, run)
	}
}

// Forget drops what the lock remembers of run: the orchestrator dropped its
// caches of the idle run, so the next holder here reads the run again
// (Stale) as it would after another replica.
func (l *Lock) Forget(run runid.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.left, run)
}

// Len is the number of runs the lock remembers something of.
func (l *Lock) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.local) + len(l.left)
}

// Lock implements orchestrator.RunLock.
func (l *Lock) Lock(ctx context.Context, run runid.ID) (orchestrator.Held, error) {
	deadline := time.Now().Add(l.cfg.Wait)
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	q := l.token(run)
	select {
	case <-q.tok:
	case <-wctx.Done():
		l.leave(run, q)
		return nil, l.busy(ctx, run, "another call on this replica")
	}
	h, err := l.acquire(wctx, ctx, run)
	if err != nil {
		q.tok <- struct{}{}
		l.leave(run, q)
		return nil, err
	}
	h.q = q
	return h, nil
}

// busy is the error for a wait that ran out.
func (l *Lock) busy(ctx context.Context, run runid.ID, holder string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return fault.New(fault.Conflict,
		fmt.Sprintf("run %s is busy: %s has held it for longer than %s", run, holder, l.cfg.Wait),
		"calls on one run run one at a time; retry when the running call has finished, or use another run")
}

// acquire takes the run's Lease, waiting while another live holder has it.
func (l *Lock) acquire(wctx, ctx context.Context, run runid.ID) (*held, error) {
	api := l.leases()
	name := l.name(run)
	holder := "another replica"
	for {
		lease, err := api.Get(wctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			lease, err = api.Create(wctx, l.newLease(name, run), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, l.unavailable(wctx, ctx, run, holder, err)
			}
			return l.hold(run, lease, true), nil
		case err != nil:
			return nil, l.unavailable(wctx, ctx, run, holder, err)
		}
		cur := ""
		if lease.Spec.HolderIdentity != nil {
			cur = *lease.Spec.HolderIdentity
		}
		// A Lease this replica still holds is one whose release did not
		// land (the local queue says no call here holds it): take it back.
		if cur != "" && cur != l.cfg.Holder && !l.expired(lease) {
			holder = "replica " + cur
			select {
			case <-wctx.Done():
				return nil, l.busy(ctx, run, holder)
			case <-time.After(time.Duration(50+rand.IntN(200)) * time.Millisecond):
			}
			continue
		}
		// Free, or its holder died: take it. The update carries the
		// resourceVersion read above, so of two takers one wins.
		l.mu.Lock()
		stale := l.left[run] != lease.ResourceVersion
		l.mu.Unlock()
		if cur != "" {
			l.log.WarnContext(ctx, "taking over a run whose replica stopped renewing its lease", "run", run, "holder", cur)
			stale = true
		}
		now := metav1.NewMicroTime(time.Now())
		me := l.cfg.Holder
		secs := int32(l.cfg.Duration / time.Second)
		lease.Spec.HolderIdentity, lease.Spec.AcquireTime, lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds = &me, &now, &now, &secs
		if cur != me {
			t := int32(0)
			if lease.Spec.LeaseTransitions != nil {
				t = *lease.Spec.LeaseTransitions
			}
			t++
			lease.Spec.LeaseTransitions = &t
		}
		updated, err := api.Update(wctx, lease, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, l.unavailable(wctx, ctx, run, holder, err)
		}
		return l.hold(run, updated, stale), nil
	}
}

// unavailable is the error for an API server that does not answer.
func (l *Lock) unavailable(wctx, ctx context.Context, run runid.ID, holder string, err error) error {
	if wctx.Err() != nil {
		return l.busy(ctx, run, holder)
	}
	return fault.Wrap(fault.Unavailable, err, fmt.Sprintf("the run lock of %s (a Kubernetes Lease) cannot be taken", run),
		"retry; if it persists, check that the Kubernetes API server answers and Triad's Role grants leases")
}

// expired reports whether a held Lease's holder stopped renewing it. A
// second of slack covers clock skew between replicas.
func (l *Lock) expired(lease *coordinationv1.Lease) bool {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return time.Since(lease.Spec.RenewTime.Time) > time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second+time.Second
}

func (l *Lock) newLease(name string, run runid.ID) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	me := l.cfg.Holder
	secs := int32(l.cfg.Duration / time.Second)
	zero := int32(0)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.cfg.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "triad", kube.LabelOwner: l.cfg.Owner,
				labelKind: kindRun, kube.LabelRun: kube.RunKey(run.String())},
			Annotations: map[string]string{kube.AnnotationRun: run.String()},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &me, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now, LeaseTransitions: &zero},
	}
}

// hold starts renewing a Lease this replica took.
func (l *Lock) hold(run runid.ID, lease *coordinationv1.Lease, stale bool) *held {
	h := &held{l: l, run: run, lease: lease, stale: stale, stop: make(chan struct{}), done: make(chan struct{})}
	go h.renew()
	return h
}

// held is a run Lease this replica holds.
type held struct {
	l     *Lock
	run   runid.ID
	q     *queue
	stale bool

	mu    sync.Mutex // guards lease: renewals and Unlock update it
	lease *coordinationv1.Lease
	lost  bool

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func (h *held) Stale() bool { return h.stale }

// update applies change to the held Lease and writes it; a conflict means
// another replica took it (this one stopped renewing in time) and is
// reported once.
func (h *held) update(ctx context.Context, change func(*coordinationv1.Lease)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost {
		return errors.New("the run's lease was lost")
	}
	lease := h.lease.DeepCopy()
	change(lease)
	updated, err := h.l.leases().Update(ctx, lease, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		h.lost = true
		h.l.log.ErrorContext(ctx, "lost a run's lease while holding it (renewals did not arrive in time); another replica may write the run", "run", h.run, "err", err)
		return err
	}
	if err != nil {
		return err
	}
	h.lease = updated
	return nil
}

// renew keeps the Lease alive every third of its duration until Unlock.
func (h *held) renew() {
	defer close(h.done)
	t := time.NewTicker(h.l.cfg.Duration / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.l.cfg.Duration/3)
		err := h.update(ctx, func(lease *coordinationv1.Lease) {
			now := metav1.NewMicroTime(time.Now())
			lease.Spec.RenewTime = &now
		})
		cancel()
		if err != nil {
			h.l.log.Warn("renew a run's lease", "run", h.run, "err", err)
		}
	}
}

// Unlock implements orchestrator.Held: the Lease is released (no holder)
// and its new resourceVersion remembered.
func (h *held) Unlock() {
	h.once.Do(func() {
		close(h.stop)
		<-h.done
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := h.update(ctx, func(lease *coordinationv1.Lease) {
			empty := ""
			now := metav1.NewMicroTime(time.Now())
			lease.Spec.HolderIdentity, lease.Spec.RenewTime = &empty, &now
		})
		h.l.mu.Lock()
		if err == nil {
			h.l.left[h.run] = h.lease.ResourceVersion
		} else {
			// Whether the release landed is unknown: the next holder here
			// re-reads the run.
			delete(h.l.left, h.run)
			h.l.log.Warn("release a run's lease; it expires by itself", "run", h.run, "err", err)
		}
		h.l.mu.Unlock()
		h.q.tok <- struct{}{}
		h.l.leave(h.run, h.q)
	})
}

// Changed implements orchestrator.RunLock: the Lease's resourceVersion is
// not the one this replica left it at.
func (l *Lock) Changed(ctx context.Context, run runid.ID) bool {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := l.leases().Get(gctx, l.name(run), metav1.GetOptions{})
	if err != nil {
		return !apierrors.IsNotFound(err) // unknown: re-read; never leased: nothing to re-read
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.left[run] != lease.ResourceVersion
}

// sweep deletes the Leases of runs released longer ago than Keep, each only
// if it has not changed since it was listed.
func (l *Lock) sweep() {
	defer close(l.done)
	t := time.NewTicker(min(l.cfg.Keep/4, 10*time.Minute))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sel := labels.SelectorFromSet(labels.Set{kube.LabelOwner: l.cfg.Owner, labelKind: kindRun}).String()
		list, err := l.cs.CoordinationV1().Leases(l.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil {
			for _, lease := range list.Items {
				free := lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" || l.expired(&lease)
				if free && lease.Spec.RenewTime != nil && time.Since(lease.Spec.RenewTime.Time) > l.cfg.Keep {
					rv := lease.ResourceVersion
					_ = l.cs.CoordinationV1().Leases(l.cfg.Namespace).Delete(ctx, lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
				}
			}
		}
		cancel()
	}
}
