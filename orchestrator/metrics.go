package orchestrator

import "time"

// Metrics receives what the orchestration path does, for a metrics
// exporter (cmd/triad wires a Prometheus one). Labels are small fixed sets
// (tool names, outcomes, verdicts): never a run id, a path or a key.
type Metrics interface {
	// ToolCall is one finished tool call: its tool, its outcome ("ok",
	// "error" or the error's kind), and how long it took.
	ToolCall(tool, outcome string, d time.Duration)
	// Evaluated is one verdict ("pass", "fail" or "ungraded") and the
	// evaluator's latency.
	Evaluated(verdict string, d time.Duration)
	// Search is one live search: "ok", or the kind of its upstream error.
	Search(outcome string)
	// RunStatus is a run entering a status: "open" for a new run, then a
	// recipe run's queued, running, succeeded or failed.
	RunStatus(status string)
	// QuotaRefused is a call refused by a tenant quota ("kernels",
	// "stored_bytes", "runs_per_hour").
	QuotaRefused(limit string)
	// KernelReclaimed is a tenant's idle kernel reclaimed to start
	// another of its runs' at its kernel quota.
	KernelReclaimed()
	// CellRunning is a cell starting (+1) or ending (-1).
	CellRunning(delta int)
	// TenantUsed is what a tenant's run used since its last reading:
	// CPU seconds and memory byte-seconds where known (zero otherwise),
	// and egress bytes out and in. Labelled by tenant, never by run.
	TenantUsed(tenant string, cpuSeconds, memoryByteSeconds float64, egressOut, egressIn int64)
	// TenantStored is the bytes a tenant's runs store, whenever this
	// process reads or writes its usage record.
	TenantStored(tenant string, bytes int64)
}

// hooks calls Metrics when one is configured.
type hooks struct{ m Metrics }

func (h hooks) toolCall(tool, outcome string, d time.Duration) {
	if h.m != nil {
		h.m.ToolCall(tool, outcome, d)
	}
}

func (h hooks) search(outcome string) {
	if h.m != nil {
		h.m.Search(outcome)
	}
}

func (h hooks) cellRunning(delta int) {
	if h.m != nil {
		h.m.CellRunning(delta)
	}
}
