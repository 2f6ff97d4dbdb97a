package wire

import "time"

// SnapshotRequest is POST /runs/{id}/snapshots's optional body.
type SnapshotRequest struct {
	Name string `json:"name,omitempty" maxLength:"200" pattern:"^[A-Za-z0-9][A-Za-z0-9._:/-]*$" doc:"A name for the snapshot, to find it by (E2B's snapshot names); absent means none."`
}

// Snapshot is a snapshot of a run's files: a read-only run of the same
// tenant whose index points at the same blobs (no bytes copied). Kernel
// memory is not kept.
type Snapshot struct {
	ID string `json:"id" doc:"The snapshot: a read-only run id; POST /runs/{id}/fork makes a run from it."`
	// Of is the run it was taken from, and Step the step of that run's
	// journal that took it.
	Of      string    `json:"of" doc:"The run the snapshot was taken from."`
	Step    int       `json:"step" doc:"The step of that run's journal that took it."`
	Name    string    `json:"name,omitempty" doc:"The snapshot's name, if it was given one."`
	Files   int       `json:"files" doc:"How many files it holds."`
	Bytes   int64     `json:"bytes" doc:"What those files hold, in bytes (none copied: the blobs are shared)."`
	Created time.Time `json:"created" doc:"When it was taken."`
	// MemoryKept is always false: a kernel's memory (variables, running
	// processes) is not kept, only files.
	MemoryKept bool   `json:"memory_kept" doc:"Always false: only files are kept; a kernel's variables and processes are not."`
	Note       string `json:"note" doc:"What the snapshot keeps and what it does not."`
}

// ForkRequest is POST /runs/{id}/fork's optional body.
type ForkRequest struct {
	RunID string `json:"run_id,omitempty" format:"run-id" doc:"The new run's id; absent means a fresh one."`
}

// Fork is a new run made from a run or a snapshot: its files point at the
// same blobs (no bytes copied); its kernel starts fresh.
type Fork struct {
	RunID string `json:"run_id" doc:"The new run: send it as X-Run-Id."`
	From  string `json:"from" doc:"The run or snapshot it was forked from."`
	// Step is the last step of From's journal the fork saw (0 for a
	// snapshot, which has no journal of its own, or a run with none).
	Step       int    `json:"step" doc:"The last step of the source's journal the fork has the files of (0 for a snapshot)."`
	Files      int    `json:"files" doc:"How many files the new run starts with."`
	Bytes      int64  `json:"bytes" doc:"What those files hold, in bytes (none copied: the blobs are shared)."`
	MemoryKept bool   `json:"memory_kept" doc:"Always false: the new run's kernel starts fresh; the source's variables and processes are not copied."`
	Note       string `json:"note" doc:"What the fork keeps and what it does not."`
}

// MemoryNote is what a snapshot or a fork says it does not keep.
const MemoryNote = "Kernel memory is not kept: only the run's files are (by reference, no bytes copied); a kernel started from them is fresh, without the source's variables or running processes."
