package wasm

import "sync/atomic"

// memStats is what an instance's allocator saw: the size of the linear
// memory (which only grows) and whether a request to grow was refused since
// the flag was last cleared (the guest ran out of memory).
type memStats struct {
	size    atomic.Uint64
	refused atomic.Bool
}

func (s *memStats) grew(size uint64) { s.size.Store(size) }

// heapMemory is a linear memory on the Go heap with a size limit; it is what
// newAllocator falls back to where it cannot reserve address space.
type heapMemory struct {
	buf   []byte
	limit uint64
	stats *memStats
}

// Reallocate implements experimental.LinearMemory.
func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > m.limit {
		m.stats.refused.Store(true)
		return nil
	}
	m.stats.grew(size)
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	nb := make([]byte, size, min(max(size, uint64(cap(m.buf))*2), m.limit))
	copy(nb, m.buf)
	m.buf = nb
	return m.buf
}

// Free implements experimental.LinearMemory.
func (m *heapMemory) Free() { m.buf = nil }
