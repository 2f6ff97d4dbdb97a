package jupyter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/triadhq/triad/sandbox/jupyter/zmtp"
)

// Errors returned by Client and Execution.
var (
	// ErrKernelDead means the kernel's sockets closed under the client: the
	// process exited, was killed (OOM, SIGKILL, os._exit) or was shut down;
	// or the kernel broke the protocol (a frame over Options.Limits, bytes
	// that are not ZMTP), and Client.Err then also wraps a
	// *zmtp.ViolationError. The kernel's state is gone, or no longer
	// trusted, and this client cannot recover it (sockets here do not
	// reconnect): Close the client, start a new kernel and Dial it.
	// Client.Err says what was observed.
	ErrKernelDead = errors.New("jupyter: kernel dead")
	// ErrClosed means Close was called on the client; Dial a new one.
	ErrClosed = errors.New("jupyter: client closed")
)

// readyInterval is how often WaitReady repeats kernel_info_request (pitfall
// 5 of jupyter-over-zmq.md).
const readyInterval = 200 * time.Millisecond

// Options are the optional settings of Dial. The zero value is ready to use.
type Options struct {
	// Logger receives dropped messages (bad signatures, unknown parents)
	// and the kernel's death. Nil means silent.
	Logger *slog.Logger
	// Username goes into every message header; "" means "triad".
	Username string
	// Limits bound every message read from the shell, control and iopub
	// sockets, before it is buffered (the heartbeat socket has tight
	// limits of its own). Zero fields take zmtp's defaults: 64 MiB per
	// message and per frame, 1024 frames, 10 s without progress inside a
	// message. Set MaxMessage above the largest output a cell may produce
	// (plus its JSON envelope): a message over it kills the kernel.
	Limits zmtp.Limits
	// Dial opens the connection behind one of the kernel's sockets:
	// channel is "shell", "control", "iopub" or "hb" and port is that
	// socket's port in the ConnInfo. It is called once per socket, and ctx
	// bounds it. Nil dials the unix socket (ipc) or TCP address (tcp) that
	// the ConnInfo and hostPrefix name, retrying until the kernel has
	// bound it; another transport (a port-forward stream, say) plugs in
	// here. A connection that ends is never redialled: it means the kernel
	// is dead.
	Dial func(ctx context.Context, channel string, port int) (net.Conn, error)
	// StdioBarrier, for a kernel that may publish a cell's stdout and
	// stderr after the cell's status idle (Deno's does: its console
	// output goes through a queue of its own), returns code whose only
	// output is a line of stdout holding token, written through that same
	// queue. A cell then completes only once that line has arrived, after
	// every earlier line: see stdioBarrier and docs/DECISIONS.md, "A
	// cell's late stdout". Nil is a kernel that publishes a cell's output
	// before its idle, as ipykernel does.
	StdioBarrier func(token string) string
}

// hbLimits bound the heartbeat socket, which only ever carries the echo
// of a 32-byte ping behind an empty REQ delimiter. Stall comes from
// Options.Limits.
var hbLimits = zmtp.Limits{MaxMessage: 1 << 10, MaxFrames: 4}

// Client speaks the Jupyter messaging protocol to one kernel over its
// shell, control, iopub and hb sockets. Its methods are safe for concurrent
// use; the kernel itself runs one cell at a time, queueing the rest.
type Client struct {
	log     *slog.Logger
	sess    session
	barrier func(token string) string // Options.StdioBarrier

	shell, control, iopub, hb *zmtp.Conn // each one connection, written under its own lock

	mu      sync.Mutex
	pending map[string]handler // by request msg_id

	hbReq  chan hbPing
	hbEcho chan [][]byte // echoes read from hb, buffered 1

	dead     chan struct{} // closed when the kernel is found dead
	deadOnce sync.Once
	deadErr  error // set before dead is closed

	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup

	shutdownSent chan struct{} // closed when Shutdown sent its request, so the EOF that follows reads as a shutdown
	shutDown     bool          // the kernel died after shutdownSent; set by markDead before dead is closed
	shutdownOnce sync.Once
}

