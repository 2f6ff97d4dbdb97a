// Package wire holds the request and response types of every tool and endpoint, shared by every surface (HTTP, MCP, the E2B-compatible API, the console).
//
// Surfaces translate between their protocol and these types; they never
// redeclare them. The rule for optional inputs is one: a field that is
// absent takes its default, and a field that is present is validated, so a
// caller who sends top_k: 0 is told it is out of range instead of silently
// getting the default. Optional numbers and booleans are therefore pointers.
package wire
