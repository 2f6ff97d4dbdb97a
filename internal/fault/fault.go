// Package fault is the typed error every Triad surface speaks: a kind, a message and a suggestion.
package fault

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Kind names a class of failure. Callers (agents especially) branch on it, so
// kinds are stable API: add new ones, never rename.
type Kind string

// The kinds Triad answers with, and the HTTP status each maps to (see Status).
// Kinds lists them all.
const (
	BadInput         Kind = "bad_input"         // 400: the caller sent something malformed.
	MissingRun       Kind = "missing_run_id"    // 400: a tool call without X-Run-Id.
	InvalidRun       Kind = "invalid_run_id"    // 400: an X-Run-Id of the wrong shape.
	NotFound         Kind = "not_found"         // 404: no such file, blob, run or recipe.
	Conflict         Kind = "conflict"          // 409: the request clashes with existing state.
	TooLarge         Kind = "too_large"         // 413: a body or file over a configured limit.
	Unsupported      Kind = "unsupported"       // 422: valid, but not possible on this backend.
	Reserved         Kind = "reserved"          // 403: a path the journal owns.
	PermissionDenied Kind = "permission_denied" // 403: the sandbox refused a path of its own filesystem (its read-only root, the run's files).
	Auth             Kind = "auth"              // 401: the caller's API key is missing, malformed, unknown or revoked.
	Forbidden        Kind = "forbidden"         // 403: the caller's key is valid but its scope does not allow the call.
	Quota            Kind = "quota"             // 429: a tenant's quota, or an upstream's quota or rate limit, is exhausted.
	Timeout          Kind = "timeout"           // 504: a deadline passed.
	KernelDied       Kind = "kernel_died"       // 200 inside an exec result; 502 elsewhere.
	UpstreamAuth     Kind = "upstream_auth"     // 502: an upstream refused Triad's own credentials (TAVILY_API_KEY).
	Upstream         Kind = "upstream"          // 502: an upstream answered with an error.
	NotConfigured    Kind = "not_configured"    // 503: the tool needs configuration it lacks.
	StoreUnavailable Kind = "store_unavailable" // 503: the file store does not answer.
	Unavailable      Kind = "unavailable"       // 503: a backend (Docker, the sandbox) does not answer.
	Internal         Kind = "internal"          // 500: a bug in Triad, never the caller's input.
	Corrupt          Kind = "corrupt"           // 500: stored bytes failed their sha256 check (or were quarantined) and were not served.

	IncompleteBody       Kind = "incomplete_body"        // 400: the request body ended before its Content-Length (or its chunked end).
	BodyTimeout          Kind = "body_timeout"           // 408: the request body stopped arriving, or took too long in all.
	MethodNotAllowed     Kind = "method_not_allowed"     // 405: the path exists, but not with this method (Allow lists those it has).
	UnsupportedMediaType Kind = "unsupported_media_type" // 415: a body of a Content-Type or Content-Encoding the endpoint does not take.
	RangeNotSatisfiable  Kind = "range_not_satisfiable"  // 416: a Range the file cannot satisfy.
)

// Kinds lists every kind, for documents that enumerate them (OpenAPI).
var Kinds = []Kind{BadInput, MissingRun, InvalidRun, NotFound, Conflict, TooLarge, Unsupported, Reserved, PermissionDenied, Auth, Forbidden,
	Quota, Timeout, KernelDied, UpstreamAuth, Upstream, NotConfigured, StoreUnavailable, Unavailable, Internal, Corrupt,
	IncompleteBody, BodyTimeout, MethodNotAllowed, UnsupportedMediaType, RangeNotSatisfiable}

// Error is a failure with everything a caller needs to correct itself.
type Error struct {
	Kind       Kind
	Message    string
	Suggestion string
	// Err is the underlying cause, kept for logs and errors.Is; it is never
	// shown to callers because it may name host paths.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Kind, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Message)
}

// Unwrap exposes the cause to errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

// New returns an Error of kind k.
func New(k Kind, message, suggestion string) *Error {
	return &Error{Kind: k, Message: message, Suggestion: suggestion}
}

// Wrap returns an Error of kind k that keeps cause for logs.
func Wrap(k Kind, cause error, message, suggestion string) *Error {
	return &Error{Kind: k, Message: message, Suggestion: suggestion, Err: cause}
}

// Badf returns a BadInput error with a formatted message.
func Badf(suggestion, format string, args ...any) *Error {
	return &Error{Kind: BadInput, Message: fmt.Sprintf(format, args...), Suggestion: suggestion}
}

// As returns the *Error in err's chain, or nil.
func As(err error) *Error {
	var fe *Error
	if errors.As(err, &fe) {
		return fe
	}
	return nil
}

// Status maps a kind to the HTTP status it is answered with.
func Status(k Kind) int {
	switch k {
	case BadInput, MissingRun, InvalidRun, IncompleteBody:
		return http.StatusBadRequest
	case BodyTimeout:
		return http.StatusRequestTimeout
	case MethodNotAllowed:
		return http.StatusMethodNotAllowed
	case UnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case RangeNotSatisfiable:
		return http.StatusRequestedRangeNotSatisfiable
	case NotFound:
		return http.StatusNotFound
	case Conflict:
		return http.StatusConflict
	case TooLarge:
		return http.StatusRequestEntityTooLarge
	case Unsupported:
		return http.StatusUnprocessableEntity
	case Auth:
		return http.StatusUnauthorized
	case Reserved, PermissionDenied, Forbidden:
		return http.StatusForbidden
	case Quota:
		return http.StatusTooManyRequests
	case Timeout:
		return http.StatusGatewayTimeout
	case KernelDied, UpstreamAuth, Upstream:
		return http.StatusBadGateway
	case NotConfigured, StoreUnavailable, Unavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// From is the one function that maps any error to the fault a caller sees:
// a fault passes through; a body over its limit is TooLarge; a cancelled
// call or a deadline passed is Timeout; anything else is Internal, which
// always means a bug in Triad, never the caller's input.
func From(err error) *Error {
	if fe := As(err); fe != nil {
		return fe
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return Wrap(TooLarge, err, fmt.Sprintf("the request body is over the %d-byte limit", mbe.Limit),
			"send less per call; stream big files with PUT /tmp/files/{path}")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Wrap(Timeout, err, "the call was cancelled or ran out of time", "retry the call")
	}
	return Wrap(Internal, err, "internal error", "retry; if it persists, report it with the server log")
}