// handler receives the messages whose parent is a request of ours. onIOPub
// and onShell (shell and control replies) report whether the request is
// finished, so dispatch can forget it.
type handler interface {
	onIOPub(message) (done bool, err error)
	onShell(message) (done bool, err error)
}

// hbPing asks the heartbeat goroutine to send payload and report its echo.
type hbPing struct {
	payload []byte
	reply   chan error // buffered 1
}

// Dial connects to the kernel described by info and returns a client whose
// goroutines read every socket. hostPrefix replaces info.IP on this side:
// for ipc it is the host path of the socket directory bind-mounted into the
// kernel's container plus the file prefix (e.g. /tmp/triad-0/ab12cd/k when
// info.IP is /run/kernel/k); "" dials info.IP itself.
//
// Dial waits, bounded by ctx, for the kernel to bind its sockets: a
// missing or refused socket is retried every 10 ms, and a permission error
// (EACCES) or a bad path fails at once with the real cause instead of
// looking like a hang. It then does each socket's ZMTP handshake, and
// subscribes to iopub. Dial does not wait for the kernel to answer; call
// WaitReady.
func Dial(ctx context.Context, info ConnInfo, hostPrefix string, opts Options) (*Client, error) {
	if err := info.validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	username := opts.Username
	if username == "" {
		username = "triad"
	}
	dial := opts.Dial
	if dial == nil {
		eps := make(map[int]endpoint, 4)
		for _, port := range []int{info.ShellPort, info.ControlPort, info.IOPubPort, info.HBPort} {
			ep, err := info.endpoint(hostPrefix, port)
			if err != nil {
				return nil, err
			}
			eps[port] = ep
		}
		dial = func(ctx context.Context, _ string, port int) (net.Conn, error) { return dialRetry(ctx, eps[port]) }
	}

	c := &Client{
		log:          log,
		barrier:      opts.StdioBarrier,
		sess:         session{id: uuid.NewString(), username: username, signer: signer{key: []byte(info.Key)}},
		pending:      make(map[string]handler),
		hbReq:        make(chan hbPing),
		hbEcho:       make(chan [][]byte, 1),
		dead:         make(chan struct{}),
		closing:      make(chan struct{}),
		shutdownSent: make(chan struct{}),
	}
	hb := hbLimits
	hb.Stall = opts.Limits.Stall
	// iopub first: the sooner the subscription is live, the fewer early
	// broadcasts are lost.
	for _, s := range []struct {
		name string
		port int
		typ  zmtp.SocketType
		lim  zmtp.Limits
		conn **zmtp.Conn
	}{
		{"iopub", info.IOPubPort, zmtp.Sub, opts.Limits, &c.iopub},
		{"shell", info.ShellPort, zmtp.Dealer, opts.Limits, &c.shell},
		{"control", info.ControlPort, zmtp.Dealer, opts.Limits, &c.control},
		{"hb", info.HBPort, zmtp.Req, hb, &c.hb},
	} {
		nc, err := dial(ctx, s.name, s.port)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("jupyter: dial %s: %w", s.name, err)
		}
		zc, err := zmtp.Handshake(ctx, nc, s.typ, zmtp.Options{Name: s.name, Limits: s.lim})
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("jupyter: dial %s: %w", s.name, err)
		}
		*s.conn = zc
		if s.typ == zmtp.Sub {
			if err := zc.Subscribe(nil); err != nil {
				c.closeConns()
				return nil, fmt.Errorf("jupyter: subscribe iopub: %w", err)
			}
		}
	}

	c.wg.Add(5)
	go c.readLoop("shell", c.shell)
	go c.readLoop("control", c.control)
	go c.readLoop("iopub", c.iopub)
	go c.hbReadLoop()
	go c.heartbeatLoop()
	return c, nil
}

