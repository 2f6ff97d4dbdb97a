// Package runid validates and mints run identifiers, the key that isolates one run's kernel, files and journal.
package runid

import (
	"github.com/google/uuid"

	"github.com/triadhq/triad/internal/fault"
)

// MaxLen is the longest run id accepted. It keeps host paths (and the unix
// socket paths built from them, limited to ~107 bytes) short.
const MaxLen = 64

// ID is a validated run identifier: 1 to MaxLen characters from
// [A-Za-z0-9._-], starting with a letter or digit.
type ID string

// New mints a fresh run id.
func New() ID { return ID("r-" + uuid.NewString()) }

// Parse validates s as a run id.
func Parse(s string) (ID, error) {
	if s == "" {
		return "", fault.New(fault.MissingRun, "no run id given",
			"send the X-Run-Id header; POST /runs returns a fresh id, or pick your own of 1-64 characters from [A-Za-z0-9._-]")
	}
	if len(s) > MaxLen {
		return "", fault.New(fault.InvalidRun, "run id is longer than 64 characters",
			"use 1-64 characters from [A-Za-z0-9._-], or get one from POST /runs")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			(i > 0 && (c == '.' || c == '_' || c == '-'))
		if !ok {
			return "", fault.New(fault.InvalidRun, "run id "+quote(s)+" has a character outside [A-Za-z0-9._-] or does not start with a letter or digit",
				"use 1-64 characters from [A-Za-z0-9._-], or get one from POST /runs")
		}
	}
	return ID(s), nil
}

// String returns the id as text.
func (id ID) String() string { return string(id) }

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
