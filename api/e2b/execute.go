package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

// DefaultContext is the id of a sandbox's default code context: its run's
// kernel. The contexts createCodeContext makes are the run's own
// (orchestrator.NewContext), each its own interpreter in the run's
// container.
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

// execute is runCode: one sandbox.exec whose output goes out as E2B's JSON
// lines while the cell runs. The headers go out before the cell starts,
// because the SDK's request timeout runs until they arrive
// (docs/e2b-protocol.md §4); stdout, stderr and results follow as the
// kernel sends them, keepalive lines while it is quiet, and the count, the
// error and the end when it ends. A client that goes away (the SDK's
// timeoutMs aborts the request) interrupts the cell, and the kernel keeps
// its state if the cell stops.
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
	lang, err := language(in.Language)
	if err != nil {
		return err
	}
	// A language other than Python runs in the run's default interpreter
	// of it, whose context id is the language (wire.ExecRequest.Context).
	ctxID := ""
	if lang != wire.LanguagePython {
		ctxID = lang
	}
	switch {
	case in.ContextID == "" || in.ContextID == DefaultContext:
	case slices.Contains(s.c.Core.Languages(), in.ContextID):
		// A language's default context (listCodeContexts shows them).
		ctxID, lang = in.ContextID, in.ContextID
		if lang == wire.LanguagePython {
			ctxID = ""
		}
	default:
		c, ok := s.context(sb.ID, in.ContextID)
		if !ok {
			return contextNotFound(in.ContextID)
		}
		ctxID, lang = c.ID, c.Language
	}
	if err := validEnvs(in.EnvVars); err != nil {
		return err
	}
	code := *in.Code
	// The sandbox's envs are set once per interpreter, the call's for this
	// cell only; their values go to the kernel in Triad's setup cells, so
	// neither the cell's kept source nor its journal ever holds them.
	env := orchestrator.WithEnv(orchestrator.CellEnv{Kernel: sb.Envs, Call: in.EnvVars})
	// A kill or a pause of the sandbox ends the call (interrupting the
	// cell), and the stream breaks off as E2B's does when its sandbox
	// goes: the SDK's health check then finds the sandbox gone and
	// raises its TimeoutError, "the sandbox was killed while the request
	// was in progress".
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ex, ended := s.procs.addExec(sb.ID, cancel)
	defer ended()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	lw := &lineWriter{w: w, rc: http.NewResponseController(w)}
	lw.flush()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				lw.line(map[string]string{"type": "keepalive"})
			}
		}
	}()

	// The cell has no deadline of its own beyond the server's maximum: the
	// SDK's timeoutMs is never sent, it aborts the request, and a request
	// that ends interrupts the cell (docs/e2b-protocol.md §4).
	out, err := s.c.Core.ExecStream(ctx, sb.ID, wire.ExecRequest{Code: code, Language: lang, Context: ctxID, TimeoutS: seconds(24 * time.Hour)},
		func(e orchestrator.ExecEvent) {
			switch e.Type {
			case wire.EventStdout, wire.EventStderr:
				lw.line(streamLine{Type: e.Type, Text: e.Text, Timestamp: nowUTC().Format(time.RFC3339Nano)})
			case wire.EventDisplay:
				lw.line(liveResult(e.Data, false))
			case wire.EventResult:
				lw.line(liveResult(e.Data, true))
			}
		}, env)
	if ex.gone.Load() {
		panic(http.ErrAbortHandler)
	}
	if err != nil {
		fe, _ := classify(err)
		lw.line(errorLine{Type: "error", Name: string(fe.Kind), Value: sdkMessage(fe), Traceback: ""})
		lw.line(map[string]string{"type": "end_of_execution"})
		return nil
	}
	writeEnd(lw, out)
	return nil
}

// language maps the SDKs' language names onto Triad's (wire.Languages).
// Java has no kernel here: none can be built offline (docs/e2b.md).
func language(name string) (string, error) {
	switch n := strings.ToLower(strings.TrimSpace(name)); n {
	case "", "python", "py", "python3":
		return wire.LanguagePython, nil
	case "js", "javascript", "node", "deno":
		return wire.LanguageJavaScript, nil
	case "ts", "typescript":
		return wire.LanguageTypeScript, nil
	case "r":
		return wire.LanguageR, nil
	case "bash", "sh", "shell":
		return wire.LanguageBash, nil
	case "java":
		return "", fault.New(fault.Unsupported, "language \"java\" is not supported: Triad's sandbox image has no Java kernel (none can be built without Maven Central)",
			"run the code in python, js, ts, r or bash")
	}
	return "", fault.New(fault.Unsupported, fmt.Sprintf("language %q is not supported", name),
		"send python, js, ts, r or bash")
}

