package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// SocketType is a ZMQ socket type as the READY command's Socket-Type
// property names it.
type SocketType string

// The socket types a Conn can be, and the peers they accept (23/ZMTP,
// "Socket types").
const (
	Dealer SocketType = "DEALER"
	Sub    SocketType = "SUB"
	Req    SocketType = "REQ"
)

// peers lists the peer socket types each local type may talk to.
var peers = map[SocketType][]string{
	Dealer: {"ROUTER", "DEALER", "REP"},
	Sub:    {"PUB", "XPUB"},
	Req:    {"REP", "ROUTER"},
}

// greeting is the 64-byte ZMTP 3.0 greeting of a NULL-mechanism client:
// signature (0xFF, 8 bytes of padding, 0x7F), version 3.0, the mechanism
// name padded to 20 bytes, as-server 0 and 31 bytes of filler. Announcing
// 3.0 rather than 3.1 keeps libzmq from expecting SUBSCRIBE commands.
var greeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// Options configure Handshake.
type Options struct {
	// Name names the connection in errors ("shell").
	Name string
	// Identity is sent in READY by DEALER and REQ sockets; ROUTER peers
	// use it as the routing id. Empty lets the peer pick one. At most 255
	// bytes, not starting with a zero byte.
	Identity []byte
	// Limits bound what is read from the peer.
	Limits Limits
}

// Conn is one ZMTP connection whose handshake is done. ReadMessage must be
// called from one goroutine at a time; writes may come from any, and are
// serialized so that messages are never interleaved.
type Conn struct {
	nc  net.Conn
	typ SocketType
	fr  frameReader
	wd  *watchdog

	wmu sync.Mutex
}

// Handshake performs the ZMTP greeting and the NULL mechanism's READY
// exchange on nc as a socket of type typ, and checks the peer's socket type.
// ctx bounds the handshake only; when it ends first, nc is closed. On error
// nc is closed too.
func Handshake(ctx context.Context, nc net.Conn, typ SocketType, o Options) (*Conn, error) {
	if _, ok := peers[typ]; !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("zmtp: socket type %q is not supported", typ)
	}
	if len(o.Identity) > 255 || (len(o.Identity) > 0 && o.Identity[0] == 0) {
		_ = nc.Close()
		return nil, errors.New("zmtp: identity must be at most 255 bytes and not start with a zero byte")
	}
	lim := o.Limits.withDefaults()
	c := &Conn{nc: nc, typ: typ}
	c.wd = newWatchdog(nc, lim.Stall)
	c.fr = frameReader{r: bufio.NewReaderSize(c.wd, 64<<10), lim: lim, name: o.Name, begin: c.wd.arm, end: c.wd.disarm}

	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	err := c.handshake(o.Identity)
	if !stop() {
		_ = nc.Close()
		return nil, fmt.Errorf("zmtp: handshake: %w", context.Cause(ctx))
	}
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("zmtp: handshake: %w", err)
	}
	return c, nil
}

func (c *Conn) handshake(identity []byte) error {
	// Greetings cross: both sides send theirs without waiting.
	if _, err := c.nc.Write(greeting); err != nil {
		return fmt.Errorf("send greeting: %w", err)
	}
	var g [64]byte
	if _, err := io.ReadFull(c.fr.r, g[:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 != 1 {
		return c.fr.violation("the peer's greeting has no ZMTP signature (%x)", g[:10])
	}
	if g[10] < 3 {
		return c.fr.violation("the peer speaks ZMTP %d.%d, want 3.0 or later", g[10], g[11])
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("the peer's security mechanism is %q, want NULL", mech)
	}

	var props []byte
	props = appendProperty(props, "Socket-Type", []byte(c.typ))
	if c.typ == Dealer || c.typ == Req {
		props = appendProperty(props, "Identity", identity)
	}
	if _, err := c.nc.Write(appendCommand(nil, "READY", props)); err != nil {
		return fmt.Errorf("send READY: %w", err)
	}
	frames, command, err := c.fr.readMessage()
	if err != nil {
		return fmt.Errorf("read READY: %w", err)
	}
	if !command {
		return c.fr.violation("a message before the handshake's READY")
	}
	name, data, ok := parseCommand(frames[0])
	switch {
	case !ok:
		return c.fr.violation("malformed command in the handshake")
	case name == "ERROR":
		return fmt.Errorf("the peer refused the connection: %q", errorReason(data))
	case name != "READY":
		return c.fr.violation("command %q instead of READY", name)
	}
	md, err := parseProperties(data)
	if err != nil {
		return c.fr.violation("READY: %v", err)
	}
	peer := md["socket-type"]
	for _, p := range peers[c.typ] {
		if peer == p {
			return nil
		}
	}
	return fmt.Errorf("peer socket type %q cannot talk to %s", peer, c.typ)
}

// appendProperty appends one metadata property: a 1-byte name length, the
// name, a 4-byte big-endian value length and the value.
func appendProperty(dst []byte, name string, value []byte) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// parseProperties reads READY's metadata into a map keyed by lower-case
// name (property names are case-insensitive).
func parseProperties(b []byte) (map[string]string, error) {
	md := map[string]string{}
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, errors.New("truncated property")
		}
		name := strings.ToLower(string(b[1 : 1+n]))
		b = b[1+n:]
		vlen := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(vlen) > uint64(len(b)) {
			return nil, fmt.Errorf("property %q of %d bytes in %d", name, vlen, len(b))
		}
		md[name] = string(b[:vlen])
		b = b[vlen:]
	}
	return md, nil
}

