// Package runid validates and mints run identifiers, the key that isolates one run's kernel, files and journal.
package runid

import (
	"strings"

	"github.com/google/uuid"

	"github.com/triadhq/triad/internal/fault"
)

// MaxLen is the longest run id accepted. It keeps host paths (and the unix
// socket paths built from them, limited to ~107 bytes) short.
const MaxLen = 64

// Pattern is the regular expression (RE2 and ECMA-262 alike) of the ids
// Parse accepts, for documents that describe them (the OpenAPI document,
// MCP's tool schemas); a test holds the two to the same answers.
const Pattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`

// ID is a validated run identifier: 1 to MaxLen characters from
// [A-Za-z0-9._-], starting with a letter or digit. Its field is unexported,
// so outside this package an ID can only come from New, Parse or Must (or a
// JSON value that Parse accepts): holding an ID proves it is valid. The zero
// ID is "no run" (IsZero).
type ID struct{ s string }

// New mints a fresh run id.
func New() ID { return ID{"r-" + uuid.NewString()} }

// ReservedPrefix starts the ids of Triad's own runs. No caller may bring a
// run with such an id into being by naming it (an implicit run): only
// Triad names them, so no caller can take one first. The check is the
// core's, where every run is resolved; Parse accepts the ids, so that
// Triad can name its own. See docs/DECISIONS.md, "One owner per run".
const ReservedPrefix = "triad-"

// Reserved reports whether id starts with ReservedPrefix, in any case (a
// store on a case-insensitive file system would take TRIAD-x for triad-x).
func (id ID) Reserved() bool {
	return len(id.s) >= len(ReservedPrefix) && strings.EqualFold(id.s[:len(ReservedPrefix)], ReservedPrefix)
}

// Must parses s and panics if it is not a valid run id: for ids built from
// constants and other validated ids (prefix + uuid), never for input.
func Must(s string) ID {
	id, err := Parse(s)
	if err != nil {
		panic("runid.Must(" + quote(s) + "): " + err.Error())
	}
	return id
}

// Parse validates s as a run id.
func Parse(s string) (ID, error) {
	if s == "" {
		return ID{}, fault.New(fault.MissingRun, "no run id given",
			"send the X-Run-Id header; POST /runs returns a fresh id, or pick your own of 1-64 characters from [A-Za-z0-9._-]")
	}
	if len(s) > MaxLen {
		return ID{}, fault.New(fault.InvalidRun, "run id is longer than 64 characters",
			"use 1-64 characters from [A-Za-z0-9._-], or get one from POST /runs")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			(i > 0 && (c == '.' || c == '_' || c == '-'))
		if !ok {
			return ID{}, fault.New(fault.InvalidRun, "run id "+quote(s)+" has a character outside [A-Za-z0-9._-] or does not start with a letter or digit",
				"use 1-64 characters from [A-Za-z0-9._-], or get one from POST /runs")
		}
	}
	return ID{s}, nil
}

// String returns the id as text.
func (id ID) String() string { return id.s }

// IsZero reports whether id is the zero ID, which names no run.
func (id ID) IsZero() bool { return id.s == "" }

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.s), nil }

// UnmarshalText implements encoding.TextUnmarshaler: only a valid id
// decodes.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

func quote(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s) && i < 80; i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f || c == '"' || c == '\\' {
			b = append(b, '?')
			continue
		}
		b = append(b, c)
	}
	return string(append(b, '"'))
}
