package wasm

import (
	"context"
	"fmt"

	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
)

var _ sandbox.Contexts = (*Kernel)(nil)

// NewContext implements sandbox.Contexts: a second python.wasm instance on
// the kernel's working directory and disk quota, with the same memory and
// output limits (each instance has its own linear memory, so the memory
// limit applies to each). Restarting the kernel leaves its contexts
// running. See docs/DECISIONS.md, "Contexts and commands at the seam".
func (k *Kernel) NewContext(ctx context.Context, cwd string) (sandbox.Kernel, error) {
	if k.parent != nil {
		return k.parent.NewContext(ctx, cwd)
	}
	dir := ""
	if cwd != "" {
		d, err := safepath.Clean(cwd)
		if err != nil {
			return nil, err
		}
		dir = "/work/" + d
	}
	c := &Kernel{b: k.b, id: k.id + "/c" + randomHex(3), owner: k.owner, workDir: k.workDir, files: k.files,
		memLimit: k.memLimit, outLimit: k.outLimit, quota: k.quota, closing: make(chan struct{}), parent: k, cwd: dir}
	k.ctxMu.Lock()
	select {
	case <-k.closing:
		k.ctxMu.Unlock()
		return nil, sandbox.ErrClosed
	default:
	}
	if k.contexts == nil {
		k.contexts = map[*Kernel]struct{}{}
	}
	k.contexts[c] = struct{}{}
	k.ctxMu.Unlock()
	inst, err := k.b.launch(ctx, c)
	if err != nil {
		k.forgetContext(c)
		return nil, fmt.Errorf("start context of wasm kernel %s: %w", k.id, err)
	}
	c.mu.Lock()
	c.setInstance(inst)
	c.mu.Unlock()
	return c, nil
}

// closeContext stops a context's interpreter; the working directory is its
// kernel's and stays. It is safe to call twice.
func (k *Kernel) closeContext() error {
	k.closeOnce.Do(func() { close(k.closing) })
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	k.stop()
	k.parent.forgetContext(k)
	return nil
}

func (k *Kernel) forgetContext(c *Kernel) {
	k.ctxMu.Lock()
	delete(k.contexts, c)
	k.ctxMu.Unlock()
}
