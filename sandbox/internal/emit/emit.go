// Package emit delivers a cell's output events to the caller's sink under the cell's output limit.
//
// Both backends count what they deliver here, so the limit means the same
// on each: the bytes of stdout and stderr text and of display and result
// data together (sandbox.Event.Size). Nothing past the limit is delivered.
package emit

import (
	"fmt"
	"unicode/utf8"

	"github.com/triadhq/triad/sandbox"
)

// Meter passes events to a sink until their sizes add up to its limit. It
// is not safe for concurrent use: a backend delivers from one goroutine.
type Meter struct {
	limit int64
	used  int64
	over  bool
	out   func(sandbox.Event)
}

// New returns a Meter for one cell. out may be nil (output is counted and
// discarded); limit <= 0 means sandbox.DefaultOutputBytes.
func New(limit int64, out func(sandbox.Event)) *Meter {
	if limit <= 0 {
		limit = sandbox.DefaultOutputBytes
	}
	if out == nil {
		out = func(sandbox.Event) {}
	}
	return &Meter{limit: limit, out: out}
}

// Emit delivers e if it fits under the limit and reports whether it did.
// Text that does not fit is cut at the limit (on a character boundary) and
// the part that fits is delivered; a bundle that does not fit is dropped
// whole. Either way the meter is then over its limit and delivers nothing
// more, so what was delivered never exceeds the limit.
func (m *Meter) Emit(e sandbox.Event) bool {
	if m.over {
		return false
	}
	n := e.Size()
	if m.used+n <= m.limit {
		m.used += n
		m.out(e)
		return true
	}
	m.over = true
	if e.Bundle == nil && e.Text != "" {
		room := int(m.limit - m.used)
		for room > 0 && !utf8.RuneStart(e.Text[room]) {
			room--
		}
		if room > 0 {
			m.used += int64(room)
			e.Text = e.Text[:room]
			m.out(e)
		}
	}
	return false
}

// Over reports whether an event has been refused for the limit.
func (m *Meter) Over() bool { return m.over }

// Used is how many bytes have been delivered.
func (m *Meter) Used() int64 { return m.used }

// Limit is the meter's limit in bytes.
func (m *Meter) Limit() int64 { return m.limit }

// Bytes formats a limit for messages: "64 MiB", or "1000 bytes".
func Bytes(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
