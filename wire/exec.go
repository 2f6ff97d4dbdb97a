package wire

import (
	"encoding/json"
	"time"
)

// ExecRequest is sandbox.exec's input.
type ExecRequest struct {
	// Code is the cell's source in its language, or for a bash command
	// the script bash runs (bash -l -c).
	Code string `json:"code"`
	// Language is the cell's language: "python" (the default when absent,
	// or the language of the context named), "r", "javascript",
	// "typescript" or "bash". Each runs in a Jupyter kernel in the run's
	// sandbox, under the same jail and limits as Python: R's IRkernel,
	// Deno's kernel for JavaScript and TypeScript, a bash kernel. A
	// language other than Python runs in the run's default interpreter of
	// that language (made on first use, its variables kept from cell to
	// cell) unless context names one of its contexts. "bash" without a
	// context is a command instead: `bash -l -c code` in the run's kernel
	// container, with env and cwd, answering its exit code; with context
	// "bash" it runs in the run's bash kernel. Languages other than Python
	// need a backend with kernels for them (docker); the others answer
	// unsupported.
	Language string `json:"language,omitempty"`
	// Context names the interpreter that runs the cell: empty is the
	// run's kernel (Python) or the language's default interpreter; an id
	// from sandbox.context is that code context (of its own language); a
	// language's name ("python", "r", "javascript", "typescript", "bash")
	// is that language's default interpreter.
	Context string `json:"context,omitempty"`
	// Env are environment variables for a bash command, added to the
	// sandbox's. Bash commands only: a cell sets its environment itself.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is where a bash command starts: a run path (a directory of the
	// run's files), empty for their root. Bash only.
	Cwd     string   `json:"cwd,omitempty"`
	FilesIn []FileIn `json:"files_in,omitempty"`
	// TimeoutS is the cell's deadline in seconds: absent takes the server's
	// default; present must be positive, and values over the server's
	// maximum are capped to it.
	TimeoutS *float64 `json:"timeout_s,omitempty"`
}

// FileIn copies a run file (Path) or a blob ("sha256:<hex>", one some run
// of the caller's tenant holds) into the working directory as Name before
// the cell runs.
type FileIn struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ExecResponse is sandbox.exec's answer.
type ExecResponse struct {
	OK     bool   `json:"ok"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Display are the cell's display_data bundles. Images, charts and
	// data (ChartMIME, DataMIME) are stored as run files and appear as
	// FileRefs.
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
	// ExitCode is a bash command's exit status (128+N when signal N ended
	// it); absent for Python cells.
	ExitCode *int `json:"exit_code,omitempty"`
	// BackgroundThreads names the threads the run's cells started that
	// were still running when this cell returned (Docker; wasm has no
	// threads). Triad does not wait for them, and the cell's timeout
	// does not stop them. Files they write later appear in the next
	// exec's files_out; what they print after their cell returned is
	// dropped, and what they display goes with the exec running at the
	// time (dropped while none runs).
	BackgroundThreads []string `json:"background_threads,omitempty"`
}

// The languages of ExecRequest and Context.
const (
	LanguagePython     = "python"
	LanguageBash       = "bash"
	LanguageR          = "r"
	LanguageJavaScript = "javascript"
	LanguageTypeScript = "typescript"
)

// Languages are the languages of ExecRequest, Python first.
var Languages = []string{LanguagePython, LanguageR, LanguageJavaScript, LanguageTypeScript, LanguageBash}

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

// The MIME types of Triad's own rich displays, which Python kernels add
// beside a figure's PNG and a DataFrame's HTML: a matplotlib figure as
// structured chart data (type line, scatter, bar, pie, box_and_whisker,
// superchart or unknown, with titles, labels, units, ticks, scales and
// elements, in E2B's schema), and a pandas DataFrame as {column: [values]}.
// In an ExecResponse each is stored as a JSON run file and given as a
// FileRef, like an image; a streamed ExecEvent carries it inline.
const (
	ChartMIME = "application/vnd.triad.chart+json"
	DataMIME  = "application/vnd.triad.data+json"
)

// Bundle is a MIME bundle as returned to callers: text types as strings,
// JSON types as JSON, and images as a FileRef to the stored bytes.
type Bundle struct {
	Data     map[string]any             `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// ExecError says why a cell did not succeed, with a suggestion for the
// caller. Kind is one of the sandbox's cell error kinds (execution_error,
// timeout, kernel_died, output_limit, interrupted), or exit_code for a bash
// command that failed.
type ExecError struct {
	Kind       string   `json:"kind"`
	Ename      string   `json:"ename,omitempty"`
	Evalue     string   `json:"evalue,omitempty"`
	Traceback  []string `json:"traceback,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Message    string   `json:"message"`
	Suggestion string   `json:"suggestion"`
}

// ExecEvent is one piece of a running cell's output, streamed before the
// answer (POST /sandbox/exec with Accept: text/event-stream, MCP progress,
// E2B's runCode callbacks). Type is one of the Event constants; Text is a
// stdout or stderr chunk; Bundle is a display or result bundle as the
// kernel sent it (images as base64, SVG as text, text capped). The final
// answer, an ExecResponse, stores images as run files instead.
type ExecEvent struct {
	Type   string  `json:"type"`
	Text   string  `json:"text,omitempty"`
	Bundle *Bundle `json:"bundle,omitempty"`
}

// The types of ExecEvent.
const (
	EventStdout  = "stdout"
	EventStderr  = "stderr"
	EventDisplay = "display"
	EventResult  = "result"
	// EventClear says the cell cleared its displayed output.
	EventClear = "clear"
)

// The kinds of ExecError.
const (
	CellExecution   = "execution_error" // the cell raised
	CellTimeout     = "timeout"         // the cell ran past its deadline
	CellKernelDied  = "kernel_died"     // the interpreter went away (OOM, os._exit, a protocol violation)
	CellOutputLimit = "output_limit"    // the cell's output passed the per-cell limit
	CellInterrupted = "interrupted"     // the caller hung up and the cell was interrupted
	// CellExitCode is a bash command that exited with a non-zero status
	// (ExecResponse.ExitCode).
	CellExitCode = "exit_code"
)

// Context is a code context of a run: an interpreter of its own (its own
// variables, its own current directory) in the run's sandbox, beside the
// run's kernel. ExecRequest.Context names it.
type Context struct {
	ID string `json:"id"`
	// Language is its interpreter's: one of Languages.
	Language string `json:"language"`
	// Cwd is where its cells start: a directory of the run's files, ""
	// for their root.
	Cwd     string    `json:"cwd"`
	Created time.Time `json:"created"`
}

// RestartResponse is sandbox.restart's answer.
type RestartResponse struct {
	OK     bool          `json:"ok"`
	Kernel RestartKernel `json:"kernel"`
}

// RestartKernel is the kernel part of RestartResponse.
type RestartKernel struct {
	Restarted bool `json:"restarted"`
}
