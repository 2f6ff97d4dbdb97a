package mcp

import (
	"context"
	"errors"
	"log/slog"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/internal/fault"
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
		if p, ok := req.GetParams().(*sdk.CallToolParamsRaw); ok {
			tool = p.Name
		}
		fe := fault.Wrap(fault.BadInput, cause, "the arguments do not fit the tool's input schema: "+cause.Error(),
			"compare the arguments with the tool's inputSchema (tools/list): field names, types and required fields; unknown fields are refused")
		s.log.InfoContext(ctx, "mcp tool call refused", "tool", tool, "kind", fe.Kind, "err", cause)
		r.Content = []sdk.Content{&sdk.TextContent{Text: wire.ErrorJSON(fe)}}
		return r, nil
	}
}
