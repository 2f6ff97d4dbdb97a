package kube

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

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