// dialRetry connects to ep until the kernel accepts. A socket not bound yet
// (ENOENT) or not listening yet (ECONNREFUSED) is retried every 10 ms until
// ctx ends; anything else, EACCES especially, is returned at once because
// waiting cannot fix it (pitfall 2 of jupyter-over-zmq.md).
func dialRetry(ctx context.Context, ep endpoint) (net.Conn, error) {
	var d net.Dialer
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last error // the last failure not caused by ctx ending
	for {
		conn, err := d.DialContext(ctx, ep.network, ep.addr)
		if err == nil {
			return conn, nil
		}
		// The dialer takes ctx's deadline as its own and may report
		// "i/o timeout" just before ctx itself says it ended.
		var ne net.Error
		ended := ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout())
		if !ended {
			if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
				return nil, err
			}
			last = err
		}
		if ended {
			<-ctx.Done()
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = err
			}
			return nil, fmt.Errorf("%s not answering before %w (last error: %v)", ep.addr, context.Cause(ctx), last)
		case <-t.C:
		}
	}
}

// readLoop is the one goroutine that reads conn, and it hands each message
// to the request it answers itself, so a socket never holds more than the
// one message being read (Options.Limits bounds that). A receive error
// while the client is open means the kernel's end closed (pitfall 4) or the
// kernel broke the protocol: either way the kernel is dead and, without
// reconnection, so is this client.
func (c *Client) readLoop(name string, conn *zmtp.Conn) {
	defer c.wg.Done()
	defer c.recoverReader(name, conn)
	for {
		frames, err := conn.ReadMessage()
		if err != nil {
			c.readFailed(name, conn, err)
			return
		}
		m, err := c.sess.decode(frames)
		if err != nil {
			c.log.Warn("jupyter: dropped message", "channel", name, "err", err)
			continue
		}
		c.dispatch(name, m)
	}
}

// readFailed ends a socket whose read failed, and with it the kernel,
// unless the client is closing.
func (c *Client) readFailed(name string, conn *zmtp.Conn, err error) {
	select {
	case <-c.closing:
		return
	default:
	}
	// Nothing more is read from a stream at an unknown position; closing
	// it also stops the kernel's end from writing into it.
	_ = conn.Close()
	c.markDead(fmt.Errorf("%s socket: %w", name, err))
}

// recoverReader is the second line of defence behind the bounded reader: a
// panic while reading or handling a kernel's message kills that kernel's
// client, never the process. It is deferred by every reading goroutine.
func (c *Client) recoverReader(name string, conn *zmtp.Conn) {
	r := recover()
	if r == nil {
		return
	}
	c.log.Error("jupyter: reading the kernel panicked", "channel", name, "panic", r, "stack", string(debug.Stack()))
	_ = conn.Close()
	c.markDead(fmt.Errorf("%s socket: %w", name, &zmtp.ViolationError{Conn: name, Reason: fmt.Sprintf("reading it panicked: %v", r)}))
}

// dispatch hands a decoded message to the request it answers, by parent
// msg_id. Messages nobody waits for (status after a finished request, the
// kernel's own starting broadcast) are dropped.
func (c *Client) dispatch(ch string, m message) {
	parent := m.Parent.MsgID
	c.mu.Lock()
	h := c.pending[parent]
	c.mu.Unlock()
	if h == nil {
		c.log.Debug("jupyter: message for no pending request", "channel", ch, "msg_type", m.Header.MsgType, "parent", parent)
		return
	}
	var done bool
	var err error
	if ch == "iopub" {
		done, err = h.onIOPub(m)
	} else {
		done, err = h.onShell(m)
	}
	if err != nil {
		c.log.Warn("jupyter: undecodable content", "channel", ch, "msg_type", m.Header.MsgType, "err", err)
	}
	if done {
		c.forget(parent)
	}
}

func (c *Client) register(msgID string, h handler) {
	c.mu.Lock()
	c.pending[msgID] = h
	c.mu.Unlock()
}

func (c *Client) forget(msgID string) {
	c.mu.Lock()
	delete(c.pending, msgID)
	c.mu.Unlock()
}

