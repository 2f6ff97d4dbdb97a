package wire

import "encoding/json"

// ExecRequest is sandbox.exec's input.
type ExecRequest struct {
	Code string `json:"code"`
	// Language is "python" (the default when absent).
	Language string   `json:"language,omitempty"`
	FilesIn  []FileIn `json:"files_in,omitempty"`
	// TimeoutS is the cell's deadline in seconds: absent takes the server's
	// default; present must be positive, and values over the server's
	// maximum are capped to it.
	TimeoutS *float64 `json:"timeout_s,omitempty"`
}

// FileIn copies a run file (Path) or a blob ("sha256:<hex>") into the
// working directory as Name before the cell runs.
type FileIn struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ExecResponse is sandbox.exec's answer.
type ExecResponse struct {
	OK     bool   `json:"ok"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Display are the cell's display_data bundles. Images are stored as
	// run files and appear as FileRefs.
	Display []Bundle `json:"display"`
	// Result is the execute_result bundle: the value of the last expression.
	Result   *Bundle    `json:"result,omitempty"`
	Error    *ExecError `json:"error,omitempty"`
	FilesOut []FileRef  `json:"files_out"`
	// FilesDeleted are run files the cell removed.
	FilesDeleted []string `json:"files_deleted,omitempty"`
	// FilesRefused are files the cell wrote that were not stored, and why
	// (a file larger than the kernel's disk quota, such as a sparse file
	// whose apparent size is past it).
	FilesRefused   []RefusedFile `json:"files_refused,omitempty"`
	ExecutionCount int           `json:"execution_count"`
	DurationMs     int64         `json:"duration_ms"`
	// Truncated is true when a stream or text output was capped; the full
	// text is in StdoutFile / StderrFile.
	Truncated  bool       `json:"truncated"`
	StdoutFile *FileRef   `json:"stdout_file,omitempty"`
	StderrFile *FileRef   `json:"stderr_file,omitempty"`
	Kernel     KernelInfo `json:"kernel"`
}

// RefusedFile is a file a cell wrote that Triad did not store.
type RefusedFile struct {
	Path string `json:"path"`
	// Size is the file's apparent size.
	Size   int64  `json:"size"`
	Reason string `json:"reason"`
}

// KernelInfo says which kernel ran the cell.
type KernelInfo struct {
	Backend string `json:"backend"`
	// Restarted is true when the kernel was replaced during the call: its
	// variables are gone.
	Restarted bool `json:"restarted"`
}

// Bundle is a MIME bundle as returned to callers: text types as strings,
// JSON types as JSON, and images as a FileRef to the stored bytes.
type Bundle struct {
	Data     map[string]any             `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// ExecError says why a cell did not succeed, with a suggestion for the
// caller. Kind is one of the sandbox's cell error kinds (execution_error,
// timeout, kernel_died, output_limit, interrupted).
type ExecError struct {
	Kind       string   `json:"kind"`
	Ename      string   `json:"ename,omitempty"`
	Evalue     string   `json:"evalue,omitempty"`
	Traceback  []string `json:"traceback,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Message    string   `json:"message"`
	Suggestion string   `json:"suggestion"`
}

// The kinds of ExecError.
const (
	CellExecution   = "execution_error" // the cell raised
	CellTimeout     = "timeout"         // the cell ran past its deadline
	CellKernelDied  = "kernel_died"     // the interpreter went away (OOM, os._exit, a protocol violation)
	CellOutputLimit = "output_limit"    // the cell's output passed the per-cell limit
	CellInterrupted = "interrupted"     // the caller hung up and the cell was interrupted
)

// RestartResponse is sandbox.restart's answer.
type RestartResponse struct {
	OK     bool          `json:"ok"`
	Kernel RestartKernel `json:"kernel"`
}

// RestartKernel is the kernel part of RestartResponse.
type RestartKernel struct {
	Restarted bool `json:"restarted"`
}
