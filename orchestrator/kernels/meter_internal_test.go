package kernels

import (
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// A kernel's readings fold into what it used since the previous one: CPU
// time as a difference of its count (all of it when the count started
// again), memory as trapezoids between readings, the first from when the
// kernel became the run's. Unknown stays unknown.
func TestMeterFold(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	boot, reboot := t0.Add(-time.Minute), t0.Add(30*time.Second)
	sec := func(n float64) time.Duration { return time.Duration(n * float64(time.Second)) }
	type reading struct {
		u    sandbox.Usage
		at   time.Time
		want Used
	}
	for _, tc := range []struct {
		name     string
		readings []reading
	}{
		{"differences and trapezoids", []reading{
			{sandbox.Usage{CPUTime: sec(2), Since: boot, MemoryBytes: 100}, t0.Add(10 * time.Second), Used{CPU: sec(2), CPUKnown: true, Memory: 100, MemoryByteSeconds: 500}},
			{sandbox.Usage{CPUTime: sec(5), Since: boot, MemoryBytes: 300}, t0.Add(20 * time.Second), Used{CPU: sec(3), CPUKnown: true, Memory: 300, MemoryByteSeconds: 2000}},
		}},
		{"a restart starts the count again", []reading{
			{sandbox.Usage{CPUTime: sec(4), Since: boot, MemoryBytes: 0}, t0.Add(10 * time.Second), Used{CPU: sec(4), CPUKnown: true, Memory: 0}},
			// More than before, but counted from the restart: all new.
			{sandbox.Usage{CPUTime: sec(6), Since: reboot, MemoryBytes: 0}, t0.Add(40 * time.Second), Used{CPU: sec(6), CPUKnown: true, Memory: 0}},
			{sandbox.Usage{CPUTime: sec(7), Since: reboot, MemoryBytes: 0}, t0.Add(50 * time.Second), Used{CPU: sec(1), CPUKnown: true, Memory: 0}},
		}},
		{"the same count cannot go back", []reading{
			{sandbox.Usage{CPUTime: sec(4), Since: boot, MemoryBytes: 0}, t0.Add(10 * time.Second), Used{CPU: sec(4), CPUKnown: true, Memory: 0}},
			{sandbox.Usage{CPUTime: sec(1), Since: boot, MemoryBytes: 0}, t0.Add(20 * time.Second), Used{CPUKnown: true, Memory: 0}},
			{sandbox.Usage{CPUTime: sec(5), Since: boot, MemoryBytes: 0}, t0.Add(30 * time.Second), Used{CPU: sec(1), CPUKnown: true, Memory: 0}},
		}},
		{"a count that does not say when it began and goes back started again", []reading{
			{sandbox.Usage{CPUTime: sec(4), MemoryBytes: 0}, t0.Add(10 * time.Second), Used{CPU: sec(4), CPUKnown: true, Memory: 0}},
			{sandbox.Usage{CPUTime: sec(1), MemoryBytes: 0}, t0.Add(20 * time.Second), Used{CPU: sec(1), CPUKnown: true, Memory: 0}},
		}},
		{"unknown stays unknown", []reading{
			{sandbox.Usage{CPUTime: -1, MemoryBytes: 64}, t0.Add(10 * time.Second), Used{Memory: 64, MemoryByteSeconds: 320}},
			{sandbox.Usage{CPUTime: -1, MemoryBytes: -1}, t0.Add(20 * time.Second), Used{Memory: -1}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m meter
			for i, r := range tc.readings {
				if got := m.fold(r.u, r.at, t0); got != r.want {
					t.Errorf("reading %d: got %+v, want %+v", i, got, r.want)
				}
			}
		})
	}
}
