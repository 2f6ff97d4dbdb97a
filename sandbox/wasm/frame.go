package wasm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"

	"github.com/triadhq/triad/sandbox"
)

// frameMarker starts every frame the driver writes on stdout. A frame is
// frameMarker, the instance's nonce, ':', the decimal length of the body,
// '\n' and the body (UTF-8 JSON). The nonce keeps bytes a cell writes to
// fd 1 by accident from being read as frames; they are that cell's raw
// stdout. It is not a secret the host relies on: the cell shares the
// driver's interpreter and can find it, so nothing a frame says decides a
// limit or the end of a cell (see guestIO and cmdChannel).
const frameMarker = "\x1eTRIAD:"

// message is one decoded frame from the driver.
type message struct {
	T        string                     `json:"t"` // "ready", "stream", "display" or "result"
	Version  string                     `json:"version,omitempty"`
	Name     string                     `json:"name,omitempty"` // stream: "stdout" or "stderr"
	Text     string                     `json:"text,omitempty"` // stream: the chunk
	N        int                        `json:"n,omitempty"`
	OK       bool                       `json:"ok,omitempty"`
	Data     map[string]json.RawMessage `json:"data,omitempty"`     // display
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"` // display
	Value    *sandbox.Bundle            `json:"value,omitempty"`    // result
	Error    *driverFailure             `json:"error,omitempty"`
}

type driverFailure struct {
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// errOutputLimit is what a guest's write fails with once its cell has
// written its limit: EIO, which Python raises as OSError in the cell.
var errOutputLimit = experimentalsys.EIO

// guestIO is the host's end of an instance's stdout and stderr. Its Write
// methods run on the instance's goroutine, inside the guest's fd_write; the
// kernel reads what they decoded under mu.
//
// The host counts every byte the guest writes to fd 1 and fd 2 during a
// cell, frames and all, against the cell's output limit, whatever the bytes
// claim to be. Past the limit every write fails (the guest sees EIO) and is
// dropped, so the host never holds more than the limit of a cell's output:
// a cell cannot talk its way past the limit with forged frames.
type guestIO struct {
	prefix []byte        // frameMarker + nonce + ":"
	notify chan struct{} // poked when there is something for the kernel to look at

	mu     sync.Mutex
	limit  int64 // bytes the current cell may write
	used   int64 // bytes the current cell wrote
	over   bool  // a write was refused for the limit
	n      int   // the current cell's number: result frames for others are ignored
	buf    []byte
	events []sandbox.Event
	result *message // the last result frame for cell n
	ready  bool
	broken error  // a malformed frame: the instance must be replaced
	tail   []byte // the last tailSize bytes of stderr, to explain a death
}

const tailSize = 2048

func newGuestIO(nonce string, notify chan struct{}) *guestIO {
	return &guestIO{prefix: []byte(frameMarker + nonce + ":"), notify: notify}
}

// begin starts accounting for cell n (0 while the interpreter boots).
func (g *guestIO) begin(n int, limit int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n, g.limit, g.used, g.over = n, limit, 0, false
	g.result = nil
	g.events = nil
}

// admit charges n bytes to the current cell and reports whether they fit.
func (g *guestIO) admit(n int) bool {
	if g.over || g.used+int64(n) > g.limit {
		if !g.over {
			g.over = true
			g.poke()
		}
		return false
	}
	g.used += int64(n)
	return true
}

func (g *guestIO) poke() {
	select {
	case g.notify <- struct{}{}:
	default:
	}
}

// stdout returns the guest's fd 1.
func (g *guestIO) stdout() io.Writer { return writerFunc(g.writeStdout) }

// stderr returns the guest's fd 2. The driver routes a cell's sys.stderr
// into frames on stdout, so what arrives here was written below Python (a
// cell's os.write(2, ...)) or by the interpreter itself as it crashed.
func (g *guestIO) stderr() io.Writer { return writerFunc(g.writeStderr) }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (g *guestIO) writeStderr(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tail = append(g.tail, p...)
	if len(g.tail) > tailSize {
		g.tail = append(g.tail[:0], g.tail[len(g.tail)-tailSize:]...)
	}
	if !g.admit(len(p)) {
		return 0, errOutputLimit
	}
	g.events = append(g.events, sandbox.Event{Kind: sandbox.EventStderr, Text: string(p)})
	g.poke()
	return len(p), nil
}

func (g *guestIO) writeStdout(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken != nil {
		return len(p), nil // the instance is being replaced
	}
	if !g.admit(len(p)) {
		return 0, errOutputLimit
	}
	g.buf = append(g.buf, p...)
	for g.broken == nil {
		i := bytes.Index(g.buf, g.prefix)
		if i < 0 {
			// Keep a tail that may be the start of a marker split across
			// writes; everything before it is raw output.
			keep := partialSuffix(g.buf, g.prefix)
			g.raw(g.buf[:len(g.buf)-keep])
			g.buf = append(g.buf[:0], g.buf[len(g.buf)-keep:]...)
			break
		}
		g.raw(g.buf[:i])
		rest := g.buf[i+len(g.prefix):]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			if len(rest) > 20 {
				g.broken = fmt.Errorf("frame header without a length: %q", rest[:20])
			}
			g.buf = append(g.buf[:0], g.buf[i:]...)
			break
		}
		// A frame can be no longer than what the cell may still write,
		// which bounds what waits here for the rest of a frame.
		n, err := strconv.Atoi(string(rest[:nl]))
		if err != nil || n < 0 || int64(n) > g.limit {
			g.broken = fmt.Errorf("frame with bad length %q", rest[:nl])
			break
		}
		body := rest[nl+1:]
		if len(body) < n {
			g.buf = append(g.buf[:0], g.buf[i:]...)
			break
		}
		var m message
		if err := json.Unmarshal(body[:n], &m); err != nil {
			g.broken = fmt.Errorf("undecodable frame: %w", err)
			break
		}
		g.frame(&m)
		g.buf = append(g.buf[:0], body[n:]...)
	}
	g.poke()
	return len(p), nil
}

