package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/triadhq/triad/sandbox"
)

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
func (b *Backend) createPod(ctx context.Context, l sandbox.Limits, image, run string) (string, error) {
	now := stamp(time.Now())
	ann := map[string]string{}
	if run != "" {
		ann[AnnotationRun], ann[AnnotationClaimed], ann[AnnotationUsed] = run, now, now
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	p, err := b.cs.CoreV1().Pods(b.cfg.Namespace).Create(cctx, b.podSpec(l, image, b.labels(l, run), ann), metav1.CreateOptions{})
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
func (b *Backend) freshPod(ctx context.Context, l sandbox.Limits, image, run string) (*podConn, error) {
	// Warm pods were made, and their clients dialled, for the default
	// limits, output limit included, and the backend's own image.
	pooled := l == b.cfg.Defaults && image == b.cfg.Image
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
	name, err := b.createPod(ctx, l, image, run)
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
