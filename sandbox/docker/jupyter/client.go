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
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/uuid"
)

// Errors returned by Client and Execution.
var (
	// ErrKernelDead means the kernel's sockets closed under the client: the
	// process exited, was killed (OOM, SIGKILL, os._exit) or was shut down.
	// The kernel's state is gone and this client cannot recover it (ZMQ
	// sockets here do not reconnect): Close the client, start a new kernel
	// and Dial it. Client.Err says what was observed.
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
}

// Client speaks the Jupyter messaging protocol to one kernel over its
// shell, control, iopub and hb sockets. Its methods are safe for concurrent
// use; the kernel itself runs one cell at a time, queueing the rest.
type Client struct {
	log  *slog.Logger
	sess session

	shell, control, iopub, hb zmq4.Socket
	shellMu, controlMu        sync.Mutex // zmq4 does not promise that concurrent Sends keep frames together

	mu      sync.Mutex
	pending map[string]handler // by request msg_id

	hbReq chan hbPing

	dead     chan struct{} // closed when the kernel is found dead
	deadOnce sync.Once
	deadErr  error // set before dead is closed

	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup

	shutdownSent chan struct{} // closed when Shutdown sent its request, so the EOF that follows reads as a shutdown
	shutdownOnce sync.Once
}

// handler receives the messages whose parent is a request of ours. onIOPub
// and onShell (shell and control replies) report whether the request is
// finished, so the router can forget it.
type handler interface {
	onIOPub(message) (done bool, err error)
	onShell(message) (done bool, err error)
}

// inbound is a decoded message and the channel it came on.
type inbound struct {
	ch  string // "shell", "control" or "iopub"
	msg message
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
// Dial waits, bounded by ctx, for the kernel to bind its sockets: a plain
// connect is tried first so that a missing or refused socket is retried
// every 10 ms and a permission error (EACCES) or bad path fails at once
// with the real cause, which zmq4's own retry loop would hide behind a
// hang. Dial does not wait for the kernel to answer; call WaitReady.
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
	eps := make(map[string]endpoint, 4)
	for name, port := range map[string]int{"shell": info.ShellPort, "control": info.ControlPort, "iopub": info.IOPubPort, "hb": info.HBPort} {
		ep, err := info.endpoint(hostPrefix, port)
		if err != nil {
			return nil, err
		}
		eps[name] = ep
	}

	c := &Client{
		log:          log,
		sess:         session{id: uuid.NewString(), username: username, signer: signer{key: []byte(info.Key)}},
		pending:      make(map[string]handler),
		hbReq:        make(chan hbPing),
		dead:         make(chan struct{}),
		closing:      make(chan struct{}),
		shutdownSent: make(chan struct{}),
	}
	zlog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	sockOpts := []zmq4.Option{
		zmq4.WithLogger(zlog),
		zmq4.WithDialerRetry(10 * time.Millisecond),
		zmq4.WithDialerMaxRetries(-1),
	}
	// The sockets must outlive ctx, which bounds only the dial, so they get
	// a background lifeline and ctx cancels them through dialSocket.
	bg := context.Background()
	c.iopub = zmq4.NewSub(bg, sockOpts...)
	c.shell = zmq4.NewDealer(bg, sockOpts...)
	c.control = zmq4.NewDealer(bg, sockOpts...)
	c.hb = zmq4.NewReq(bg, sockOpts...)
	// Subscribing before dialling makes zmq4 send the subscription as soon
	// as the connection is up.
	if err := c.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		c.closeSockets()
		return nil, fmt.Errorf("jupyter: subscribe iopub: %w", err)
	}
	// iopub first: the sooner the subscription is live, the fewer early
	// broadcasts are lost.
	for _, s := range []struct {
		name string
		sock zmq4.Socket
	}{{"iopub", c.iopub}, {"shell", c.shell}, {"control", c.control}, {"hb", c.hb}} {
		if err := dialSocket(ctx, s.sock, eps[s.name]); err != nil {
			c.closeSockets()
			return nil, fmt.Errorf("jupyter: dial %s: %w", s.name, err)
		}
	}

	in := map[string]chan inbound{"shell": make(chan inbound, 16), "control": make(chan inbound, 16), "iopub": make(chan inbound, 64)}
	c.wg.Add(5)
	go c.readLoop("shell", c.shell, in["shell"])
	go c.readLoop("control", c.control, in["control"])
	go c.readLoop("iopub", c.iopub, in["iopub"])
	go c.route(in["shell"], in["control"], in["iopub"])
	go c.heartbeatLoop()
	return c, nil
}