// markDead records why the kernel is gone and wakes everyone waiting. Only
// the first cause is kept.
func (c *Client) markDead(cause error) {
	c.deadOnce.Do(func() {
		select {
		case <-c.shutdownSent:
			c.shutDown = true
			c.deadErr = fmt.Errorf("%w: shut down on request (%v)", ErrKernelDead, cause)
		default:
			c.deadErr = fmt.Errorf("%w: %w", ErrKernelDead, cause)
		}
		c.log.Warn("jupyter: kernel dead", "err", c.deadErr)
		close(c.dead)
	})
}

// Dead is closed when the kernel is found dead: one of its sockets closed
// under the client (EOF) or broke the protocol. It is not closed by Close.
func (c *Client) Dead() <-chan struct{} { return c.dead }

// Err returns why the kernel is dead (an error matching ErrKernelDead), or
// nil while it is not known to be dead.
func (c *Client) Err() error {
	select {
	case <-c.dead:
		return c.deadErr
	default:
		return nil
	}
}

// usable returns the error a new request must fail with, or nil.
func (c *Client) usable() error {
	select {
	case <-c.closing:
		return ErrClosed
	default:
	}
	return c.Err()
}

// send signs and sends a request with a fresh header on conn (the shell or
// control socket, named name). It blocks while the kernel does not read. A
// write that fails leaves the stream broken, so the kernel is dead then.
func (c *Client) send(name string, conn *zmtp.Conn, h header, content any) error {
	frames, err := c.sess.encode(h, content)
	if err != nil {
		return err
	}
	if err := conn.WriteMessage(frames...); err != nil {
		select {
		case <-c.closing:
			return ErrClosed
		default:
		}
		_ = conn.Close()
		c.markDead(fmt.Errorf("%s socket: write: %w", name, err))
		return fmt.Errorf("jupyter: send %s: %w", h.MsgType, c.Err())
	}
	return nil
}

// Execute sends code to the kernel as an execute_request and returns at
// once; use the Execution to wait for the cell, and ExecOptions.OnOutput
// to take its output message by message as it arrives. ctx is checked before
// sending only: the cell's run time is bounded by Execution.Wait's ctx and
// by Interrupt. It fails with ErrKernelDead or ErrClosed when the client is
// unusable.
func (c *Client) Execute(ctx context.Context, code string, opts ExecOptions) (*Execution, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.usable(); err != nil {
		return nil, err
	}
	h := c.sess.newHeader("execute_request")
	e := newExecution(c, h.MsgID, opts)
	// Registered before sending, so no reply can arrive unclaimed.
	c.register(h.MsgID, e)
	exprs := opts.UserExpressions
	if exprs == nil {
		exprs = map[string]string{}
	}
	err := c.send("shell", c.shell, h, executeRequest{
		Code:            code,
		Silent:          opts.Silent,
		StoreHistory:    !opts.SkipHistory,
		UserExpressions: exprs,
		AllowStdin:      false,
		StopOnError:     opts.StopOnError,
	})
	if err != nil {
		c.forget(h.MsgID)
		return nil, err
	}
	return e, nil
}

// replyWaiter waits for the shell or control reply to one request.
type replyWaiter struct {
	reply chan message // buffered 1
}

func (w *replyWaiter) onIOPub(message) (bool, error) { return false, nil }

func (w *replyWaiter) onShell(m message) (bool, error) {
	select {
	case w.reply <- m:
	default:
	}
	return true, nil
}