// errorReason returns the reason of an ERROR command's data.
func errorReason(data []byte) string {
	if len(data) == 0 || int(data[0]) > len(data)-1 {
		return string(data)
	}
	return string(data[1 : 1+int(data[0])])
}

// ReadMessage returns the frames of the next message. Commands between
// messages are handled here: PING is answered with PONG, ERROR ends the
// connection, others are ignored. io.EOF means the peer closed the
// connection between messages; a *ViolationError means it broke the
// protocol or the Limits, and the connection is closed.
func (c *Conn) ReadMessage() ([][]byte, error) {
	for {
		frames, command, err := c.fr.readMessage()
		if err != nil {
			if c.wd.fired.Load() {
				err = c.fr.violation("nothing received for %s inside a message (%v)", c.fr.lim.Stall, err)
			}
			var v *ViolationError
			if errors.As(err, &v) {
				_ = c.nc.Close()
			}
			return nil, err
		}
		if !command {
			return frames, nil
		}
		name, data, ok := parseCommand(frames[0])
		if !ok {
			_ = c.nc.Close()
			return nil, c.fr.violation("malformed command")
		}
		switch name {
		case "PING":
			// PING: a 2-byte TTL, then a context of up to 16 bytes that
			// PONG echoes (37/ZMTP).
			var ctx []byte
			if len(data) > 2 {
				ctx = data[2:min(len(data), 18)]
			}
			if err := c.write(appendCommand(nil, "PONG", ctx)); err != nil {
				return nil, err
			}
		case "ERROR":
			_ = c.nc.Close()
			return nil, fmt.Errorf("zmtp: the peer sent ERROR: %q", errorReason(data))
		}
	}
}

// WriteMessage sends frames as one message.
func (c *Conn) WriteMessage(frames ...[]byte) error {
	// Small messages go out as one buffer; large bodies are not copied.
	size := 0
	for _, f := range frames {
		size += 9 + len(f)
	}
	if size <= 64<<10 {
		return c.write(appendMessage(make([]byte, 0, size), frames))
	}
	hdrs := make([]byte, 0, 9*len(frames))
	bufs := make(net.Buffers, 0, 2*len(frames))
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		start := len(hdrs)
		hdrs = appendHeader(hdrs, flags, len(f))
		bufs = append(bufs, hdrs[start:], f)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := bufs.WriteTo(c.nc)
	return err
}

// Subscribe sends a ZMTP 3.0 subscription (a message of 0x01 and the
// topic) on a SUB connection; an empty topic subscribes to everything.
func (c *Conn) Subscribe(topic []byte) error {
	if c.typ != Sub {
		return fmt.Errorf("zmtp: subscribe on a %s socket", c.typ)
	}
	return c.WriteMessage(append([]byte{1}, topic...))
}

func (c *Conn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

// Close closes the connection; a ReadMessage or write in progress returns
// an error. It is safe to call twice.
func (c *Conn) Close() error {
	c.wd.timer.Stop()
	err := c.nc.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// watchdog closes the connection when a message, once begun, stops
// arriving for longer than stall. Every read of the stream goes through it
// and, while armed, restarts the countdown, so only a lack of progress
// counts, never a message's total transfer time. It closes the connection
// rather than set a read deadline because not every net.Conn a caller dials
// supports deadlines.
type watchdog struct {
	nc    net.Conn
	stall time.Duration
	timer *time.Timer
	armed bool // touched only by the reading goroutine
	fired atomic.Bool
}

func newWatchdog(nc net.Conn, stall time.Duration) *watchdog {
	w := &watchdog{nc: nc, stall: stall}
	w.timer = time.AfterFunc(time.Hour, func() {
		w.fired.Store(true)
		_ = nc.Close()
	})
	w.timer.Stop()
	return w
}

func (w *watchdog) Read(p []byte) (int, error) {
	if w.armed {
		w.timer.Reset(w.stall)
	}
	return w.nc.Read(p)
}

func (w *watchdog) arm() {
	w.armed = true
	w.timer.Reset(w.stall)
}

func (w *watchdog) disarm() {
	w.armed = false
	w.timer.Stop()
}