// dialSocket probes ep with a plain connect until it answers, then dials it
// with zmq4; ctx bounds both.
func dialSocket(ctx context.Context, sock zmq4.Socket, ep endpoint) error {
	if err := probe(ctx, ep); err != nil {
		return err
	}
	// zmq4's Dial retries forever (WithDialerMaxRetries(-1)) until its
	// socket is closed, so ctx ending closes it.
	stop := context.AfterFunc(ctx, func() { _ = sock.Close() })
	err := sock.Dial(ep.zmq)
	if !stop() {
		// ctx ended while dialling; a connection made at that moment
		// would be left open, so close again now that Dial returned.
		_ = sock.Close()
		return fmt.Errorf("%s: %w", ep.addr, context.Cause(ctx))
	}
	return err
}

// probe connects to ep with the standard library until the kernel accepts.
// A socket not bound yet (ENOENT) or not listening yet (ECONNREFUSED) is
// retried until ctx ends; anything else, EACCES especially, is returned at
// once because waiting cannot fix it.
func probe(ctx context.Context, ep endpoint) error {
	var d net.Dialer
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last error // the last failure not caused by ctx ending
	for {
		conn, err := d.DialContext(ctx, ep.network, ep.addr)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		// The dialer takes ctx's deadline as its own and may report
		// "i/o timeout" just before ctx itself says it ended.
		var ne net.Error
		ended := ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout())
		if !ended {
			if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
				return err
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
			return fmt.Errorf("%s not answering before %w (last error: %v)", ep.addr, context.Cause(ctx), last)
		case <-t.C:
		}
	}
}

// readLoop is the one goroutine that reads sock. A receive error while the
// client is open means the kernel's end closed (pitfall 4): the kernel is
// dead and, without reconnection, so is this client.
func (c *Client) readLoop(name string, sock zmq4.Socket, out chan<- inbound) {
	defer c.wg.Done()
	for {
		msg, err := sock.Recv()
		if err != nil {
			select {
			case <-c.closing:
			default:
				c.markDead(fmt.Errorf("%s socket: %w", name, err))
			}
			return
		}
		m, err := c.sess.decode(msg.Frames)
		if err != nil {
			c.log.Warn("jupyter: dropped message", "channel", name, "err", err)
			continue
		}
		select {
		case out <- inbound{ch: name, msg: m}:
		case <-c.closing:
			return
		}
	}
}

// route dispatches decoded messages to the request they answer, by parent
// msg_id. Messages nobody waits for (status after a finished request, the
// kernel's own starting broadcast) are dropped.
func (c *Client) route(shell, control, iopub <-chan inbound) {
	defer c.wg.Done()
	for {
		var in inbound
		select {
		case in = <-shell:
		case in = <-control:
		case in = <-iopub:
		case <-c.closing:
			return
		}
		parent := in.msg.Parent.MsgID
		c.mu.Lock()
		h := c.pending[parent]
		c.mu.Unlock()
		if h == nil {
			c.log.Debug("jupyter: message for no pending request", "channel", in.ch, "msg_type", in.msg.Header.MsgType, "parent", parent)
			continue
		}
		var done bool
		var err error
		if in.ch == "iopub" {
			done, err = h.onIOPub(in.msg)
		} else {
			done, err = h.onShell(in.msg)
		}
		if err != nil {
			c.log.Warn("jupyter: undecodable content", "channel", in.ch, "msg_type", in.msg.Header.MsgType, "err", err)
		}
		if done {
			c.forget(parent)
		}
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
			c.deadErr = fmt.Errorf("%w: shut down on request (%v)", ErrKernelDead, cause)
		default:
			c.deadErr = fmt.Errorf("%w: %w", ErrKernelDead, cause)
		}
		c.log.Warn("jupyter: kernel dead", "err", c.deadErr)
		close(c.dead)
	})
}

