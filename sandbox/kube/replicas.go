package kube

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// labelKind marks this package's Leases: instance Leases say which
// replicas are alive.
const (
	labelKind    = "triad.dev/kind"
	kindInstance = "instance"
)

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