// request sends a request on sock and waits for its reply, ctx, the
// kernel's death or Close, whichever comes first.
func (c *Client) request(ctx context.Context, name string, conn *zmtp.Conn, msgType string, content any, before func()) (message, error) {
	if err := c.usable(); err != nil {
		return message{}, err
	}
	h := c.sess.newHeader(msgType)
	w := &replyWaiter{reply: make(chan message, 1)}
	c.register(h.MsgID, w)
	defer c.forget(h.MsgID)
	if before != nil {
		before()
	}
	if err := c.send(name, conn, h, content); err != nil {
		return message{}, err
	}
	select {
	case m := <-w.reply:
		return m, nil
	case <-c.dead:
		// A reply that arrived before the death is the answer: select
		// picks at random among ready cases, and a kernel that exits
		// right after replying (shutdown_reply) is dead by the time a
		// slow waiter looks.
		select {
		case m := <-w.reply:
			return m, nil
		default:
		}
		return message{}, fmt.Errorf("%s: %w", msgType, c.Err())
	case <-c.closing:
		return message{}, ErrClosed
	case <-ctx.Done():
		return message{}, fmt.Errorf("%s: no reply: %w", msgType, ctx.Err())
	}
}

// Interrupt sends interrupt_request on the control channel and waits for
// interrupt_reply. The running cell (if any) then fails with
// KeyboardInterrupt and the kernel keeps its state. ipykernel only acts on
// SIGINT while a cell runs, so an interrupt sent between cells is a no-op.
func (c *Client) Interrupt(ctx context.Context) error {
	m, err := c.request(ctx, "control", c.control, "interrupt_request", struct{}{}, nil)
	if err != nil {
		return err
	}
	return replyStatus(m)
}

// Shutdown sends shutdown_request on the control channel and waits for
// shutdown_reply. The kernel process then exits, whatever restart says:
// restart only tells the kernel it is going to be replaced, and starting the
// replacement is the caller's job (as it is a kernel manager's in Jupyter).
// Dead closes once the process is gone, with an Err noting the shutdown.
func (c *Client) Shutdown(ctx context.Context, restart bool) error {
	m, err := c.request(ctx, "control", c.control, "shutdown_request", struct {
		Restart bool `json:"restart"`
	}{restart}, func() { c.shutdownOnce.Do(func() { close(c.shutdownSent) }) })
	if err != nil && errors.Is(err, ErrKernelDead) && c.shutDown {
		// The kernel exited after the request went out, and its
		// sockets closed before the reply was read: it did what it was
		// asked. (c.shutDown is set before dead is closed, which the
		// request observed.)
		return nil
	}
	if err != nil {
		return err
	}
	return replyStatus(m)
}

// replyStatus turns a reply whose status is not "ok" into an error.
func replyStatus(m message) error {
	var c struct {
		Status string `json:"status"`
		Ename  string `json:"ename"`
		Evalue string `json:"evalue"`
	}
	if err := json.Unmarshal(m.Content, &c); err != nil {
		return fmt.Errorf("jupyter: decode %s: %w", m.Header.MsgType, err)
	}
	if c.Status != "" && c.Status != StatusOK {
		return fmt.Errorf("jupyter: %s: status %s: %s: %s", m.Header.MsgType, c.Status, c.Ename, c.Evalue)
	}
	return nil
}

// readyWaiter is told of any iopub message caused by one of WaitReady's
// kernel_info_requests.
type readyWaiter struct {
	ready chan struct{} // buffered 1
}

func (w *readyWaiter) onIOPub(message) (bool, error) {
	select {
	case w.ready <- struct{}{}:
	default:
	}
	return true, nil
}

func (w *readyWaiter) onShell(message) (bool, error) { return false, nil }

