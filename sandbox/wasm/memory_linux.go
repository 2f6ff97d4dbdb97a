package wasm

import (
	"sync"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// newAllocator returns a linear-memory allocator that reserves the kernel's
// whole memory limit as address space once (MAP_NORESERVE, so nothing is
// committed) and grows in place.
//
// wazero's default grows memory with append, which copies the old buffer and
// leaves it to the Go GC: growing to 1 GiB briefly needs about twice that and
// the freed copies stay in the process until the scavenger returns them. Here
// growth copies nothing, pages become resident only when the guest touches
// them, and Free gives everything back at once. limit caps growth below the
// runtime-wide limit so one kernel can get a smaller quota; stats records
// growth and refusals so a death can be explained.
func newAllocator(limit uint64, stats *memStats) experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capBytes, maxBytes uint64) experimental.LinearMemory {
		reserve := min(maxBytes, limit)
		b, err := syscall.Mmap(-1, 0, int(reserve), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
		if err != nil {
			// Address space is short (a 32-bit host, a ulimit): fall back to
			// the Go heap, still honouring the limit.
			return &heapMemory{limit: reserve, stats: stats}
		}
		return &mmapMemory{buf: b, stats: stats}
	})
}

// mmapMemory is a linear memory inside one fixed mapping.
type mmapMemory struct {
	mu    sync.Mutex
	buf   []byte // the whole mapping; nil once freed
	stats *memStats
}

// Reallocate implements experimental.LinearMemory.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf == nil || size > uint64(len(m.buf)) {
		m.stats.refused.Store(true)
		return nil
	}
	m.stats.grew(size)
	return m.buf[:size:size]
}

// Free implements experimental.LinearMemory. wazero calls it once the
// instance is closed and no guest code runs any more.
func (m *mmapMemory) Free() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
	}
}
