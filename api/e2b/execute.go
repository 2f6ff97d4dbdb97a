package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// DefaultContext is the id of the one code context a sandbox has: its run's
// kernel. Further contexts (their own interpreters) need the sandbox seam;
// see contextCreate.
const DefaultContext = "default"

// keepalive is how often /execute writes a keepalive line while a cell
// runs, as E2B's server does, so that a client that went away is noticed.
const keepalive = 5 * time.Second

// executeBody is the body of POST /execute (docs/e2b-protocol.md §8).
type executeBody struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// contextJSON is a code context as the SDKs read it.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func defaultContext() contextJSON {
	return contextJSON{ID: DefaultContext, Language: "python", Cwd: Home}
}

// execute is runCode: one sandbox.exec, answered as E2B's JSON lines. The
// headers go out before the cell runs, because the SDK's request timeout
// runs until they arrive (docs/e2b-protocol.md §4); keepalive lines follow
// while it runs. The cell's output is sent when it ends: streaming it as it
// is printed needs the orchestrator's output events (the sandbox seam).
func (s *Server) execute(w http.ResponseWriter, r *http.Request) error {
	sb := sandboxOf(r.Context())
	var in executeBody
	if err := s.decodeLoose(w, r, &in, false); err != nil {
		return err
	}
	if in.Code == nil {
		return fault.New(fault.BadInput, "code is missing", "send {\"code\": \"...\"}")
	}
	if in.ContextID != "" && in.Language != "" {
		return fault.New(fault.BadInput, "only one of context_id and language may be given", "send the context, or the language, not both")
	}
	if in.ContextID != "" && in.ContextID != DefaultContext {
		return fault.New(fault.NotFound, fmt.Sprintf("context %q not found", in.ContextID), "listCodeContexts shows the sandbox's contexts")
	}
	switch strings.ToLower(strings.TrimSpace(in.Language)) {
	case "", "python", "py":
	default:
		return fault.New(fault.Unsupported, fmt.Sprintf("language %q is not supported: Triad's kernels run Python", in.Language), "omit language, or send python")
	}
	if err := validEnvs(in.EnvVars); err != nil {
		return err
	}
	code := *in.Code
	if len(sb.Envs) > 0 || len(in.EnvVars) > 0 {
		var err error
		if code, err = withEnvs(sb.Envs, in.EnvVars, code); err != nil {
			return err
		}
	}
	ctx := r.Context()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	lw := &lineWriter{w: w, rc: http.NewResponseController(w)}
	lw.flush()

	// The cell has no deadline of its own beyond the server's maximum: the
	// SDK's timeoutMs is never sent, it aborts the request, and a request
	// that ends interrupts the cell (docs/e2b-protocol.md §4).
	type result struct {
		out wire.ExecResponse
		err error
	}
	resc := make(chan result, 1)
	go func() {
		out, err := s.c.Core.Exec(ctx, sb.ID, wire.ExecRequest{Code: code, TimeoutS: seconds(24 * time.Hour)})
		resc <- result{out, err}
	}()
	t := time.NewTicker(keepalive)
	defer t.Stop()
	var res result
wait:
	for {
		select {
		case <-t.C:
			lw.line(map[string]string{"type": "keepalive"})
		case res = <-resc:
			break wait
		}
	}
	if res.err != nil {
		fe, _ := classify(res.err)
		lw.line(errorLine{Type: "error", Name: string(fe.Kind), Value: sdkMessage(fe), Traceback: ""})
		lw.line(map[string]string{"type": "end_of_execution"})
		return nil
	}
	s.writeExecution(ctx, lw, res.out)
	if len(in.EnvVars) > 0 {
		s.resetEnvs(context.WithoutCancel(ctx), sb, in.EnvVars)
	}
	return nil
}

// lineWriter writes JSON lines and flushes each.
type lineWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	err error
}

func (l *lineWriter) line(v any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		l.err = err
		return
	}
	if _, err := l.w.Write(append(b, '\n')); err != nil {
		l.err = err
		return
	}
	l.flushLocked()
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
}

func (l *lineWriter) flushLocked() {
	if err := l.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		l.err = err
	}
}

