package kernels

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
)

// NewContext makes a code context for the run: an interpreter of language
// in the run's kernel (started from spec if need be) that begins its cells
// in cwd, a path relative to the run's files. A kernel it starts is
// claimed as Acquire's is. Callers serialize it with Acquire per run.
func (m *Manager) NewContext(ctx context.Context, run runid.ID, cwd, language string, spec sandbox.Spec, claim Claim) (Context, error) {
	m.mu.Lock()
	n := 0
	for _, c := range m.contexts[run] {
		if !c.implicit {
			n++
		}
	}
	m.mu.Unlock()
	if n >= m.c.MaxContexts {
		return Context{}, fmt.Errorf("run %s has %d contexts: %w", run, n, ErrTooManyContexts)
	}
	s, err := m.Acquire(ctx, run, spec, claim)
	if err != nil {
		return Context{}, err
	}
	defer m.Release(s)
	k, err := m.startContext(ctx, s.Kernel, cwd, language)
	if err != nil {
		return Context{}, fmt.Errorf("new context for run %s: %w", run, err)
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	c := &contextState{Context: Context{ID: "ctx-" + hex.EncodeToString(r[:]), Language: language, Cwd: cwd, Created: time.Now().UTC()}}
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

// startContext starts an interpreter of language beside kernel k.
func (m *Manager) startContext(ctx context.Context, k sandbox.Kernel, cwd, language string) (sandbox.Kernel, error) {
	if language == sandbox.LanguagePython {
		cs, ok := k.(sandbox.Contexts)
		if !ok {
			return nil, fmt.Errorf("%s kernels: %w", m.Backend(), ErrNoContexts)
		}
		return cs.NewContext(ctx, cwd)
	}
	ls, ok := k.(sandbox.Languages)
	if !ok || !slices.Contains(ls.Languages(), language) {
		return nil, fmt.Errorf("%s kernels, language %s: %w", m.Backend(), language, ErrNoLanguage)
	}
	c, err := ls.NewLanguageContext(ctx, cwd, language)
	if errors.Is(err, sandbox.ErrLanguage) {
		return nil, fmt.Errorf("%s kernels, language %s: %w: %w", m.Backend(), language, ErrNoLanguage, err)
	}
	return c, err
}

// Languages lists the languages whose interpreters the backend's kernels
// start besides Python (sandbox.Polyglot); nil when they start none.
func (m *Manager) Languages() []string {
	if p, ok := sandbox.Ability[sandbox.Polyglot](m.c.Backend); ok {
		return p.Languages()
	}
	return nil
}

// Contexts lists the run's contexts in the order they were made; a
// language's default interpreter is not one.
func (m *Manager) Contexts(run runid.ID) []Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Context, 0, len(m.contexts[run]))
	for _, c := range m.contexts[run] {
		if !c.implicit {
			out = append(out, c.Context)
		}
	}
	return out
}

// HasContext reports whether the run has a context by that id.
func (m *Manager) HasContext(run runid.ID, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.find(run, id)
	return c != nil && !c.implicit
}

// Context returns the run's context by that id.
func (m *Manager) Context(run runid.ID, id string) (Context, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.find(run, id)
	if c == nil || c.implicit {
		return Context{}, false
	}
	return c.Context, true
}

// LanguageKernel returns the run's default interpreter of language (not
// Python: that is the run's kernel) in s, the run's session from Acquire,
// starting it on first use in this kernel. fresh is true when it ran cells
// before and was started again: its variables are gone. It is a context
// whose id is the language, made on first use, never listed.
func (m *Manager) LanguageKernel(ctx context.Context, run runid.ID, s *Session, language string) (k sandbox.Kernel, fresh bool, err error) {
	m.mu.Lock()
	if m.find(run, language) == nil {
		m.contexts[run] = append(m.contexts[run], &contextState{
			Context:  Context{ID: language, Language: language, Created: time.Now().UTC()},
			implicit: true,
		})
	}
	m.mu.Unlock()
	return m.ContextKernel(ctx, run, s, language)
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
	k, err = m.startContext(ctx, s.Kernel, c.Cwd, c.Language)
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

// ForgetContexts ends and forgets every context of the run, the
// languages' default interpreters included (the run is over).
func (m *Manager) ForgetContexts(run runid.ID) {
	m.mu.Lock()
	var ids []string
	for _, c := range m.contexts[run] {
		ids = append(ids, c.ID)
	}
	m.mu.Unlock()
	for _, id := range ids {
		_ = m.RemoveContext(run, id)
	}
}