// WaitReady returns once the kernel answers and its iopub broadcasts reach
// this client. It sends kernel_info_request every 200 ms until an iopub
// message whose parent is one of them arrives: a shell reply alone would not
// prove the iopub subscription is live, and status: starting may have been
// broadcast before it was.
func (c *Client) WaitReady(ctx context.Context) error {
	w := &readyWaiter{ready: make(chan struct{}, 1)}
	var sent []string
	defer func() {
		for _, id := range sent {
			c.forget(id)
		}
	}()
	t := time.NewTicker(readyInterval)
	defer t.Stop()
	for {
		if err := c.usable(); err != nil {
			return err
		}
		h := c.sess.newHeader("kernel_info_request")
		c.register(h.MsgID, w)
		sent = append(sent, h.MsgID)
		if err := c.send("shell", c.shell, h, struct{}{}); err != nil {
			return err
		}
		select {
		case <-w.ready:
			return nil
		case <-c.dead:
			return c.Err()
		case <-c.closing:
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("jupyter: kernel not ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Heartbeat sends a ping on the hb channel and waits for its echo. An error
// wrapping ctx.Err() means the kernel's heartbeat did not answer in time
// (the process may be frozen), not that it is dead; a caller that gives up
// on it should restart the kernel. ipykernel echoes from a thread of its own,
// so a busy cell does not delay the echo.
func (c *Client) Heartbeat(ctx context.Context) error {
	if err := c.usable(); err != nil {
		return err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	p := hbPing{payload: []byte(hex.EncodeToString(b[:])), reply: make(chan error, 1)}
	select {
	case c.hbReq <- p:
	case <-c.dead:
		return fmt.Errorf("heartbeat: %w", c.Err())
	case <-c.closing:
		return ErrClosed
	case <-ctx.Done():
		// The previous ping is still unanswered.
		return fmt.Errorf("jupyter: heartbeat: %w", ctx.Err())
	}
	select {
	case err := <-p.reply:
		return err
	case <-c.dead:
		return fmt.Errorf("heartbeat: %w", c.Err())
	case <-c.closing:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("jupyter: heartbeat: %w", ctx.Err())
	}
}

// heartbeatLoop owns the REQ socket's writes, whose strict send-then-receive
// order allows one ping in flight: a ping that times out keeps the loop
// busy until its echo arrives, and Heartbeat calls meanwhile time out too.
// Echoes that match no ping (stale or forged) are dropped.
func (c *Client) heartbeatLoop() {
	defer c.wg.Done()
	for {
		var p hbPing
		select {
		case p = <-c.hbReq:
		case <-c.closing:
			return
		}
		// REQ puts an empty delimiter frame before the request.
		if err := c.hb.WriteMessage([]byte{}, p.payload); err != nil {
			select {
			case <-c.closing:
				return
			default:
			}
			_ = c.hb.Close()
			c.markDead(fmt.Errorf("hb socket: write: %w", err))
			p.reply <- fmt.Errorf("heartbeat: %w", c.Err())
			return
		}
		for answered := false; !answered; {
			select {
			case echo := <-c.hbEcho:
				if len(echo) == 1 && string(echo[0]) == string(p.payload) {
					p.reply <- nil
					answered = true
				} else {
					c.log.Debug("jupyter: dropped a heartbeat echo that matches no ping", "frames", len(echo))
				}
			case <-c.dead:
				p.reply <- fmt.Errorf("heartbeat: %w", c.Err())
				return
			case <-c.closing:
				return
			}
		}
	}
}

// hbReadLoop reads the heartbeat socket all the time, not only while a ping
// is out, so that whatever the kernel's end writes there is bounded and
// checked like the other sockets' traffic.
func (c *Client) hbReadLoop() {
	defer c.wg.Done()
	defer c.recoverReader("hb", c.hb)
	for {
		frames, err := c.hb.ReadMessage()
		if err != nil {
			c.readFailed("hb", c.hb, err)
			return
		}
		if len(frames) < 1 || len(frames[0]) != 0 {
			c.log.Debug("jupyter: dropped a heartbeat reply without the REQ delimiter")
			continue
		}
		select {
		case c.hbEcho <- frames[1:]:
		default: // an echo nobody waits for
		}
	}
}

// Close closes the sockets and stops every goroutine of the client, waiting
// for them to exit. It does not stop the kernel (see Shutdown). Executions
// still waited on return ErrClosed. Close is safe to call twice.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.closing)
		c.closeConns()
		c.wg.Wait()
	})
	return nil
}

// closeConns closes all four connections, ignoring errors: after a
// kernel's death they are already closed, and Close has nobody to report to
// that could act on it.
func (c *Client) closeConns() {
	for _, conn := range []*zmtp.Conn{c.shell, c.control, c.iopub, c.hb} {
		if conn != nil {
			_ = conn.Close()
		}
	}
}