type errorLine struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// writeExecution sends a finished cell as E2B's lines: its count, its
// streams, its display results, its main result, its error.
func (s *Server) writeExecution(ctx context.Context, lw *lineWriter, out wire.ExecResponse) {
	lw.line(map[string]any{"type": "number_of_executions", "execution_count": out.ExecutionCount})
	s.writeStream(ctx, lw, "stdout", out.Stdout, out.StdoutFile)
	s.writeStream(ctx, lw, "stderr", out.Stderr, out.StderrFile)
	for _, b := range out.Display {
		lw.line(s.result(ctx, b, false))
	}
	if out.Result != nil {
		lw.line(s.result(ctx, *out.Result, true))
	}
	if e := out.Error; e != nil {
		name, value := e.Ename, e.Evalue
		if name == "" {
			name, value = e.Kind, e.Message
		}
		if out.Kernel.Restarted && e.Kind != "" {
			value += " (" + e.Suggestion + ")"
		}
		lw.line(errorLine{Type: "error", Name: name, Value: value, Traceback: strings.Join(e.Traceback, "\n")})
	} else if out.Kernel.Restarted {
		// State lost on a restart is reported, never silent.
		lw.line(map[string]string{"type": "stderr", "text": "[triad] the kernel was restarted during this call: variables from earlier cells are gone\n",
			"timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	}
	lw.line(map[string]string{"type": "end_of_execution"})
}

// writeStream sends a stream's text, reading the full text back from its
// run file when the answer carried it capped.
func (s *Server) writeStream(ctx context.Context, lw *lineWriter, name, text string, full *wire.FileRef) {
	send := func(t string) {
		if t != "" {
			lw.line(map[string]string{"type": name, "text": t, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
		}
	}
	if full == nil {
		send(text)
		return
	}
	rd, err := s.c.Blobs.OpenBlob(ctx, full.SHA256)
	if err != nil {
		s.log.ErrorContext(ctx, "read full stream back", "path", full.Path, "err", err)
		send(text)
		return
	}
	defer rd.Close()
	buf := make([]byte, 64<<10)
	var carry []byte
	for {
		n, err := rd.Read(buf)
		b := append(carry, buf[:n]...)
		cut := len(b)
		if err == nil {
			// Keep an incomplete trailing rune for the next chunk, so
			// each line is valid UTF-8.
			i := len(b) - 1
			for i >= 0 && i >= len(b)-utf8.UTFMax && !utf8.RuneStart(b[i]) {
				i--
			}
			if i >= 0 && !utf8.FullRune(b[i:]) {
				cut = i
			}
		}
		send(string(b[:cut]))
		carry = append([]byte(nil), b[cut:]...)
		if err != nil {
			return
		}
	}
}

// mimeKeys maps Jupyter MIME types to E2B result fields
// (docs/e2b-protocol.md §8).
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}

// base64MIME are the types E2B carries as base64; svg is text.
var base64MIME = map[string]bool{"image/png": true, "image/jpeg": true, "application/pdf": true, "image/gif": true}

// result turns a Triad bundle into an E2B result line. Images Triad stored
// as run files are read back and inlined as the kernel produced them.
func (s *Server) result(ctx context.Context, b wire.Bundle, main bool) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	mimes := make([]string, 0, len(b.Data))
	for m := range b.Data {
		mimes = append(mimes, m)
	}
	sort.Strings(mimes)
	for _, m := range mimes {
		if m == commandMIME {
			continue
		}
		v := s.inline(ctx, m, b.Data[m])
		if m == "text/plain" {
			if t, ok := v.(string); ok && len(t) >= 2 && (t[0] == '\'' && t[len(t)-1] == '\'' || t[0] == '"' && t[len(t)-1] == '"') {
				v = t[1 : len(t)-1] // as E2B's server does
			}
		}
		if k, ok := mimeKeys[m]; ok {
			out[k] = v
		} else {
			extra[m] = v
		}
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// inline returns a bundle value as E2B carries it: an image reference is
// replaced by the image's bytes (base64, or text for svg).
func (s *Server) inline(ctx context.Context, mime string, v any) any {
	ref, ok := v.(wire.FileRef)
	if !ok {
		return v
	}
	b, err := s.readBlob(ctx, ref.SHA256)
	if err != nil {
		s.log.ErrorContext(ctx, "read image back for an E2B result", "path", ref.Path, "err", err)
		return v
	}
	if base64MIME[mime] {
		return base64.StdEncoding.EncodeToString(b)
	}
	return string(b)
}

func (s *Server) readBlob(ctx context.Context, d tmpfs.Digest) ([]byte, error) {
	rd, err := s.c.Blobs.OpenBlob(ctx, d)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return io.ReadAll(rd)
}

// withEnvs prefixes code with the sandbox's and the call's environment
// variables. The sandbox's are set once per kernel (a marker survives until
// the kernel restarts), the call's every time; resetEnvs undoes those after
// the cell. The first line is a comment that repeats the cell's own first
// line, so the journal's code summary shows the cell and never a value.
func withEnvs(sandbox, call map[string]string, code string) (string, error) {
	sj, err := pyJSON(sandbox)
	if err != nil {
		return "", err
	}
	cj, err := pyJSON(call)
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(code), "\n")
	first = shorten(first, 80)
	return "# " + first + "  [e2b: environment variables set first, values not journaled]\n" +
		"exec(" + pyStr(fmt.Sprintf(envPrelude, sj, cj)) + ")\n" + code, nil
}

// envPrelude is run by exec so that the cell's own code keeps its line
// count short of one (the exec line) and no helper name leaks.
const envPrelude = `import json as __e2b_json, os as __e2b_os
if not globals().get("__e2b_envs_set"):
    __e2b_os.environ.update(__e2b_json.loads(%s))
    __e2b_envs_set = True
__e2b_os.environ.update(__e2b_json.loads(%s))
del __e2b_json, __e2b_os`

// pyJSON returns m as JSON inside a Python string literal.
func pyJSON(m map[string]string) (string, error) {
	if m == nil {
		m = map[string]string{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	return pyStr(string(b)), nil
}

// pyStr quotes s as a Python string literal: a JSON string is one (Go
// escapes every control character, and <, > and & as \u escapes, all of
// which Python reads the same way).
func pyStr(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// resetEnvs restores, after a cell, the variables the call set: to the
// sandbox's value, or unset. It is its own sandbox.exec, as E2B's server
// resets them in a separate execution.
func (s *Server) resetEnvs(ctx context.Context, sb Sandbox, call map[string]string) {
	restore := map[string]string{}
	var unset []string
	for k := range call {
		if v, ok := sb.Envs[k]; ok {
			restore[k] = v
		} else {
			unset = append(unset, k)
		}
	}
	rj, err := pyJSON(restore)
	if err != nil {
		return
	}
	uj, err := json.Marshal(unset)
	if err != nil {
		return
	}
	code := "# e2b: reset this call's environment variables\n" +
		"exec(" + pyStr(fmt.Sprintf(envReset, rj, uj)) + ")\n"
	if _, err := s.c.Core.Exec(ctx, sb.ID, wire.ExecRequest{Code: code}); err != nil {
		s.log.ErrorContext(ctx, "reset per-call environment variables", "sandbox", sb.ID, "err", err)
	}
}

const envReset = `import json as __e2b_json, os as __e2b_os
__e2b_os.environ.update(__e2b_json.loads(%s))
for __e2b_k in %s:
    __e2b_os.environ.pop(__e2b_k, None)
del __e2b_json, __e2b_os`

func (s *Server) contextsList(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, []contextJSON{defaultContext()})
}

// contextCreate answers createCodeContext. A second context is a second
// interpreter in the run's container, which the orchestrator cannot start
// yet; the default one is returned when that is what was asked for.
func (s *Server) contextCreate(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := s.decodeLoose(w, r, &in, true); err != nil {
		return err
	}
	return statusError{http.StatusNotImplemented, fault.New(fault.Unsupported,
		"Triad runs one interpreter per sandbox for now: more code contexts come with the sandbox seam (issue 14)",
		"run code without a context (the default one), or create another sandbox for separate variables")}
}

func contextID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if id != DefaultContext {
		return id, fault.New(fault.NotFound, fmt.Sprintf("context %q not found", id), "listCodeContexts shows the sandbox's contexts")
	}
	return id, nil
}

// contextRestart restarts the run's kernel: its variables go, its files
// stay.
func (s *Server) contextRestart(w http.ResponseWriter, r *http.Request) error {
	if _, err := contextID(r); err != nil {
		return err
	}
	if err := s.c.Core.Restart(r.Context(), sandboxOf(r.Context()).ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) contextRemove(w http.ResponseWriter, r *http.Request) error {
	if _, err := contextID(r); err != nil {
		return err
	}
	return fault.New(fault.BadInput, "the default context cannot be removed: it is the sandbox's kernel", "kill the sandbox to end it")
}

// shorten cuts s to at most n bytes on a rune boundary, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// seconds is d as the wire's optional timeout_s.
func seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}
