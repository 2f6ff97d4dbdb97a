package wire

import (
	"encoding/json"

	"github.com/triadhq/triad/internal/fault"
)

// ErrorBody is the body of every error answer, on every surface:
// {"error": {"kind", "message", "suggestion"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong and what to do about it.
type ErrorDetail struct {
	Kind       fault.Kind `json:"kind"`
	Message    string     `json:"message"`
	Suggestion string     `json:"suggestion"`
}

// Error is the one function that turns an error into the body callers see.
// The error's kind comes from fault.From; its cause never reaches the body,
// because it may name host paths.
func Error(err error) ErrorBody {
	fe := fault.From(err)
	return ErrorBody{Error: ErrorDetail{Kind: fe.Kind, Message: fe.Message, Suggestion: fe.Suggestion}}
}

// ErrorJSON is Error as JSON text, for surfaces that carry the body as text
// (MCP tool results).
func ErrorJSON(err error) string {
	b, err := json.Marshal(Error(err))
	if err != nil {
		// Three strings always marshal.
		panic("wire: marshal error body: " + err.Error())
	}
	return string(b)
}
