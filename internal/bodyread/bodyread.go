// Package bodyread reads a request body under two deadlines, one on its progress and one on its whole, and says why a body failed as the caller's mistake.
//
// A body that stops arriving (a client that sent its headers and part of
// its body and went quiet, or a connection left half-open) is cut when no
// byte has come for Idle, and any body when it has taken Total in all: the
// read fails with fault.BodyTimeout (408), and the connection's read
// deadline is set to the past, so a Read blocked in the kernel returns at
// once. A body that ends before its Content-Length (or a chunked body
// without its end) is fault.IncompleteBody (400). Surfaces read bodies
// through it before they call the core, so no run's lock ever waits on a
// client. See docs/DECISIONS.md, "No client can hold a run".
package bodyread

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triadhq/triad/internal/fault"
)

// Config sets the deadlines, which start at the body's first Read.
type Config struct {
	// Idle cuts a body no byte of which has arrived for this long (at
	// most twice it: progress is checked every Idle); 0 never.
	Idle time.Duration
	// Total cuts a body still arriving after this long; 0 never.
	Total time.Duration
	// AfterFunc arms the deadlines' timers: time.AfterFunc when nil. A
	// test passes its own to fire them when it chooses, by event.
	AfterFunc func(d time.Duration, f func()) Timer
}

// Timer is a timer AfterFunc armed.
type Timer interface {
	Stop() bool
}

// Reader is a request body read under the deadlines. Close stops its
// timers; it does not close the body (the server does).
type Reader struct {
	body  io.Reader
	rc    *http.ResponseController
	c     Config
	read  atomic.Int64 // bytes so far
	mu    sync.Mutex
	why   string // set when cut
	seen  int64  // bytes at the last idle check
	idle  Timer
	total Timer
	done  bool
	armed sync.Once
}

// New returns r's body read under c's deadlines; w is the request's
// writer, whose connection the deadlines cut.
func New(w http.ResponseWriter, r *http.Request, c Config) *Reader {
	if c.AfterFunc == nil {
		c.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	return &Reader{body: r.Body, rc: http.NewResponseController(w), c: c}
}

// arm starts the deadlines, at the first Read: until the server reads,
// it is not waiting for the client.
func (b *Reader) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	if b.c.Idle > 0 {
		b.idle = b.c.AfterFunc(b.c.Idle, b.checkIdle)
	}
	if b.c.Total > 0 {
		b.total = b.c.AfterFunc(b.c.Total, func() { b.cut(fmt.Sprintf("it took over %s in all", b.c.Total)) })
	}
}

// checkIdle cuts the body if no byte came since the last check, and
// otherwise checks again after Idle.
func (b *Reader) checkIdle() {
	n := b.read.Load()
	b.mu.Lock()
	if b.done || b.why != "" {
		b.mu.Unlock()
		return
	}
	if n != b.seen {
		b.seen = n
		b.idle = b.c.AfterFunc(b.c.Idle, b.checkIdle)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.cut(fmt.Sprintf("no byte of it arrived for %s", b.c.Idle))
}

// cut ends the body: the blocked Read, if any, returns at once.
func (b *Reader) cut(why string) {
	b.mu.Lock()
	if b.done || b.why != "" {
		b.mu.Unlock()
		return
	}
	b.why = why
	b.mu.Unlock()
	// A deadline in the past: a Read blocked on the connection returns.
	// Writers that cannot set one (a test's recorder) are cut at the
	// next Read.
	_ = b.rc.SetReadDeadline(time.Unix(1, 0))
}

// Read implements io.Reader.
func (b *Reader) Read(p []byte) (int, error) {
	b.armed.Do(b.arm)
	if err := b.cutErr(nil); err != nil {
		return 0, err
	}
	n, err := b.body.Read(p)
	b.read.Add(int64(n))
	if err == nil || err == io.EOF {
		return n, err
	}
	return n, b.cutErr(err)
}

// cutErr says why a read failed: the deadline that cut it, or the body
// ending early; any other error passes through.
func (b *Reader) cutErr(err error) error {
	b.mu.Lock()
	why := b.why
	b.mu.Unlock()
	var mbe *http.MaxBytesError
	switch {
	case why != "":
		return fault.Wrap(fault.BodyTimeout, err, "the request body was cut off: "+why,
			"send the body without pausing; a client that cannot should send smaller parts")
	case err == nil:
		return nil
	case errors.As(err, &mbe), fault.As(err) != nil:
		return err
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fault.Wrap(fault.IncompleteBody, err, "the request body ended before it was complete (fewer bytes than its Content-Length, or a chunked body cut off)",
			"send the whole body again")
	}
	return fault.Wrap(fault.IncompleteBody, err, "the request body could not be read to its end", "send the whole body again")
}

// Close stops the deadlines. It is safe to call twice.
func (b *Reader) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	if b.idle != nil {
		b.idle.Stop()
	}
	if b.total != nil {
		b.total.Stop()
	}
	return nil
}
