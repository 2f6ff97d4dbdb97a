package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// dialer reaches a port on a kernel pod's loopback: a port-forward
// (forwarder) or, for a pod under a RuntimeClass, exec sessions (relay).
type dialer interface {
	Dial(ctx context.Context, port int) (net.Conn, error)
	// Close ends what the dialer shares between connections; the next
	// Dial opens it again.
	Close() error
}

// dialerFor picks how to reach pod's loopback. containerd's port-forward
// connects inside the pod's network namespace on the node, which a
// sandboxed runtime's own network stack (gVisor's netstack, a Kata VM)
// does not share, so a pod under a RuntimeClass is reached through exec
// sessions into its agent container instead, which runs in the pod's
// sandbox (containerd#6638, gvisor#3811; docs/DECISIONS.md, "gVisor on
// Kubernetes").
func (b *Backend) dialerFor(pod string) dialer {
	if b.cfg.RuntimeClass != "" {
		return &execRelay{b: b, pod: pod}
	}
	return b.forward(pod)
}

// relayProgram runs in the agent container for one connection: it
// connects to the port on the pod's loopback, says so with one byte (or
// exits with the error on stderr), then copies bytes both ways until the
// kernel closes the connection. One process, no threads: it counts once
// against the pod's process limit.
const relayProgram = `import os, select, socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    sys.stderr.write("connect to 127.0.0.1:%s: %s" % (sys.argv[1], e.strerror))
    sys.exit(1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.write(1, b"+")
ins = [0, s]
while True:
    for r in select.select(ins, [], [])[0]:
        if r == 0:
            b = os.read(0, 1 << 16)
            if not b:
                s.shutdown(socket.SHUT_WR)
                ins.remove(0)
                continue
            s.sendall(b)
        else:
            b = s.recv(1 << 16)
            if not b:
                sys.exit(0)
            v = memoryview(b)
            while v:
                v = v[os.write(1, v):]
`

// errRefused means the relay ran in the pod and nothing listened on the
// port.
var errRefused = errors.New("connection refused in the pod")

// execRelay opens one exec session per connection.
type execRelay struct {
	b   *Backend
	pod string
}

func (r *execRelay) Close() error { return nil } // every connection owns its session

// Dial runs relayProgram for port in the pod's agent container (in the
// kernel container when the agent's is gone, as startAgent does) and
// returns once it has connected.
func (r *execRelay) Dial(ctx context.Context, port int) (net.Conn, error) {
	c, err := r.dialIn(ctx, port, agentContainer)
	if err != nil && ctx.Err() == nil && !errors.Is(err, errRefused) {
		if c2, err2 := r.dialIn(ctx, port, kernelContainer); err2 == nil {
			return c2, nil
		}
	}
	return c, err
}

func (r *execRelay) dialIn(ctx context.Context, port int, container string) (net.Conn, error) {
	b := r.b
	req := b.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(b.cfg.Namespace).Name(r.pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   []string{"python3", "-S", "-c", relayProgram, strconv.Itoa(port)},
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := b.executor(req.URL())
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &relayConn{port: port, stdin: inW, out: outR, cancel: cancel, done: make(chan struct{}), stderr: &tailBuffer{max: 4 << 10}}
	go func() {
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: c.stderr})
		if err == nil {
			err = io.EOF
		} else if s := c.stderr.String(); s != "" {
			err = fmt.Errorf("%w (%s)", err, s)
		}
		outW.CloseWithError(err)
		inR.CloseWithError(io.ErrClosedPipe)
		close(c.done)
	}()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var ack [1]byte
	if _, err := io.ReadFull(outR, ack[:]); err != nil || ack[0] != '+' {
		c.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("relay to pod %s port %d: %w", r.pod, port, context.Cause(ctx))
		}
		<-c.done
		if s := c.stderr.String(); strings.HasPrefix(s, "connect to ") {
			// The relay ran; nothing listens on the port (yet).
			return nil, fmt.Errorf("relay to pod %s port %d: %w: %s", r.pod, port, errRefused, s)
		} else if s != "" {
			return nil, fmt.Errorf("relay to pod %s port %d: %s", r.pod, port, s)
		}
		return nil, fmt.Errorf("relay to pod %s port %d: %w", r.pod, port, err)
	}
	return c, nil
}

// relayConn is one relayed connection as a net.Conn: the exec session's
// stdin and stdout.
type relayConn struct {
	port   int
	stdin  *io.PipeWriter
	out    *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	stderr *tailBuffer
	once   sync.Once
}

var _ net.Conn = (*relayConn)(nil)

func (c *relayConn) Read(p []byte) (int, error) { return c.out.Read(p) }

func (c *relayConn) Write(p []byte) (int, error) { return c.stdin.Write(p) }

// Close ends stdin, so the relay half-closes the kernel's connection and
// exits once the kernel closes its end; a session that does not end by
// itself is cut after a moment.
func (c *relayConn) Close() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		go func() {
			select {
			case <-c.done:
			case <-time.After(2 * time.Second):
			}
			c.cancel()
		}()
	})
	return nil
}

func (c *relayConn) LocalAddr() net.Addr  { return fwdAddr("triad") }
func (c *relayConn) RemoteAddr() net.Addr { return fwdAddr("pod:" + strconv.Itoa(c.port)) }

// Deadlines are not supported by the streams; the Jupyter client bounds
// its reads by closing connections instead.
func (c *relayConn) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (c *relayConn) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (c *relayConn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }
