// Package relay carries a sandbox's egress connections to Triad's host without opening the sandbox's network: a forwarder inside the sandbox, and a Link of idle connections the host keeps dialled into it.
//
// The sandbox cannot connect out (Docker network mode none; under gVisor
// --host-uds=create forbids connecting to host sockets), but the host can
// connect in, the way it reaches the kernel's Jupyter sockets. So the
// forwarder listens on sandbox.EgressAddr for the sandbox's processes and
// on a host endpoint (a unix socket in the bind-mounted socket directory on
// Docker, a loopback port the host reaches by port-forward on Kubernetes);
// the host keeps a few connections dialled into the host endpoint, and the
// forwarder pairs each process connection with one. The protocol is two
// bytes: the forwarder writes 'R' on a host connection when it holds it
// idle, and 'P' when it pairs it; then the bytes are the process's. See
// "Egress" in docs/DECISIONS.md.
package relay

import (
	"bufio"
	"context"
	_ "embed"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/sandbox"
)

//go:embed forwarder.py
var forwarder string

// Script is the forwarder's Python source, for python3 -c: written without
// single quotes, so that it can be quoted for sh.
func Script() string {
	_, port, _ := net.SplitHostPort(sandbox.EgressAddr)
	return strings.Replace(forwarder, "PROXYPORT", port, 1)
}

// Command is the sh command that starts the forwarder in the background,
// for a kernel's start script; host is "unix:PATH" or
// "tcp:127.0.0.1:PORT". It inherits the shell's stderr, so that a
// forwarder that cannot start says why in the kernel's log.
func Command(host string) string {
	return fmt.Sprintf("python3 -I -S -c '%s' %s </dev/null >/dev/null &", Script(), host)
}

// Protocol bytes: the forwarder holds a host connection idle, or pairs it.
const (
	byteReady  = 'R'
	bytePaired = 'P'
)

// Defaults of a Link.
const (
	// DefaultIdle is how many connections a Link keeps dialled: a burst of
	// that many connections from the sandbox is paired at once, and each
	// pairing dials a replacement.
	DefaultIdle = 4
	backoffMin  = 10 * time.Millisecond
	backoffMax  = 500 * time.Millisecond
)

// Link is the host side: it keeps Idle connections dialled into a
// sandbox's forwarder and hands over each one the forwarder pairs. It
// starts at the first Ready or Accept and runs until Close; a forwarder
// that goes away (its kernel restarting) is dialled again.
type Link struct {
	dial func(ctx context.Context) (net.Conn, error)
	idle int
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	ready  chan net.Conn
	once   sync.Once

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // dialled and not handed over
	closed bool
	wg     sync.WaitGroup
}

// NewLink returns a Link that dials with dial. It dials nothing yet.
func NewLink(dial func(ctx context.Context) (net.Conn, error), log *slog.Logger) *Link {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Link{dial: dial, idle: DefaultIdle, log: log, ctx: ctx, cancel: cancel,
		ready: make(chan net.Conn), conns: map[net.Conn]struct{}{}}
}

// start launches the keepers once.
func (l *Link) start() {
	l.once.Do(func() {
		for range l.idle {
			if l.spawn(nil) {
				continue
			}
			return
		}
	})
}

// spawn runs a keeper, or (with c) waits on one dialled connection; false
// once the link is closed.
func (l *Link) spawn(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if c != nil {
			l.await(c)
			return
		}
		l.keep()
	}()
	return true
}

// keep holds one idle connection at a time, dialling again after each is
// handed over or lost.
func (l *Link) keep() {
	backoff := backoffMin
	for l.ctx.Err() == nil {
		c, err := l.dialReady(l.ctx)
		if err != nil {
			l.log.Debug("egress relay: forwarder not ready", "err", err, "retry_in", backoff)
			select {
			case <-l.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, backoffMax)
			continue
		}
		backoff = backoffMin
		l.await(c)
	}
}

// dialReady dials the forwarder and reads its 'R': the connection is then
// idle at the forwarder, ready to be paired.
func (l *Link) dialReady(ctx context.Context) (net.Conn, error) {
	c, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	if !l.hold(c) {
		c.Close()
		return nil, sandbox.ErrClosed
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil || b[0] != byteReady {
		l.drop(c)
		if err == nil {
			err = fmt.Errorf("the forwarder sent %q, not %q", b[0], byteReady)
		}
		return nil, err
	}
	return c, nil
}

// await waits for the forwarder to pair c, then hands it to Accept.
func (l *Link) await(c net.Conn) {
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil || b[0] != bytePaired {
		l.drop(c)
		return
	}
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		c.Close()
	}
}

func (l *Link) hold(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) drop(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

// Ready starts the link, if it has not started, and returns once a
// connection is idle at the forwarder: from then on, a connection opened
// in the sandbox is paired, not refused. It dials until the forwarder
// answers or ctx ends.
func (l *Link) Ready(ctx context.Context) error {
	l.start()
	backoff := backoffMin
	for {
		c, err := l.dialReady(ctx)
		if err == nil {
			if !l.spawn(c) {
				l.drop(c)
				return sandbox.ErrClosed
			}
			return nil
		}
		select {
		case <-l.ctx.Done():
			return sandbox.ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("the sandbox's egress forwarder does not answer: %w (last: %v)", context.Cause(ctx), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// Accept returns the next connection the forwarder paired: a process in
// the sandbox at the other end. It fails with sandbox.ErrClosed once the
// link is closed.
func (l *Link) Accept(ctx context.Context) (net.Conn, error) {
	l.start()
	select {
	case c := <-l.ready:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		return nil, sandbox.ErrClosed
	}
}

// Close stops dialling and closes the idle connections; connections
// already handed over are their holder's. It is safe to call twice.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cancel()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return nil
}

// PortsSuffix names the forwarder's ports endpoint beside a unix host
// endpoint: PATH+PortsSuffix, where the host asks for a port of the
// sandbox (getHost). A tcp host endpoint has none: the host reaches a
// pod's ports by port-forward.
const PortsSuffix = ".ports"

// DialPort connects, through the forwarder's ports endpoint (dial), to port
// on the sandbox's loopback, as a process in the sandbox would: the
// sandbox's network stays closed. A port nothing listens on fails with an
// error wrapping sandbox.ErrNoListener.
func DialPort(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), port int) (net.Conn, error) {
	c, err := dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's forwarder does not answer: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := fmt.Fprintf(c, "%d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("ask the sandbox's forwarder for port %d: %w", port, err)
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("ask the sandbox's forwarder for port %d: %w", port, err)
	}
	if b[0] == bytePaired {
		return c, nil
	}
	why, _ := bufio.NewReader(io.LimitReader(c, 256)).ReadString('\n')
	c.Close()
	return nil, fmt.Errorf("port %d in the sandbox: %s: %w", port, strings.TrimSpace(why), sandbox.ErrNoListener)
}