// lineWriter writes JSON lines and flushes each. It is safe for
// concurrent use (the cell's output and the keepalive ticker); after a
// failed write it writes nothing more.
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

type streamLine struct {
	Type      string `json:"type"`
	Text      string `json:"text"`
	Timestamp string `json:"timestamp"`
}

type errorLine struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// writeEnd sends what a finished cell's answer adds to what streamed: its
// count, its error, a kernel restart (state lost is reported, never
// silent) and the end.
func writeEnd(lw *lineWriter, out wire.ExecResponse) {
	lw.line(map[string]any{"type": "number_of_executions", "execution_count": out.ExecutionCount})
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
		lw.line(streamLine{Type: "stderr", Text: "[triad] the kernel was restarted during this call: variables from earlier cells are gone\n",
			Timestamp: nowUTC().Format(time.RFC3339Nano)})
	}
	lw.line(map[string]string{"type": "end_of_execution"})
}

// mimeKeys maps Jupyter MIME types to E2B result fields
// (docs/e2b-protocol.md §8).
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
	// Triad's own chart and data displays (sandbox/image/python/triad_display.py).
	wire.ChartMIME: "chart", wire.DataMIME: "data",
}

// liveResult turns a kernel's bundle data into an E2B result line, each
// value as the kernel produced it: text and base64 images as strings, JSON
// types as JSON. Types E2B has no field for go in extra.
func liveResult(data map[string]json.RawMessage, main bool) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for m, raw := range data {
		var v any = raw
		var str string
		if json.Unmarshal(raw, &str) == nil {
			v = str
			if m == "text/plain" && len(str) >= 2 && (str[0] == '\'' && str[len(str)-1] == '\'' || str[0] == '"' && str[len(str)-1] == '"') {
				v = str[1 : len(str)-1] // as E2B's server does
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

// context returns the sandbox's run's code context id.
func (s *Server) context(run runid.ID, id string) (wire.Context, bool) {
	for _, c := range s.c.Core.Contexts(run) {
		if c.ID == id {
			return c, true
		}
	}
	return wire.Context{}, false
}

// contextNotFound is the 404 the code interpreter SDK reads as its
// NotFoundError (docs/e2b-protocol.md §3).
func contextNotFound(id string) error {
	return fault.New(fault.NotFound, fmt.Sprintf("context %q not found", id), "listCodeContexts shows the sandbox's contexts; createCodeContext makes one")
}

func toContextJSON(c wire.Context) contextJSON {
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: sdkPath(c.Cwd)}
}

// contextsList is listCodeContexts: the default context (the run's
// kernel), each other language's default context (its id is the
// language's name), and the run's own.
func (s *Server) contextsList(w http.ResponseWriter, r *http.Request) error {
	out := []contextJSON{defaultContext()}
	for _, l := range s.c.Core.Languages()[1:] {
		out = append(out, contextJSON{ID: l, Language: l, Cwd: Home})
	}
	for _, c := range s.c.Core.Contexts(sandboxOf(r.Context()).ID) {
		out = append(out, toContextJSON(c))
	}
	return writeJSON(w, http.StatusOK, out)
}

// contextCreate is createCodeContext: an interpreter of its own in the
// run's container, whose cells start in cwd (made if missing).
func (s *Server) contextCreate(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := s.decodeLoose(w, r, &in, true); err != nil {
		return err
	}
	lang, err := language(in.Language)
	if err != nil {
		return err
	}
	cwd := ""
	if in.Cwd != "" {
		p, err := runPath(in.Cwd)
		if err != nil {
			return err
		}
		cwd = p
	}
	c, err := s.c.Core.NewContext(r.Context(), sandboxOf(r.Context()).ID, cwd, lang)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toContextJSON(c))
}

// contextRestart is restartCodeContext: the context's variables go, its
// files and the other contexts' variables stay.
func (s *Server) contextRestart(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id == DefaultContext {
		id = ""
	}
	if err := s.c.Core.RestartContext(r.Context(), sandboxOf(r.Context()).ID, id); err != nil {
		if fault.From(err).Kind == fault.NotFound {
			return contextNotFound(r.PathValue("id"))
		}
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// contextRemove is removeCodeContext.
func (s *Server) contextRemove(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id == DefaultContext {
		return fault.New(fault.BadInput, "the default context cannot be removed: it is the sandbox's kernel", "kill the sandbox to end it")
	}
	if err := s.c.Core.RemoveContext(r.Context(), sandboxOf(r.Context()).ID, id); err != nil {
		if fault.From(err).Kind == fault.NotFound {
			return contextNotFound(id)
		}
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// seconds is d as the wire's optional timeout_s.
func seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}
