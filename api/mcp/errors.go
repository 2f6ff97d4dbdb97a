package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// toolError is a failed call as the SDK carries it to the result: its
// Error text is the JSON error body, which the SDK puts in the result's
// content with isError set. The cause stays out of the text (it may name
// host paths), as fault.Error promises.
type toolError struct {
	fe   *fault.Error
	text string
}

func (e *toolError) Error() string { return e.text }
func (e *toolError) Unwrap() error { return e.fe }

// toolErr is the one place a failed call becomes a tool result's error:
// it logs the failure (at error level only for the kinds that mean the
// server, not the caller, is at fault) and returns the error the SDK turns
// into content with isError.
func (s *Server) toolErr(ctx context.Context, tool string, err error) error {
	fe := fault.From(err)
	lvl := slog.LevelInfo
	if fault.Status(fe.Kind) >= 500 && fe.Kind != fault.NotConfigured {
		lvl = slog.LevelError
	}
	s.log.Log(ctx, lvl, "mcp tool call failed", "tool", tool, "kind", fe.Kind, "err", err)
	return &toolError{fe: fe, text: wire.ErrorJSON(fe)}
}

// refusedArguments rewrites the error results the SDK makes by itself,
// before any handler runs, when arguments fail the input schema or do not
// decode. Left alone they would be bare Go error text; rewritten, they are
// the same {kind, message, suggestion} body as every other failure.
func (s *Server) refusedArguments(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "tools/call" {
			return res, err
		}
		r, ok := res.(*sdk.CallToolResult)
		if !ok || !r.IsError {
			return res, nil
		}
		cause := r.GetError()
		var te *toolError
		if cause == nil || errors.As(cause, &te) {
			// Our own results: a failed cell (no cause) or an error
			// already in the body's shape.
			return res, nil
		}
		tool := ""
		var args struct {
			RunID *string `json:"run_id"`
		}
		if p, ok := req.GetParams().(*sdk.CallToolParamsRaw); ok {
			tool = p.Name
			_ = json.Unmarshal(p.Arguments, &args) // a body that is no object fails the schema below
		}
		fe := fault.Wrap(fault.BadInput, cause, "the arguments do not fit the tool's input schema: "+cause.Error(),
			"compare the arguments with the tool's inputSchema (tools/list): field names, types and required fields; unknown fields are refused")
		if args.RunID != nil {
			// A malformed run id is invalid_run_id on every surface, as
			// the HTTP API's X-Run-Id is.
			if _, err := runid.Parse(*args.RunID); err != nil {
				fe = fault.As(err)
			}
		}
		s.log.InfoContext(ctx, "mcp tool call refused", "tool", tool, "kind", fe.Kind, "err", cause)
		r.Content = []sdk.Content{&sdk.TextContent{Text: wire.ErrorJSON(fe)}}
		return r, nil
	}
}

// errorBodies turns the plain-text errors the SDK's HTTP transport writes
// (a bad Accept or Content-Type, an unknown session, a body that is not
// JSON-RPC, a refused token) into the error body every other Triad answer
// uses, with the kind the status implies. Everything else, event streams
// included, passes through.
type errorBodies struct {
	http.ResponseWriter
	status int
	msg    bytes.Buffer
}

func (w *errorBodies) WriteHeader(status int) {
	if status >= 400 && w.status == 0 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status = status
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *errorBodies) Write(b []byte) (int, error) {
	if w.status != 0 {
		return w.msg.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes through for event streams.
func (w *errorBodies) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && w.status == 0 {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *errorBodies) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish writes a held error as the error body.
func (w *errorBodies) finish() {
	if w.status == 0 {
		return
	}
	msg := strings.TrimSpace(w.msg.String())
	if msg == "" {
		msg = http.StatusText(w.status)
	}
	kind, sugg := transportKind(w.status)
	h := w.ResponseWriter.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.ResponseWriter.WriteHeader(w.status)
	io.WriteString(w.ResponseWriter, wire.ErrorJSON(fault.New(kind, "MCP transport: "+msg, sugg))+"\n")
}

// transportKind is the kind and advice for a status the transport answers.
func transportKind(status int) (fault.Kind, string) {
	const spec = "speak MCP's streamable HTTP transport (protocol 2025-06-18 or later): POST JSON-RPC with Content-Type: application/json and Accept: application/json, text/event-stream"
	switch status {
	case http.StatusUnauthorized:
		return fault.Auth, "send an API key with the runs scope as Authorization: Bearer <key>"
	case http.StatusForbidden:
		return fault.Forbidden, "use the key that opened the session, or open a new session"
	case http.StatusNotFound:
		return fault.NotFound, "the session is gone (closed, or timed out): initialize a new one"
	case http.StatusMethodNotAllowed:
		return fault.MethodNotAllowed, spec
	case http.StatusRequestEntityTooLarge:
		return fault.TooLarge, "send less per call; stream big files with PUT /tmp/files/{path}"
	case http.StatusUnsupportedMediaType:
		return fault.UnsupportedMediaType, spec
	case http.StatusTooManyRequests:
		return fault.Quota, "slow down and retry"
	}
	if status >= 500 {
		return fault.Internal, "retry; if it persists, report it with the server log"
	}
	return fault.BadInput, spec
}