// Dead is closed when the kernel is found dead: one of its sockets closed
// under the client (EOF). It is not closed by Close.
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

// send signs and sends a request with a fresh header on sock.
func (c *Client) send(sock zmq4.Socket, mu *sync.Mutex, h header, content any) error {
	frames, err := c.sess.encode(h, content)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if err := sock.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		return fmt.Errorf("jupyter: send %s: %w", h.MsgType, err)
	}
	return nil
}

// Execute sends code to the kernel as an execute_request and returns at
// once; use the Execution to wait for the output. ctx is checked before
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
	e := &Execution{c: c, msgID: h.MsgID, done: make(chan struct{})}
	// Registered before sending, so no reply can arrive unclaimed.
	c.register(h.MsgID, e)
	err := c.send(c.shell, &c.shellMu, h, executeRequest{
		Code:            code,
		Silent:          opts.Silent,
		StoreHistory:    !opts.SkipHistory,
		UserExpressions: map[string]any{},
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
func (c *Client) request(ctx context.Context, sock zmq4.Socket, mu *sync.Mutex, msgType string, content any, before func()) (message, error) {
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
	if err := c.send(sock, mu, h, content); err != nil {
		return message{}, err
	}
	select {
	case m := <-w.reply:
		return m, nil
	case <-c.dead:
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
	m, err := c.request(ctx, c.control, &c.controlMu, "interrupt_request", struct{}{}, nil)
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
	m, err := c.request(ctx, c.control, &c.controlMu, "shutdown_request", struct {
		Restart bool `json:"restart"`
	}{restart}, func() { c.shutdownOnce.Do(func() { close(c.shutdownSent) }) })
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
		if err := c.send(c.shell, &c.shellMu, h, struct{}{}); err != nil {
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

// heartbeatLoop owns the REQ socket, whose strict send-then-receive order
// allows one ping in flight: a ping that times out keeps the loop busy until
// its echo arrives, and Heartbeat calls meanwhile time out too.
func (c *Client) heartbeatLoop() {
	defer c.wg.Done()
	for {
		var p hbPing
		select {
		case p = <-c.hbReq:
		case <-c.closing:
			return
		}
		if err := c.hb.Send(zmq4.NewMsg(p.payload)); err != nil {
			p.reply <- fmt.Errorf("jupyter: heartbeat send: %w", err)
			continue
		}
		msg, err := c.hb.Recv()
		if err != nil {
			select {
			case <-c.closing:
				return
			default:
			}
			c.markDead(fmt.Errorf("hb socket: %w", err))
			p.reply <- fmt.Errorf("heartbeat: %w", c.Err())
			return
		}
		if len(msg.Frames) != 1 || string(msg.Frames[0]) != string(p.payload) {
			p.reply <- fmt.Errorf("jupyter: heartbeat echo %q does not match ping %q", msg.Bytes(), p.payload)
			continue
		}
		p.reply <- nil
	}
}

// Close closes the sockets and stops every goroutine of the client, waiting
// for them to exit. It does not stop the kernel (see Shutdown). Executions
// still waited on return ErrClosed. Close is safe to call twice.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		close(c.closing)
		c.closeSockets()
		c.wg.Wait()
	})
	return nil
}

// closeSockets closes all four sockets, ignoring errors: after a kernel's
// death their connections are already closed, and Close has nobody to
// report to that could act on it.
func (c *Client) closeSockets() {
	for _, s := range []zmq4.Socket{c.shell, c.control, c.iopub, c.hb} {
		if s != nil {
			_ = s.Close()
		}
	}
}
