package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

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
