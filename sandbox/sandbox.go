// Package sandbox defines the seam between Triad and the kernels that run untrusted Python cells.
//
// A Backend starts Kernels; a Kernel is one persistent interpreter bound to a
// working directory on the host. Implementations live in sub-packages named
// for what they wrap: sandbox/docker (ipykernel in a jailed container) and
// sandbox/wasm (CPython compiled to WASI, run by wazero inside the binary).
//
// Backends know nothing about runs' content-addressed files: the caller
// materialises a run's files into Kernel.WorkDir before a cell and harvests
// what the cell wrote afterwards, so files_in and files_out behave the same on
// every backend.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Backend starts kernels of one kind.
type Backend interface {
	// Name is the backend's name as reported in exec responses
	// (kernel.backend): "docker" or "wasm".
	Name() string
	// Start returns a ready kernel: its interpreter answers and its working
	// directory exists and is empty. Backends with a warm pool hand out a
	// pooled kernel here. ctx bounds the wait only; the kernel outlives it.
	Start(ctx context.Context, spec Spec) (Kernel, error)
	// Close stops every kernel the backend started. It is safe to call twice.
	Close() error
}

// Spec describes the kernel a caller wants.
type Spec struct {
	// Owner labels the kernel (a run id) so that a restarted server can
	// find and remove what an earlier process started.
	Owner string
	// Limits bound the kernel; zero fields take the backend's defaults.
	Limits Limits
}

// Limits are the resource bounds of one kernel. Zero means "backend default".
type Limits struct {
	MemoryBytes int64   // memory, swap included
	CPUs        float64 // CPU share, e.g. 1.0
	Pids        int64   // process/thread count
	DiskBytes   int64   // quota on the working directory
}

// Kernel is one persistent interpreter. Variables survive from one Execute to
// the next until the kernel restarts or dies. Methods are not safe for
// concurrent use; callers serialize cells per run.
type Kernel interface {
	// ID identifies the kernel for logs (a container id, an instance id).
	ID() string
	// WorkDir is the host directory the kernel sees as its working
	// directory. It is the only place a cell can write that outlives the
	// cell, and it may carry a disk quota.
	WorkDir() string
	// Execute runs code and waits for it to finish or for timeout to pass.
	// A cell that fails (an exception, a timeout, a dead kernel) is not an
	// error: it comes back as a Result whose Error says what happened. The
	// returned error is reserved for the kernel being unusable before the
	// cell could run (for example ErrClosed).
	Execute(ctx context.Context, code string, timeout time.Duration) (*Result, error)
	// Restart replaces the interpreter with a fresh one; state is lost, the
	// working directory is kept.
	Restart(ctx context.Context) error
	// Close stops the kernel and releases its resources, including its
	// working directory's mount. The caller copies out files it wants to
	// keep first. Close is safe to call twice.
	Close() error
}

// Result is what a cell produced.
type Result struct {
	// OK is true when the cell ran to completion without an exception.
	OK     bool   `json:"ok"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Display holds display_data bundles in the order they arrived.
	Display []Bundle `json:"display,omitempty"`
	// Value is the execute_result bundle (the cell's last expression), if any.
	Value *Bundle `json:"result,omitempty"`
	// Error is set when OK is false.
	Error *ExecError `json:"error,omitempty"`
	// ExecutionCount is the kernel's execution counter after this cell.
	ExecutionCount int `json:"execution_count"`
	// Restarted is true when the kernel was replaced during this call (a
	// timeout that interrupt could not stop, or a death); state is lost.
	Restarted bool `json:"restarted"`
	// Duration is how long the cell ran, as the backend measured it.
	Duration time.Duration `json:"-"`
}

// Bundle is a Jupyter MIME bundle: data keyed by MIME type, plus metadata.
// Binary types (image/png, image/jpeg) are base64 strings, as on the wire.
type Bundle struct {
	Data     map[string]json.RawMessage `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// ExecError describes why a cell did not succeed.
type ExecError struct {
	// Kind is "execution_error" for an exception raised by the cell,
	// "timeout" when the deadline passed, or "kernel_died" when the
	// interpreter went away (OOM, os._exit, a crash).
	Kind      string   `json:"kind"`
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
	// Reason says why a kernel died, when the backend knows (e.g. "OOMKilled").
	Reason string `json:"reason,omitempty"`
}

// Kinds of ExecError.
const (
	KindExecution  = "execution_error"
	KindTimeout    = "timeout"
	KindKernelDied = "kernel_died"
)

// Errors returned by Backends and Kernels.
var (
	// ErrClosed means the kernel or backend was closed; start a new kernel.
	ErrClosed = errors.New("sandbox: closed")
	// ErrUnavailable means the backend's engine does not answer (no Docker
	// daemon, an image that cannot be built); pick another backend or fix
	// the engine.
	ErrUnavailable = errors.New("sandbox: backend unavailable")
)