// raw records bytes written to fd 1 outside any frame as stdout.
func (g *guestIO) raw(b []byte) {
	if len(b) > 0 {
		g.events = append(g.events, sandbox.Event{Kind: sandbox.EventStdout, Text: string(b)})
	}
}

// frame records one decoded frame.
func (g *guestIO) frame(m *message) {
	switch m.T {
	case "ready":
		g.ready = true
	case "stream":
		kind := sandbox.EventStdout
		if m.Name == "stderr" {
			kind = sandbox.EventStderr
		}
		if m.Text != "" {
			g.events = append(g.events, sandbox.Event{Kind: kind, Text: m.Text})
		}
	case "display":
		g.events = append(g.events, sandbox.Event{Kind: sandbox.EventDisplay, Bundle: &sandbox.Bundle{Data: m.Data, Metadata: m.Metadata}})
	case "result":
		if m.N == g.n {
			g.result = m // the last one counts; the host decides when the cell is over
		}
	}
}

// take returns the events decoded since the last take.
func (g *guestIO) take() []sandbox.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	ev := g.events
	g.events = nil
	return ev
}

// state returns what the kernel decides on: whether the cell passed its
// limit, a framing error, the cell's last result frame and whether the
// driver said it was ready.
func (g *guestIO) state() (over bool, broken error, result *message, ready bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.over, g.broken, g.result, g.ready
}

func (g *guestIO) lastStderr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return string(g.tail)
}

// partialSuffix returns the length of the longest suffix of b that is a
// proper prefix of marker.
func partialSuffix(b, marker []byte) int {
	n := min(len(marker)-1, len(b))
	for ; n > 0; n-- {
		if bytes.HasSuffix(b, marker[:n]) {
			return n
		}
	}
	return 0
}

// cmdChannel is the guest's stdin, the only way commands reach the driver.
// Its Read runs on the instance's goroutine, inside the guest's fd_read.
// When it finds nothing to read, the guest is blocked waiting for its next
// command, and that is how the host knows a cell is over: while the guest
// waits here, none of its code runs (a wasm instance has one thread), so
// the cell cannot have ended "early" and still be running. A cell that
// reads fd 0 itself ends its call the same way, blocked; see Execute.
type cmdChannel struct {
	notify chan struct{}

	mu      sync.Mutex
	cond    sync.Cond
	pending []byte
	waits   uint64 // times the guest has blocked on an empty channel
	waiting bool
	closed  bool
}

func newCmdChannel(notify chan struct{}) *cmdChannel {
	c := &cmdChannel{notify: notify}
	c.cond.L = &c.mu
	return c
}

// Read implements io.Reader for the guest.
func (c *cmdChannel) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.pending) == 0 {
		if c.closed {
			return 0, io.EOF
		}
		if !c.waiting {
			c.waiting = true
			c.waits++
			select {
			case c.notify <- struct{}{}:
			default:
			}
		}
		c.cond.Wait()
	}
	c.waiting = false
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// send queues b for the guest and returns a generation for idle.
func (c *cmdChannel) send(b []byte) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = append(c.pending, b...)
	c.cond.Broadcast()
	return c.waits
}

// idle reports whether the guest has read everything sent and blocked on
// the channel again since the send that returned gen.
func (c *cmdChannel) idle(gen uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting && len(c.pending) == 0 && c.waits > gen && !c.closed
}

// close makes every Read, waiting or to come, return EOF.
func (c *cmdChannel) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.pending = nil
	c.cond.Broadcast()
}

// encodeFrame frames a request for the driver's stdin: a 4-byte big-endian
// length and the bytes.
func encodeFrame(body []byte) []byte {
	out := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(out, uint32(len(body)))
	copy(out[4:], body)
	return out
}
