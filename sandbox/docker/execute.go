package docker

import (
	"context"
	"fmt"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/jupytercell"
	"github.com/triadhq/triad/sandbox/jupyter"
)

// Execute implements sandbox.Kernel: the cell runs through
// jupytercell.Run, which delivers its output message by message and
// interrupts a timed-out or abandoned cell over the control channel,
// restarting the kernel (its container's process) if the cell does not end
// within Config.InterruptGrace. See sandbox.Kernel for the contract.
func (k *Kernel) Execute(ctx context.Context, cell sandbox.Cell) (*sandbox.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := jupytercell.Check(ctx, cellHooks{k}, k.ID()); err != nil {
		return nil, err
	}
	restarted := false
	if k.client == nil {
		// An earlier death could not restart the kernel; try again now.
		if err := k.restartLocked(ctx); err != nil {
			return nil, fmt.Errorf("kernel %s is down and did not restart: %w", k.ID(), err)
		}
		restarted = true
	}
	return jupytercell.Run(ctx, cellHooks{k}, cell, jupytercell.Settings{
		Timeout:     k.b.cfg.CellTimeout,
		Grace:       k.b.cfg.InterruptGrace,
		OutputBytes: k.limits.OutputBytes,
		Restarted:   restarted,
		NoThreads:   k.language != sandbox.LanguagePython,
		ID:          k.ID(),
		Log:         k.b.log,
	})
}

// cellHooks is the Docker side of jupytercell.Kernel: the client over the
// socket directory, the container process's exit, a restart in the same
// container, and the engine's word on a death. Its methods run with k.mu
// held.
type cellHooks struct{ k *Kernel }

// Client is the current client, nil while the kernel is down.
func (h cellHooks) Client() *jupyter.Client { return h.k.client }

// Exited is closed when the container's current process has exited.
func (h cellHooks) Exited() <-chan struct{} { return h.k.exited }

// Closing is closed when the kernel is being closed.
func (h cellHooks) Closing() <-chan struct{} { return h.k.closing }

// Restart boots a fresh kernel process in the same container.
func (h cellHooks) Restart(ctx context.Context) error { return h.k.restartLocked(ctx) }

// Cut drops the client, interrupts the cell with SIGINT (what
// interrupt_request does inside ipykernel) and redials.
func (h cellHooks) Cut(ctx context.Context) error {
	h.k.stopKernel()
	if err := h.k.signal(ctx, "INT"); err != nil {
		return err
	}
	return h.k.redial(ctx)
}

// Died waits for the engine to record the exit and asks it why.
func (h cellHooks) Died(ctx context.Context) string {
	k := h.k
	// The sockets can report EOF before the engine has recorded the exit;
	// give it a moment so the reason (OOMKilled, the exit code) is known.
	select {
	case <-k.exited:
	case <-k.violated():
	case <-time.After(5 * time.Second):
	}
	reason := k.deathReason(ctx)
	k.b.log.WarnContext(ctx, "sandbox kernel died", "kernel", k.ID(), "owner", k.owner, "reason", reason)
	return reason
}

// redial connects a new client to the running kernel and waits until it
// answers (after the cell in progress, if any, has ended).
func (k *Kernel) redial(ctx context.Context) error {
	client, err := jupyter.Dial(ctx, k.info, k.sockPrefix(), k.dialOptions())
	if err != nil {
		return fmt.Errorf("redial kernel: %w", err)
	}
	if err := client.WaitReady(ctx); err != nil {
		client.Close()
		return fmt.Errorf("redial kernel: %w", err)
	}
	k.client = client
	return nil
}
