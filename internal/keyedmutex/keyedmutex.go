// Package keyedmutex is a mutex per key whose entry lives only while someone holds or awaits it.
//
// A sync.Map of *sync.Mutex by run id grows by one entry per run and never
// shrinks: after many short runs it is most of what the server remembers.
// Here each key's mutex is counted by its holders and waiters and removed
// with the last of them, so the map holds only the keys in use.
package keyedmutex

import "sync"

// Map is a set of mutexes by key. The zero value is ready to use.
type Map[K comparable] struct {
	mu sync.Mutex
	m  map[K]*entry
}

type entry struct {
	sync.Mutex
	refs int // holders and waiters; the entry is removed at 0
}

// Lock waits until the caller holds k's mutex, and returns its unlock,
// which must be called exactly once.
func (m *Map[K]) Lock(k K) (unlock func()) {
	m.mu.Lock()
	if m.m == nil {
		m.m = map[K]*entry{}
	}
	e := m.m[k]
	if e == nil {
		e = &entry{}
		m.m[k] = e
	}
	e.refs++
	m.mu.Unlock()
	e.Lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.Unlock()
			m.mu.Lock()
			if e.refs--; e.refs == 0 {
				delete(m.m, k)
			}
			m.mu.Unlock()
		})
	}
}

// Len is the number of keys held or awaited now.
func (m *Map[K]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
