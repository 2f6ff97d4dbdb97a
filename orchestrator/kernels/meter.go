package kernels

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
)

// What a run's kernels use is read here and handed to the run's
// accounting (OnUsed) as what each used since its last reading: after a
// step (Meter), every Config.MeterEvery while it lives (the loop that
// reaps idle kernels), and once more just before the manager stops it or
// lets go of it. Each session folds its own readings, so a kernel
// replaced by another, or restarted, adds up and never counts twice. See
// docs/DECISIONS.md, "Per-run accounting (issue 27)".

// meterTimeout bounds one reading: past it, the reading is skipped.
const meterTimeout = 5 * time.Second

// Used is what a run's kernel used since its previous reading. A measure
// the backend cannot take is unknown, never a guessed zero.
type Used struct {
	// CPU is the CPU time used since the previous reading, known when
	// CPUKnown (Docker measures it; wasm and Kubernetes do not).
	CPU      time.Duration
	CPUKnown bool
	// Memory is the memory in use at this reading, -1 when unknown.
	// MemoryByteSeconds is the memory held since the previous reading,
	// in byte-seconds: the trapezoid between the two readings (the
	// kernel's first reading counts from when it became the run's, from
	// nothing).
	Memory            int64
	MemoryByteSeconds float64
}

// meter folds one session's readings. A session's readings are taken one
// at a time, under mu, so they are folded in the order they were read.
type meter struct {
	mu    sync.Mutex
	read  bool          // a reading was folded
	final bool          // the last reading was folded: nothing more counts
	at    time.Time     // when the previous reading returned
	since time.Time     // its sandbox.Usage.Since
	cpu   time.Duration // its CPU time, -1 unknown
	mem   int64         // its memory, -1 unknown
}

// fold folds a reading u that returned at at into the session's (which
// became the run's at started) and returns what it adds.
func (m *meter) fold(u sandbox.Usage, at, started time.Time) Used {
	d := Used{Memory: -1}
	if u.CPUTime >= 0 {
		d.CPUKnown = true
		switch {
		case !m.read || m.cpu < 0 || !u.Since.Equal(m.since):
			// The kernel's first reading, or its count started again
			// (a restart): all of it is new.
			d.CPU = u.CPUTime
		case u.CPUTime >= m.cpu:
			d.CPU = u.CPUTime - m.cpu
		case u.Since.IsZero():
			// A backend that does not say when its count began went
			// back: it started again.
			d.CPU = u.CPUTime
		default:
			// The same count went back, which it cannot: nothing is
			// added, and the previous reading stays the base.
			u.CPUTime = m.cpu
		}
	}
	if u.MemoryBytes >= 0 {
		d.Memory = u.MemoryBytes
		from, prev := m.at, m.mem
		if !m.read || prev < 0 {
			from, prev = started, 0
		}
		if dt := at.Sub(from); dt > 0 {
			d.MemoryByteSeconds = float64(prev+u.MemoryBytes) / 2 * dt.Seconds()
		}
	}
	m.read, m.at, m.since, m.cpu, m.mem = true, at, u.Since, u.CPUTime, u.MemoryBytes
	return d
}

// OnUsed sets what is told what each run's kernels use (nil: nobody,
// and nothing is read). Set it once, before the manager serves runs. fn
// runs on the goroutine that read the kernel (a call's, the reaper's, a
// stop's) and must not block for long.
func (m *Manager) OnUsed(fn func(ctx context.Context, run runid.ID, u Used)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = fn
}

// Meter reads the run's live kernel now and hands what it used since its
// previous reading to OnUsed: a step's end, or a restart's start. A run
// without a live kernel reads nothing. A reading that fails is logged and
// skipped; it never fails the caller.
func (m *Manager) Meter(ctx context.Context, run runid.ID) {
	if s := m.Peek(run); s != nil {
		m.meter(ctx, run, s, false)
	}
}

// MeterAll reads every live kernel, as Meter.
func (m *Manager) MeterAll(ctx context.Context) {
	for _, k := range m.List() {
		m.Meter(ctx, k.Run)
	}
}

// meter reads s's kernel (a Meter's Sample) and hands what it used to
// OnUsed; final marks the kernel's last reading, before the manager stops
// it or lets go of it, after which nothing of it counts. A kernel that
// cannot be read is handed over with nothing known, so what the run's
// accounting folds beside the kernel (its egress) still is.
func (m *Manager) meter(ctx context.Context, run runid.ID, s *Session, final bool) {
	m.mu.Lock()
	fn := m.used
	m.mu.Unlock()
	if fn == nil {
		return
	}
	s.meter.mu.Lock()
	if s.meter.final {
		s.meter.mu.Unlock()
		return
	}
	d := Used{Memory: -1}
	if mk, ok := s.Kernel.(sandbox.Meter); ok {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), meterTimeout)
		u, err := mk.Sample(rctx)
		cancel()
		switch {
		case err == nil:
			d = s.meter.fold(u, time.Now(), s.Started)
		case errors.Is(err, sandbox.ErrClosed):
			m.log.DebugContext(ctx, "read what a kernel used: it stopped", "run", run)
		default:
			m.log.WarnContext(ctx, "read what a kernel used; skipped until its next reading", "run", run, "err", err)
		}
	}
	s.meter.final = s.meter.final || final
	s.meter.mu.Unlock()
	fn(ctx, run, d)
}
