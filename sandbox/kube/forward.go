package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// forwarder holds one port-forward connection to a pod through the API
// server and the kubelet, and opens a TCP connection to the pod's loopback
// per Dial. Unlike portforward.PortForwarder it opens no local listener, so
// no other process on Triad's host can reach the kernel. The connection is
// re-opened when it died (docs/DECISIONS.md, "Kubernetes").
type forwarder struct {
	b   *Backend
	pod string

	mu   sync.Mutex
	conn httpstream.Connection // nil until the first Dial, or after it died
	next atomic.Int64          // request ids
}

func (b *Backend) forward(pod string) *forwarder { return &forwarder{b: b, pod: pod} }

// connection returns the live SPDY connection, opening one if needed.
func (f *forwarder) connection(ctx context.Context) (httpstream.Connection, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		select {
		case <-f.conn.CloseChan():
			f.conn = nil
		default:
			return f.conn, nil
		}
	}
	url := f.b.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(f.b.cfg.Namespace).Name(f.pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(f.b.rest)
	if err != nil {
		return nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", url)
	type dialed struct {
		conn  httpstream.Connection
		proto string
		err   error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, p, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		ch <- dialed{c, p, err}
	}()
	var d dialed
	select {
	case d = <-ch:
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.conn != nil {
				d.conn.Close()
			}
		}()
		return nil, fmt.Errorf("port-forward to pod %s: %w", f.pod, context.Cause(ctx))
	}
	if d.err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", f.pod, d.err)
	}
	if d.proto != portforward.PortForwardProtocolV1Name {
		d.conn.Close()
		return nil, fmt.Errorf("port-forward to pod %s: the server chose protocol %q", f.pod, d.proto)
	}
	f.conn = d.conn
	return d.conn, nil
}

// Dial opens a TCP connection to port on the pod's loopback. The kubelet
// connects inside the pod when the streams arrive; if nothing listens, it
// says so on the error stream and ends the data stream, and the
// connection's first Read returns that error.
func (f *forwarder) Dial(ctx context.Context, port int) (net.Conn, error) {
	conn, err := f.connection(ctx)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, strconv.FormatInt(f.next.Add(1), 10))
	errs, err := f.createStream(ctx, conn, h)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s port %d: %w", f.pod, port, err)
	}
	errs.Close() // nothing to send on it
	c := &fwdConn{conn: conn, errs: errs, port: port, errText: make(chan string, 1)}
	go func() {
		b, _ := io.ReadAll(io.LimitReader(errs, 4<<10))
		c.errText <- string(b)
	}()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	if c.data, err = f.createStream(ctx, conn, h); err != nil {
		conn.RemoveStreams(errs)
		return nil, fmt.Errorf("port-forward to pod %s port %d: %w", f.pod, port, err)
	}
	return c, nil
}

// createStream creates a stream, bounded by ctx: the SPDY library waits up
// to 30 s for the server's reply, and a reply that does not come means the
// connection is stuck, so it is closed (the next Dial opens a new one).
func (f *forwarder) createStream(ctx context.Context, conn httpstream.Connection, h http.Header) (httpstream.Stream, error) {
	type created struct {
		s   httpstream.Stream
		err error
	}
	ch := make(chan created, 1)
	go func() {
		s, err := conn.CreateStream(h)
		ch <- created{s, err}
	}()
	select {
	case c := <-ch:
		if c.err != nil {
			f.drop(conn)
		}
		return c.s, c.err
	case <-ctx.Done():
		f.drop(conn)
		return nil, context.Cause(ctx)
	}
}

// drop closes conn if it is still the forwarder's connection.
func (f *forwarder) drop(conn httpstream.Connection) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == conn {
		f.conn = nil
	}
	conn.Close()
}

// Close ends the port-forward connection and every stream on it.
func (f *forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil {
		return nil
	}
	err := f.conn.Close()
	f.conn = nil
	return err
}

// fwdConn is one forwarded TCP connection as a net.Conn: its data stream,
// and the error stream on which the kubelet reports a failed connect.
type fwdConn struct {
	conn    httpstream.Connection
	data    httpstream.Stream
	errs    httpstream.Stream
	port    int
	errText chan string
	once    sync.Once
}

var _ net.Conn = (*fwdConn)(nil)

func (c *fwdConn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	if err == io.EOF && n == 0 {
		// A connect that failed inside the pod ends the data stream at
		// once; the error stream says why.
		select {
		case e := <-c.errText:
			if e != "" {
				return 0, fmt.Errorf("port-forward to port %d: %s", c.port, e)
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	return n, err
}

func (c *fwdConn) Write(p []byte) (int, error) { return c.data.Write(p) }

// Close half-closes the data stream before resetting it: the runtime's
// forwarder closes the pod-side connection only after both directions end,
// and otherwise waits a second.
func (c *fwdConn) Close() error {
	c.once.Do(func() {
		_ = c.data.Close()
		_ = c.data.Reset()
		c.conn.RemoveStreams(c.errs, c.data)
	})
	return nil
}

func (c *fwdConn) LocalAddr() net.Addr  { return fwdAddr("triad") }
func (c *fwdConn) RemoteAddr() net.Addr { return fwdAddr("pod:" + strconv.Itoa(c.port)) }

// Deadlines are not supported by the streams; the Jupyter client bounds
// its reads by closing connections instead.
func (c *fwdConn) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (c *fwdConn) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (c *fwdConn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

type fwdAddr string

func (a fwdAddr) Network() string { return "portforward" }
func (a fwdAddr) String() string  { return string(a) }
