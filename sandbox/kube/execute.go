package kube

import (
	"context"
	"fmt"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/jupytercell"
	"github.com/triadhq/triad/sandbox/jupyter"
)

// Execute implements sandbox.Kernel, as sandbox/docker does, through
// jupytercell.Run: output is delivered message by message; a timed-out or
// abandoned cell is interrupted over the control channel, and the kernel
// is restarted (moved to a fresh pod with its files) if the cell does not
// end within Config.InterruptGrace. See sandbox.Kernel for the contract.
func (k *Kernel) Execute(ctx context.Context, cell sandbox.Cell) (*sandbox.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := jupytercell.Check(ctx, cellHooks{k}, k.ID()); err != nil {
		return nil, err
	}
	defer k.use()()
	restarted := k.restarted
	k.restarted = false
	if pc := k.current(); pc == nil || pc.client == nil || pc.gone() {
		// An earlier death could not restart the kernel, or the pod went
		// away between calls (evicted, deleted): start afresh now.
		if err := k.restartLocked(ctx); err != nil {
			return nil, fmt.Errorf("kernel %s is down and did not restart: %w", k.ID(), err)
		}
		restarted = true
	}
	k.touch(k.current())
	return jupytercell.Run(ctx, cellHooks{k}, cell, jupytercell.Settings{
		Timeout:     k.b.cfg.CellTimeout,
		Grace:       k.b.cfg.InterruptGrace,
		OutputBytes: k.limits.OutputBytes,
		Restarted:   restarted,
		ID:          k.ID(),
		Log:         k.b.log,
	})
}

// cellHooks is the Kubernetes side of jupytercell.Kernel: the client over
// the current pod's port-forward, the pod's watch, a restart in a fresh
// pod, and the pod status's word on a death. Its methods run with k.mu
// held.
type cellHooks struct{ k *Kernel }

// Client is the current pod's client, nil while there is none.
func (h cellHooks) Client() *jupyter.Client {
	if pc := h.k.current(); pc != nil {
		return pc.client
	}
	return nil
}

// Exited is closed when the current pod's kernel has ended for good.
func (h cellHooks) Exited() <-chan struct{} {
	if pc := h.k.current(); pc != nil {
		return pc.watch.gone
	}
	return nil
}

// Closing is closed when the kernel is being closed.
func (h cellHooks) Closing() <-chan struct{} { return h.k.closing }

// Restart moves the kernel to a fresh pod with its files.
func (h cellHooks) Restart(ctx context.Context) error { return h.k.restartLocked(ctx) }

// Cut closes the client and the whole port-forward with it (its streams
// are full of the flood, and a new stream on it would wait behind them),
// then a new client interrupts the cell over the control channel and
// waits for the kernel to answer again.
func (h cellHooks) Cut(ctx context.Context) error {
	pc := h.k.current()
	_ = pc.client.Close()
	pc.client = nil
	_ = pc.fwd.Close()
	client, err := pc.dial(ctx)
	if err != nil {
		return err
	}
	if err = client.Interrupt(ctx); err == nil {
		err = client.WaitReady(ctx)
	}
	if err != nil {
		client.Close()
		return err
	}
	pc.client = client
	return nil
}

// Died waits for the kubelet to report the exit and returns the reason
// the pod status gives (OOMKilled, the exit code, an eviction).
func (h cellHooks) Died(ctx context.Context) string {
	k := h.k
	pc := k.current()
	// The streams can end before the kubelet has reported the exit; give
	// it a moment so that the reason is known.
	select {
	case <-pc.watch.gone:
	case <-k.violated(pc):
	case <-time.After(10 * time.Second):
	}
	reason := k.deathReason(ctx, pc)
	k.b.log.WarnContext(ctx, "sandbox kernel died", "kernel", pc.name, "run", k.run, "reason", reason)
	return reason
}
