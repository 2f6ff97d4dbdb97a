//go:build !linux

package wasm

import "github.com/tetratelabs/wazero/experimental"

// newAllocator returns a Go-heap allocator that enforces limit; only Linux
// gets the reserve-once mapping (memory_linux.go).
func newAllocator(limit uint64, stats *memStats) experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capBytes, maxBytes uint64) experimental.LinearMemory {
		return &heapMemory{limit: min(maxBytes, limit), stats: stats}
	})
}
