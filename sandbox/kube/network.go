package kube

import (
	"context"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triadhq/triad/sandbox"
)

// NetworkPolicyName is the deny-all NetworkPolicy New makes sure exists in
// the namespace (deploy/kubernetes ships the same object).
const NetworkPolicyName = "deny-all"

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
