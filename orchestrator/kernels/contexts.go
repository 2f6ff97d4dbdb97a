package kernels

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
)

// NewContext makes a code context for the run: an interpreter in the
// run's kernel (started from spec if need be) that begins its cells in
// cwd, a path relative to the run's files. Callers serialize it with
// Acquire per run.
func (m *Manager) NewContext(ctx context.Context, run runid.ID, cwd string, spec sandbox.Spec) (Context, error) {
	m.mu.Lock()
	n := len(m.contexts[run])
	m.mu.Unlock()
	if n >= m.c.MaxContexts {
		return Context{}, fmt.Errorf("run %s has %d contexts: %w", run, n, ErrTooManyContexts)
	}
	s, err := m.Acquire(ctx, run, spec)
	if err != nil {
		return Context{}, err
	}
	defer m.Release(s)
	cs, ok := s.Kernel.(sandbox.Contexts)
	if !ok {
		return Context{}, fmt.Errorf("%s kernels: %w", m.Backend(), ErrNoContexts)
	}
	k, err := cs.NewContext(ctx, cwd)
	if err != nil {
		return Context{}, fmt.Errorf("new context for run %s: %w", run, err)
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	c := &contextState{Context: Context{ID: "ctx-" + hex.EncodeToString(r[:]), Cwd: cwd, Created: time.Now().UTC()}}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[run] != s {
		k.Close() // the kernel went away meanwhile; the context starts on first use
	} else {
		if s.contexts == nil {
			s.contexts = map[string]sandbox.Kernel{}
		}
		s.contexts[c.ID] = k
	}
	m.contexts[run] = append(m.contexts[run], c)
	return c.Context, nil
}

// Contexts lists the run's contexts in the order they were made.
func (m *Manager) Contexts(run runid.ID) []Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Context, 0, len(m.contexts[run]))
	for _, c := range m.contexts[run] {
		out = append(out, c.Context)
	}
	return out
}

// HasContext reports whether the run has a context by that id.
func (m *Manager) HasContext(run runid.ID, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.find(run, id) != nil
}

func (m *Manager) find(run runid.ID, id string) *contextState {
	for _, c := range m.contexts[run] {
		if c.ID == id {
			return c
		}
	}
	return nil
}

// ContextKernel returns the interpreter of context id in s, the run's
// session from Acquire, starting it when it does not run in this kernel
// (the kernel is new since it last ran, or it was restarted). fresh is
// true when it was started again after running cells before: its
// variables are gone.
func (m *Manager) ContextKernel(ctx context.Context, run runid.ID, s *Session, id string) (k sandbox.Kernel, fresh bool, err error) {
	m.mu.Lock()
	c := m.find(run, id)
	if c == nil {
		m.mu.Unlock()
		return nil, false, fmt.Errorf("context %q of run %s: %w", id, run, ErrNoContext)
	}
	k, used := s.contexts[id], c.used
	c.used = true
	m.mu.Unlock()
	if k != nil {
		return k, false, nil
	}
	cs, ok := s.Kernel.(sandbox.Contexts)
	if !ok {
		return nil, false, fmt.Errorf("%s kernels: %w", m.Backend(), ErrNoContexts)
	}
	k, err = cs.NewContext(ctx, c.Cwd)
	if err != nil {
		return nil, false, fmt.Errorf("start context %q of run %s: %w", id, run, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.find(run, id) == nil {
		k.Close()
		return nil, false, fmt.Errorf("context %q of run %s: %w", id, run, ErrNoContext)
	}
	if s.contexts == nil {
		s.contexts = map[string]sandbox.Kernel{}
	}
	s.contexts[id] = k
	return k, used, nil
}

// DropContext stops the interpreter of context id in s (it was unusable);
// the context starts afresh on its next use.
func (m *Manager) DropContext(s *Session, id string) {
	m.mu.Lock()
	k := s.contexts[id]
	delete(s.contexts, id)
	m.mu.Unlock()
	if k != nil {
		k.Close()
	}
}

// RestartContext restarts context id of the run: its variables go, the
// run's other interpreters are left alone. A context that does not run
// now needs nothing: it starts fresh on its next use. Callers serialize it
// with Acquire per run.
func (m *Manager) RestartContext(ctx context.Context, run runid.ID, id string) error {
	m.mu.Lock()
	c := m.find(run, id)
	if c == nil {
		m.mu.Unlock()
		return fmt.Errorf("context %q of run %s: %w", id, run, ErrNoContext)
	}
	var k sandbox.Kernel
	s := m.sessions[run]
	if s != nil {
		k = s.contexts[id]
	}
	m.mu.Unlock()
	if k == nil {
		return nil
	}
	if err := k.Restart(ctx); err != nil {
		m.DropContext(s, id)
		return fmt.Errorf("restart context %q of run %s: %w", id, run, err)
	}
	return nil
}

// RemoveContext ends context id of the run and forgets it.
func (m *Manager) RemoveContext(run runid.ID, id string) error {
	m.mu.Lock()
	c := m.find(run, id)
	if c == nil {
		m.mu.Unlock()
		return fmt.Errorf("context %q of run %s: %w", id, run, ErrNoContext)
	}
	m.contexts[run] = slices.DeleteFunc(m.contexts[run], func(x *contextState) bool { return x == c })
	if len(m.contexts[run]) == 0 {
		delete(m.contexts, run)
	}
	var k sandbox.Kernel
	if s := m.sessions[run]; s != nil {
		k = s.contexts[id]
		delete(s.contexts, id)
	}
	m.mu.Unlock()
	if k != nil {
		return k.Close()
	}
	return nil
}

// ForgetContexts ends and forgets every context of the run (the run is
// over).
func (m *Manager) ForgetContexts(run runid.ID) {
	for _, c := range m.Contexts(run) {
		_ = m.RemoveContext(run, c.ID)
	}
}
