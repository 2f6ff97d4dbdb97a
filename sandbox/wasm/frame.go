package wasm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
)

// frameMarker starts every frame the driver writes on stdout. A frame is
// frameMarker, the instance's nonce, ':', the decimal length of the body,
// '\n' and the body (ASCII JSON). The nonce is random per instance and never
// printed, so bytes a cell writes to fd 1 on its own cannot start a frame;
// they are kept as that cell's raw stdout instead.
const frameMarker = "\x1eTRIAD:"

// maxFrameBody bounds one frame. The driver caps each output stream, so a
// bigger frame means the stream is corrupt, not that output is large.
const maxFrameBody = 256 << 20

// message is one decoded frame from the driver.
type message struct {
	T       string         `json:"t"` // "ready", "stream" or "result"
	Version string         `json:"version,omitempty"`
	Name    string         `json:"name,omitempty"` // stream: "stdout" or "stderr"
	Text    string         `json:"text,omitempty"` // stream: the chunk
	N       int            `json:"n,omitempty"`
	OK      bool           `json:"ok,omitempty"`
	Value   *bundle        `json:"value,omitempty"`
	Display []bundle       `json:"display,omitempty"`
	Error   *driverFailure `json:"error,omitempty"`
}

type bundle struct {
	Data     map[string]json.RawMessage `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

type driverFailure struct {
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// frameWriter is the instance's stdout. It splits what the guest writes into
// frames and raw bytes. Writes come from the instance's goroutine; readers
// (Kernel.Execute) take messages and raw bytes under mu.
type frameWriter struct {
	prefix []byte // frameMarker + nonce + ":"

	mu     sync.Mutex
	buf    []byte    // unparsed tail
	msgs   []message // decoded, not yet taken
	raw    limitedBuffer
	broken error // a malformed frame: the instance must be replaced
	notify chan struct{}
}

func newFrameWriter(nonce string, rawLimit int) *frameWriter {
	return &frameWriter{
		prefix: []byte(frameMarker + nonce + ":"),
		raw:    limitedBuffer{limit: rawLimit},
		notify: make(chan struct{}, 1),
	}
}

// Write implements io.Writer. It never blocks and never fails: a guest that
// cannot write its stdout would hang or die for a host-side reason.
func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	got := false
	for w.broken == nil {
		i := bytes.Index(w.buf, w.prefix)
		if i < 0 {
			// Keep a tail that may be the start of a marker split across
			// writes; everything before it is raw output.
			keep := partialSuffix(w.buf, w.prefix)
			w.raw.Write(w.buf[:len(w.buf)-keep])
			w.buf = append(w.buf[:0], w.buf[len(w.buf)-keep:]...)
			break
		}
		w.raw.Write(w.buf[:i])
		rest := w.buf[i+len(w.prefix):]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			if len(rest) > 20 {
				w.broken = fmt.Errorf("frame header without a length: %q", rest[:20])
			}
			w.buf = append(w.buf[:0], w.buf[i:]...)
			break
		}
		n, err := strconv.Atoi(string(rest[:nl]))
		if err != nil || n < 0 || n > maxFrameBody {
			w.broken = fmt.Errorf("frame with bad length %q", rest[:nl])
			break
		}
		body := rest[nl+1:]
		if len(body) < n {
			w.buf = append(w.buf[:0], w.buf[i:]...)
			break
		}
		var m message
		if err := json.Unmarshal(body[:n], &m); err != nil {
			w.broken = fmt.Errorf("undecodable frame: %w", err)
			break
		}
		w.msgs = append(w.msgs, m)
		got = true
		w.buf = append(w.buf[:0], body[n:]...)
	}
	if got || w.broken != nil {
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// take returns the decoded messages so far and any framing error.
func (w *frameWriter) take() ([]message, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m, w.broken
}

// takeRaw returns and clears the raw (unframed) bytes written so far.
func (w *frameWriter) takeRaw() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.raw.take()
}

// partialSuffix returns the length of the longest suffix of b that is a
// proper prefix of marker.
func partialSuffix(b, marker []byte) int {
	n := len(marker) - 1
	if n > len(b) {
		n = len(b)
	}
	for ; n > 0; n-- {
		if bytes.HasSuffix(b, marker[:n]) {
			return n
		}
	}
	return 0
}

// limitedBuffer keeps at most limit bytes and counts what it dropped.
type limitedBuffer struct {
	limit   int
	b       []byte
	dropped int
}

func (l *limitedBuffer) Write(p []byte) {
	room := l.limit - len(l.b)
	if room < 0 {
		room = 0
	}
	if len(p) > room {
		l.dropped += len(p) - room
		p = p[:room]
	}
	l.b = append(l.b, p...)
}

func (l *limitedBuffer) take() []byte {
	b := l.b
	if l.dropped > 0 {
		b = append(b, fmt.Sprintf("\n[triad: output truncated, %d more bytes]\n", l.dropped)...)
	}
	l.b, l.dropped = nil, 0
	return b
}

// stderrWriter is the instance's stderr. The driver routes a cell's
// sys.stderr into frames, so what arrives here is written below Python (a
// cell's os.write(2, ...)) or by the interpreter itself when it crashes.
// The first is a cell's stderr; the tail of both explains a death.
type stderrWriter struct {
	mu   sync.Mutex
	raw  limitedBuffer
	tail []byte // the last tailSize bytes ever written
}

const tailSize = 2048

func (w *stderrWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.raw.Write(p)
	w.tail = append(w.tail, p...)
	if len(w.tail) > tailSize {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-tailSize:]...)
	}
	return len(p), nil
}

func (w *stderrWriter) takeRaw() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.raw.take()
}

func (w *stderrWriter) lastBytes() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.tail)
}

// encodeFrame frames a request for the driver's stdin: a 4-byte big-endian
// length and the bytes.
func encodeFrame(body []byte) []byte {
	out := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(out, uint32(len(body)))
	copy(out[4:], body)
	return out
}
