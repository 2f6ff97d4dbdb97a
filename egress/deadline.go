package egress

import (
	"net"
	"os"
	"sync"
	"time"
)

// withDeadlines returns c, or, when c cannot take read deadlines (a
// Kubernetes port-forward stream), c behind a reader that can: net/http's
// server interrupts its own pending read with a past deadline when a
// handler takes the connection over (a CONNECT), and would otherwise wait
// for the sandbox to send something, which it does not until the proxy
// answers.
func withDeadlines(c net.Conn) net.Conn {
	if err := c.SetReadDeadline(time.Time{}); err == nil {
		return c
	}
	d := &deadlineConn{Conn: c, chunks: make(chan chunk, 1), closed: make(chan struct{}), changed: make(chan struct{})}
	go d.pump()
	return d
}

type chunk struct {
	b   []byte
	err error
}

// deadlineConn reads c in a goroutine of its own, one chunk ahead, so that
// Read can give up at a deadline while the underlying read goes on; the
// chunk it was waiting for is the next Read's.
type deadlineConn struct {
	net.Conn
	chunks chan chunk
	closed chan struct{}
	once   sync.Once

	rest []byte // what the last chunk left
	err  error  // the read error, once reached

	mu       sync.Mutex
	deadline time.Time
	changed  chan struct{} // closed when the deadline changes
}

func (d *deadlineConn) pump() {
	for {
		b := make([]byte, 64<<10)
		n, err := d.Conn.Read(b)
		select {
		case d.chunks <- chunk{b[:n], err}:
		case <-d.closed:
			return
		}
		if err != nil {
			return
		}
	}
}

func (d *deadlineConn) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		d.mu.Lock()
		dl, changed := d.deadline, d.changed
		d.mu.Unlock()
		var expired <-chan time.Time
		if !dl.IsZero() {
			wait := time.Until(dl)
			if wait <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(wait)
			defer t.Stop()
			expired = t.C
		}
		select {
		case c := <-d.chunks:
			d.rest, d.err = c.b, c.err
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		case <-changed: // look at the new deadline
		case <-d.closed:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// SetReadDeadline makes a Read waiting at t, or called after it, fail with
// os.ErrDeadlineExceeded, pending Reads included; the zero time waits for
// ever.
func (d *deadlineConn) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deadline = t
	if d.changed != nil {
		close(d.changed)
	}
	d.changed = make(chan struct{})
	return nil
}

// SetWriteDeadline is accepted and ignored: writes to the relay do not
// block for long, and the server only clears write deadlines.
func (d *deadlineConn) SetWriteDeadline(time.Time) error { return nil }

func (d *deadlineConn) SetDeadline(t time.Time) error { return d.SetReadDeadline(t) }

func (d *deadlineConn) Close() error {
	d.once.Do(func() { close(d.closed) })
	return d.Conn.Close()
}

// CloseWrite half-closes the underlying connection when it can.
func (d *deadlineConn) CloseWrite() error { return closeWrite(d.Conn) }
