package orchestrator

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// ExecEvent is one piece of a running cell's output, handed to an
// in-process caller of ExecStream as it arrives: the wire event, plus the
// decoded bytes of any image it carries, by MIME type.
type ExecEvent struct {
	wire.ExecEvent
	// Images are the decoded bytes of the event's images (image/png,
	// image/jpeg, image/gif, image/svg+xml, application/pdf), by MIME type.
	Images map[string][]byte
	// Data is a display's or result's bundle data exactly as the kernel
	// sent it, each value JSON (text uncapped, images base64), for an
	// in-process caller that passes results on whole (E2B's runCode).
	// It is the kernel's own map: read it, never change it.
	Data map[string]json.RawMessage
}

// output receives a cell's events from the sandbox. It keeps what the
// answer needs within fixed bounds: the first StreamCap bytes of each
// stream in memory, the rest of a stream spooled to a temporary file (so
// the full text can be kept as a run file without the server holding it),
// and the display and result bundles, which the cell's output limit bounds.
// It forwards every event to the caller's callback, if any.
// See "Streams are spooled past the cap" in docs/DECISIONS.md.
type output struct {
	cap            int
	dir            string // where streams spill
	stdout, stderr spool
	display        []sandbox.Bundle
	value          *sandbox.Bundle
	on             func(ExecEvent)
}

func newOutput(cap int, dir string, on func(ExecEvent)) *output {
	return &output{cap: cap, dir: dir, on: on, stdout: spool{cap: cap, dir: dir}, stderr: spool{cap: cap, dir: dir}}
}

// add is the sandbox.Cell Output callback.
func (o *output) add(e sandbox.Event) {
	var we wire.ExecEvent
	switch e.Kind {
	case sandbox.EventStdout:
		o.stdout.write(e.Text)
		we = wire.ExecEvent{Type: wire.EventStdout, Text: e.Text}
	case sandbox.EventStderr:
		o.stderr.write(e.Text)
		we = wire.ExecEvent{Type: wire.EventStderr, Text: e.Text}
	case sandbox.EventDisplay:
		if e.Bundle == nil {
			return
		}
		o.display = append(o.display, *e.Bundle)
		we = wire.ExecEvent{Type: wire.EventDisplay}
	case sandbox.EventResult:
		if e.Bundle == nil {
			return
		}
		b := *e.Bundle
		o.value = &b
		we = wire.ExecEvent{Type: wire.EventResult}
	case sandbox.EventClear:
		o.display = nil
		we = wire.ExecEvent{Type: wire.EventClear}
	default:
		return
	}
	if o.on == nil {
		return
	}
	ev := ExecEvent{ExecEvent: we}
	if e.Bundle != nil {
		ev.Bundle, ev.Images = liveBundle(*e.Bundle, o.cap)
		ev.Data = e.Bundle.Data
	}
	o.on(ev)
}

// close removes the spool files.
func (o *output) close() {
	o.stdout.close()
	o.stderr.close()
}

// liveBundle turns a kernel bundle into a wire bundle for a streaming
// caller: text as strings (capped), JSON as JSON, and images as their
// base64 (SVG as text), exactly as Jupyter sends them, plus their decoded
// bytes. The final answer stores images as run files instead.
func liveBundle(b sandbox.Bundle, cap int) (*wire.Bundle, map[string][]byte) {
	out := &wire.Bundle{Data: map[string]any{}, Metadata: b.Metadata}
	var images map[string][]byte
	for mime, raw := range b.Data {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			out.Data[mime] = raw
			continue
		}
		if _, ok := binaryMIME[mime]; ok {
			if images == nil {
				images = map[string][]byte{}
			}
			images[mime] = decodeImage(mime, s)
			out.Data[mime] = s
			continue
		}
		out.Data[mime] = truncateUTF8(s, cap)
	}
	return out, images
}

// spool keeps the first cap bytes of a stream in memory and, once the
// stream is longer, all of it in a temporary file.
type spool struct {
	cap  int
	dir  string
	head strings.Builder
	n    int64
	file *os.File
	err  error
}

func (s *spool) write(text string) {
	s.n += int64(len(text))
	if s.file == nil && s.head.Len()+len(text) <= s.cap {
		s.head.WriteString(text)
		return
	}
	if s.file == nil && s.err == nil {
		s.file, s.err = os.CreateTemp(s.dir, "triad-stream-*")
		if s.err == nil {
			_, s.err = s.file.WriteString(s.head.String())
		}
		// Keep exactly the first cap bytes for the answer.
		rest := s.cap - s.head.Len()
		if rest > 0 {
			s.head.WriteString(text[:min(rest, len(text))])
		}
	}
	if s.file != nil && s.err == nil {
		_, s.err = s.file.WriteString(text)
	}
}

// text returns the stream as the answer shows it: whole when it fits the
// cap, else its first cap bytes cut at a rune boundary; truncated says so.
func (s *spool) text() (text string, truncated bool) {
	t := s.head.String()
	if s.file == nil {
		return t, false
	}
	// The head is exactly cap bytes and may end inside a rune; stream text
	// is valid UTF-8 otherwise (it comes decoded from JSON), so this drops
	// only that partial rune.
	return strings.ToValidUTF8(t, ""), true
}

// full reopens the spooled stream from its start; ok is false when the
// stream fit the cap (or could not be spooled, which err reports).
func (s *spool) full() (f *os.File, ok bool, err error) {
	if s.file == nil || s.err != nil {
		return nil, false, s.err
	}
	if _, err := s.file.Seek(0, 0); err != nil {
		return nil, false, err
	}
	return s.file, true, nil
}

func (s *spool) close() {
	if s.file != nil {
		name := s.file.Name()
		s.file.Close()
		os.Remove(name)
		s.file = nil
	}
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// decodeImage returns an image's bytes from its bundle string: base64 for
// binary types, the text itself for SVG (and for base64 that does not
// decode, which is kept as sent).
func decodeImage(mime, s string) []byte {
	if mime == "image/svg+xml" {
		return []byte(s)
	}
	if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err == nil {
		return dec
	}
	return []byte(s)
}
