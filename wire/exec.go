package wire

import (
	"encoding/json"
	"time"
)

// ExecRequest is sandbox.exec's input. Each field's contract (what it
// means, what the server accepts) is in its tags; see schema.go.
type ExecRequest struct {
	Code     string            `json:"code" format:"non-blank" doc:"Source of the cell in its language (the value of its last expression comes back in result), or with language bash the script bash runs (bash -l -c). It must hold something other than white space."`
	Language string            `json:"language,omitempty" enum:"python|r|javascript|typescript|bash" doc:"python (the default, or the language of the context named), r, javascript, typescript or bash. Each runs in a Jupyter kernel in the run's sandbox, under the same jail and limits as Python (R's IRkernel, Deno's kernel for JavaScript and TypeScript, a bash kernel), in the run's default interpreter of that language (made on first use, its variables kept from cell to cell) unless context names one of its contexts. bash without a context is a command instead: bash -l -c code in the run's kernel container, with env and cwd, its exit status coming back as exit_code; with context bash it runs in the run's bash kernel. Languages other than Python, and commands, need a sandbox with them (docker); the others answer unsupported."`
	Context  string            `json:"context,omitempty" doc:"The interpreter that runs the cell: absent is the run's kernel (Python) or the language's default interpreter; the id of a code context of the run (an interpreter of its own language, made through the E2B surface) is that context; a language's name (python, r, javascript, typescript, bash) is that language's default interpreter."`
	Env      map[string]string `json:"env,omitempty" keyPattern:"^[^=\\x00]+$" valuePattern:"^[^\\x00]*$" doc:"Environment variables for a bash command, added to the sandbox's: names without = or NUL, values without NUL. Bash only: a Python cell sets os.environ itself."`
	Cwd      string            `json:"cwd,omitempty" format:"run-dir" doc:"Where a bash command starts: a directory of the run's files, empty for their root. Bash only."`
	FilesIn  []FileIn          `json:"files_in,omitempty" doc:"Files to place in the working directory before the cell runs."`
	TimeoutS *float64          `json:"timeout_s,omitempty" exclusiveMinimum:"0" doc:"The cell's deadline in seconds: absent takes the server's default (60 s); values over the server's maximum are capped to it."`
}

// Conditions implements Conditional: env and cwd are for bash commands
// (a bash cell in the bash kernel is checked by the orchestrator).
func (ExecRequest) Conditions() []Condition {
	return []Condition{
		{Field: "language", Value: LanguageBash, Fields: []string{"env", "cwd"}},
	}
}

// FileIn copies a run file or a blob into the working directory before
// the cell runs.
type FileIn struct {
	Name string `json:"name" format:"run-path" doc:"Where the file appears, relative to the working directory."`
	Path string `json:"path" format:"run-path" doc:"A run file's path, or sha256:<64 lower-case hex digits> for the bytes of a file some run of your tenant holds."`
}

// ExecResponse is sandbox.exec's answer.
type ExecResponse struct {
	OK             bool          `json:"ok" doc:"True when the cell ran to the end without raising (for bash, exited 0)."`
	Stdout         string        `json:"stdout" doc:"Printed output, capped; see truncated and stdout_file."`
	Stderr         string        `json:"stderr" doc:"Error stream output, capped; see truncated and stderr_file."`
	Display        []Bundle      `json:"display" doc:"The cell's display_data bundles in order. Images, charts and data (ChartMIME, DataMIME) are stored as run files and appear as {path, size, sha256}."`
	Result         *Bundle       `json:"result,omitempty" doc:"The value of the cell's last expression as a MIME bundle (data[\"text/plain\"] is its repr)."`
	Error          *ExecError    `json:"error,omitempty" doc:"Why the cell failed: kind (execution_error, timeout, kernel_died, output_limit, interrupted, or exit_code for a failed bash command), ename, evalue, traceback, message and suggestion."`
	FilesOut       []FileRef     `json:"files_out" doc:"Files the cell created or changed in the working directory, now run files."`
	FilesDeleted   []string      `json:"files_deleted,omitempty" doc:"Run files the cell removed."`
	FilesRefused   []RefusedFile `json:"files_refused,omitempty" doc:"Files the cell wrote that were not stored, and why (a file larger than the kernel's disk quota, such as a sparse file whose apparent size is past it)."`
	ExecutionCount int           `json:"execution_count" doc:"The kernel's cell counter."`
	DurationMs     int64         `json:"duration_ms" doc:"How long the cell ran, in milliseconds."`
	Truncated      bool          `json:"truncated" doc:"True when some text was cut at the server's cap; the full text is in stdout_file and stderr_file."`
	StdoutFile     *FileRef      `json:"stdout_file,omitempty" doc:"The full stdout as a run file, when it was truncated."`
	StderrFile     *FileRef      `json:"stderr_file,omitempty" doc:"The full stderr as a run file, when it was truncated."`
	Kernel         KernelInfo    `json:"kernel" doc:"Which backend ran the cell, and whether the kernel was restarted (its variables lost) during the call."`
	ExitCode       *int          `json:"exit_code,omitempty" doc:"A bash command's exit status (128+N when signal N ended it); absent for Python cells."`
	// BackgroundThreads: Docker only; wasm has no threads.
	BackgroundThreads []string `json:"background_threads,omitempty" doc:"The threads the run's cells started that were still running when this cell returned. Triad does not wait for them, and the cell's timeout does not stop them. Files they write later appear in the next exec's files_out; what they print after their cell returned is dropped, and what they display goes with the exec running at the time."`
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
