package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// ExecInput is sandbox.exec's input.
type ExecInput struct {
	Code     string   `json:"code"`
	Language string   `json:"language,omitempty"`
	FilesIn  []FileIn `json:"files_in,omitempty"`
	// TimeoutS is the cell's deadline in seconds; 0 takes the server's
	// default, and values over the server's maximum are capped to it.
	TimeoutS float64 `json:"timeout_s,omitempty"`
}

// FileIn copies a run file (Path) or a blob ("sha256:<hex>") into the
// working directory as Name before the cell runs.
type FileIn struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ExecOutput is sandbox.exec's output.
type ExecOutput struct {
	OK     bool   `json:"ok"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Display are the cell's display_data bundles. Images are stored as
	// run files and appear as {path, sha256, size} references.
	Display []Bundle `json:"display"`
	// Result is the execute_result bundle: the value of the last expression.
	Result   *Bundle    `json:"result,omitempty"`
	Error    *ExecError `json:"error,omitempty"`
	FilesOut []FileRef  `json:"files_out"`
	// FilesDeleted are run files the cell removed.
	FilesDeleted   []string `json:"files_deleted,omitempty"`
	ExecutionCount int      `json:"execution_count"`
	DurationMs     int64    `json:"duration_ms"`
	// Truncated is true when a stream or text output was capped; the full
	// text is in StdoutFile / StderrFile.
	Truncated  bool       `json:"truncated"`
	StdoutFile *FileRef   `json:"stdout_file,omitempty"`
	StderrFile *FileRef   `json:"stderr_file,omitempty"`
	Kernel     KernelInfo `json:"kernel"`
}

// KernelInfo says which kernel ran the cell.
type KernelInfo struct {
	Backend string `json:"backend"`
	// Restarted is true when the kernel was replaced during the call: its
	// variables are gone.
	Restarted bool `json:"restarted"`
}

// Bundle is a MIME bundle as returned to callers.
type Bundle struct {
	Data     map[string]any             `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// ImageRef stands in a Bundle for image bytes stored as a run file.
type ImageRef struct {
	Path   string       `json:"path"`
	SHA256 tmpfs.Digest `json:"sha256"`
	Size   int64        `json:"size"`
}

// ExecError says why a cell did not succeed, with a suggestion for the caller.
type ExecError struct {
	Kind       string   `json:"kind"`
	Ename      string   `json:"ename,omitempty"`
	Evalue     string   `json:"evalue,omitempty"`
	Traceback  []string `json:"traceback,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Message    string   `json:"message"`
	Suggestion string   `json:"suggestion"`
}

// ExecConfig bounds cells.
type ExecConfig struct {
	DefaultTimeout time.Duration // 60 s
	MaxTimeout     time.Duration // 10 min
	// StreamCap caps stdout, stderr and each text output in the answer; the
	// full text is kept as a run file.
	StreamCap int // 64 KiB
}

func (c *ExecConfig) defaults() {
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 60 * time.Second
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 10 * time.Minute
	}
	if c.StreamCap == 0 {
		c.StreamCap = 64 << 10
	}
}

// Kernels returns the kernel manager, or nil when the sandbox is off.
func (o *Orchestrator) Kernels() *kernels.Manager { return o.kernels }

// Exec is sandbox.exec.
func (o *Orchestrator) Exec(ctx context.Context, run runid.ID, in ExecInput) (ExecOutput, error) {
	var out ExecOutput
	if o.kernels == nil {
		return out, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	if err := o.validateExec(&in); err != nil {
		return out, err
	}
	timeout := o.exec.DefaultTimeout
	if in.TimeoutS > 0 {
		timeout = time.Duration(in.TimeoutS * float64(time.Second))
	}
	timeout = min(timeout, o.exec.MaxTimeout)
	inputs := map[string]any{"code": codeSummary(in.Code), "timeout_s": timeout.Seconds()}
	if len(in.FilesIn) > 0 {
		inputs["files_in"] = in.FilesIn
	}
	err := o.call(ctx, run, ToolExec, inputs, func(ctx context.Context, s *Step) error {
		var err error
		out, err = o.exec1(ctx, run, in, timeout, s)
		return err
	})
	return out, err
}

func (o *Orchestrator) validateExec(in *ExecInput) error {
	if strings.TrimSpace(in.Code) == "" {
		return fault.New(fault.BadInput, "code is empty", "send Python source in code")
	}
	if in.Language != "" && in.Language != "python" {
		return fault.Badf("omit language or send \"python\"; it is the only language", "language %q is not supported", in.Language)
	}
	if in.TimeoutS < 0 {
		return fault.Badf("send timeout_s > 0, or omit it for the server default", "timeout_s is %v; it must be positive", in.TimeoutS)
	}
	for i, f := range in.FilesIn {
		n, err := safepath.Clean(f.Name)
		if err != nil {
			return fault.Badf("name is where the file appears in the working directory: a relative path", "files_in[%d].name: %v", i, fault.As(err).Message)
		}
		in.FilesIn[i].Name = n
		if f.Path == "" {
			return fault.Badf("set path to a run file or to sha256:<hex>", "files_in[%d].path is empty", i)
		}
	}
	return nil
}

func (o *Orchestrator) exec1(ctx context.Context, run runid.ID, in ExecInput, timeout time.Duration, s *Step) (ExecOutput, error) {
	out := ExecOutput{Display: []Bundle{}, FilesOut: []FileRef{}, Kernel: KernelInfo{Backend: o.kernels.Backend()}}
	sess, err := o.kernels.Acquire(ctx, run)
	if err != nil {
		return out, sandboxErr(err)
	}
	for i, f := range in.FilesIn {
		src, err := o.resolveFileIn(ctx, run, f.Path)
		if err != nil {
			return out, fault.Wrap(fault.NotFound, err, fmt.Sprintf("files_in[%d]: %s", i, fault.As(err).Message), fault.As(err).Suggestion)
		}
		linked, err := o.store.Link(ctx, run, f.Name, src.SHA256, src.Size)
		if err != nil {
			return out, storeErr(err, run, f.Name)
		}
		if err := sess.Dir.Put(ctx, linked); err != nil {
			return out, fault.Wrap(fault.Internal, err, "copy files_in into the working directory", "retry; if the disk quota is full, delete files first")
		}
	}
	res, err := sess.Kernel.Execute(ctx, in.Code, timeout)
	if err != nil {
		// The kernel was unusable before the cell ran: drop it so the
		// next call starts fresh.
		o.kernels.Drop(run)
		return out, sandboxErr(err)
	}
	ch, herr := sess.Dir.Harvest(ctx)
	for _, f := range ch.Written {
		out.FilesOut = append(out.FilesOut, ref(f))
		s.Artifacts = append(s.Artifacts, f)
	}
	out.FilesDeleted = ch.Deleted
	s.Detail["tampered"] = ch.Tampered
	s.Detail["skipped"] = ch.Skipped
	if herr != nil {
		o.log.ErrorContext(ctx, "harvest working directory", "run", run, "err", herr)
	}
	out.OK = res.OK
	out.ExecutionCount = res.ExecutionCount
	out.DurationMs = res.Duration.Milliseconds()
	out.Kernel.Restarted = res.Restarted
	prefix := fmt.Sprintf("outputs/exec-%04d", res.ExecutionCount)
	if res.ExecutionCount == 0 || res.Restarted {
		prefix = fmt.Sprintf("outputs/exec-%s", time.Now().UTC().Format("20060102T150405.000"))
	}
	keep := func(name string, data []byte) (tmpfs.File, error) {
		f, err := o.store.WriteBytes(ctx, run, prefix+"-"+name, data)
		if err != nil {
			return f, err
		}
		s.Artifacts = append(s.Artifacts, f)
		return f, sess.Dir.Put(ctx, f)
	}
	var trunc bool
	out.Stdout, out.StdoutFile, trunc = o.capStream(res.Stdout, "stdout.txt", keep)
	out.Truncated = out.Truncated || trunc
	out.Stderr, out.StderrFile, trunc = o.capStream(res.Stderr, "stderr.txt", keep)
	out.Truncated = out.Truncated || trunc
	for i, b := range res.Display {
		sb, trunc := o.shapeBundle(b, fmt.Sprintf("display-%d", i+1), keep)
		out.Truncated = out.Truncated || trunc
		out.Display = append(out.Display, sb)
	}
	if res.Value != nil {
		sb, trunc := o.shapeBundle(*res.Value, "result", keep)
		out.Truncated = out.Truncated || trunc
		out.Result = &sb
	}
	if res.Error != nil {
		out.Error = execError(res.Error, timeout)
	}
	s.Detail["backend"] = out.Kernel.Backend
	s.Detail["ok"] = out.OK
	s.Detail["stderr"] = res.Stderr
	s.Detail["error"] = out.Error
	s.Detail["restarted"] = out.Kernel.Restarted
	s.Detail["timeout"] = timeout
	return out, nil
}

// resolveFileIn finds a files_in source: a run path or sha256:<hex>.
func (o *Orchestrator) resolveFileIn(ctx context.Context, run runid.ID, p string) (tmpfs.File, error) {
	if strings.HasPrefix(p, "sha256:") {
		d, err := tmpfs.ParseDigest(p)
		if err != nil {
			return tmpfs.File{}, fault.Wrap(fault.BadInput, err, fmt.Sprintf("%q is not a sha256 reference", p), "use sha256:<64 hex digits>")
		}
		n, err := o.store.Blobs().Stat(ctx, d)
		if err != nil {
			return tmpfs.File{}, fault.Wrap(fault.NotFound, err, fmt.Sprintf("no blob %s", d), "upload the bytes first with tmp.write; blobs exist once written")
		}
		return tmpfs.File{SHA256: d, Size: n}, nil
	}
	f, err := o.store.Stat(ctx, run, p)
	if err != nil {
		return f, storeErr(err, run, p)
	}
	return f, nil
}

func (o *Orchestrator) capStream(text, name string, keep func(string, []byte) (tmpfs.File, error)) (string, *FileRef, bool) {
	if len(text) <= o.exec.StreamCap {
		return text, nil, false
	}
	f, err := keep(name, []byte(text))
	if err != nil {
		o.log.Error("keep full output", "err", err)
		return truncateUTF8(text, o.exec.StreamCap), nil, true
	}
	r := ref(f)
	return truncateUTF8(text, o.exec.StreamCap), &r, true
}

// binaryMIME are the bundle types stored as files instead of inlined.
var binaryMIME = map[string]string{"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg", "application/pdf": "pdf"}

func (o *Orchestrator) shapeBundle(b sandbox.Bundle, name string, keep func(string, []byte) (tmpfs.File, error)) (Bundle, bool) {
	out := Bundle{Data: map[string]any{}, Metadata: b.Metadata}
	truncated := false
	for mime, raw := range b.Data {
		if ext, ok := binaryMIME[mime]; ok {
			var s string
			if err := json.Unmarshal(raw, &s); err == nil {
				data := []byte(s)
				if ext != "svg" {
					if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err == nil {
						data = dec
					}
				}
				if f, err := keep(name+"."+ext, data); err == nil {
					out.Data[mime] = ImageRef{Path: f.Path, SHA256: f.SHA256, Size: f.Size}
					continue
				}
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if len(s) > o.exec.StreamCap {
				out.Data[mime] = truncateUTF8(s, o.exec.StreamCap)
				truncated = true
				continue
			}
			out.Data[mime] = s
			continue
		}
		out.Data[mime] = raw // JSON-valued types (application/json, widgets)
	}
	return out, truncated
}

func execError(e *sandbox.ExecError, timeout time.Duration) *ExecError {
	out := &ExecError{Kind: e.Kind, Ename: e.Ename, Evalue: e.Evalue, Traceback: e.Traceback, Reason: e.Reason}
	switch e.Kind {
	case sandbox.KindTimeout:
		out.Message = fmt.Sprintf("the cell ran past its %s deadline and was interrupted", timeout)
		out.Suggestion = "make the cell faster or split it, or raise timeout_s (up to the server maximum)"
	case sandbox.KindKernelDied:
		out.Message = "the kernel died while running the cell"
		if e.Reason != "" {
			out.Message += " (" + e.Reason + ")"
		}
		out.Suggestion = "the next call gets a fresh kernel with no variables; use less memory (OOMKilled) or avoid os._exit, then re-run the cells that set up state"
	default:
		out.Kind = sandbox.KindExecution
		out.Message = strings.TrimSpace(e.Ename + ": " + e.Evalue)
		out.Suggestion = "fix the code and run the cell again; the traceback shows where it failed"
	}
	return out
}

func sandboxErr(err error) error {
	if fault.As(err) != nil {
		return err
	}
	if errors.Is(err, sandbox.ErrUnavailable) {
		return fault.Wrap(fault.Unavailable, err, "the sandbox backend does not answer",
			"check the Docker engine (docker info) or start triad with --sandbox wasm")
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fault.Wrap(fault.Timeout, err, "the kernel did not become ready in time", "retry the call")
	}
	return fault.Wrap(fault.Unavailable, err, "the sandbox could not run the cell: "+err.Error(), "retry; the next call starts a fresh kernel")
}

// codeSummary shortens code for the journal: its first line and a hash.
func codeSummary(code string) string {
	sum := sha256.Sum256([]byte(code))
	first, _, _ := strings.Cut(strings.TrimSpace(code), "\n")
	if len(first) > 60 {
		first = truncateUTF8(first, 60) + "…"
	}
	lines := strings.Count(strings.TrimRight(code, "\n"), "\n") + 1
	return fmt.Sprintf("%q (%d lines, sha256:%s)", first, lines, hex.EncodeToString(sum[:])[:12])
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Restart is POST /sandbox/restart: the run's kernel starts afresh, its
// files stay.
func (o *Orchestrator) Restart(ctx context.Context, run runid.ID) error {
	if o.kernels == nil {
		return fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	unlock := o.lockRun(run)
	defer unlock()
	sess := o.kernels.Peek(run)
	if sess == nil {
		return nil // nothing running: the next exec starts fresh anyway
	}
	if err := sess.Kernel.Restart(ctx); err != nil {
		o.kernels.Drop(run)
		return sandboxErr(err)
	}
	return nil
}

// Stop ends the run's kernel, if one is live: its files stay in the store
// and the next exec starts a fresh kernel over them. Surfaces whose
// sessions time out (the E2B surface) call it.
func (o *Orchestrator) Stop(_ context.Context, run runid.ID) error {
	if o.kernels == nil {
		return nil
	}
	unlock := o.lockRun(run)
	defer unlock()
	o.kernels.Drop(run)
	return nil
}
