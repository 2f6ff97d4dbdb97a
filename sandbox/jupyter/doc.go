// Package jupyter is a client for the Jupyter messaging protocol 5.3 over ZMQ, for driving one ipykernel.
//
// It speaks to the kernel's shell and control (DEALER), iopub (SUB) and
// heartbeat (REQ) sockets with its own ZMTP client (package zmtp), over ipc
// (unix socket), tcp, or any connection Options.Dial returns. Everything the
// kernel sends is read within Options.Limits before it is buffered, since a
// cell can write raw bytes to the kernel's end of each connection; a
// violation kills that kernel's client only.
//
// It is built around the pitfalls in shared/notes/jupyter-over-zmq.md: the
// HMAC key is the ASCII bytes of the hex key; dialling retries only a
// missing or refused socket, so a permission error surfaces instead of a
// hang; one goroutine reads each socket and hands each message on itself; a
// dead kernel is detected by a receive error or a protocol violation;
// readiness is proven by an iopub message answering a kernel_info_request;
// a cell is complete only when both execute_reply and status idle have
// arrived; cells run with stop_on_error false.
//
// # Usage
//
// The kernel reads a connection file whose ip is the socket path prefix as
// the kernel sees it; the client dials the same sockets through the host's
// path to the (bind-mounted) directory:
//
//	info := jupyter.NewConnInfo("/run/kernel/k") // ipc, ports 1..5, random key
//	b, _ := json.Marshal(info)                   // write as <hostdir>/conn.json for ipykernel -f
//	c, err := jupyter.Dial(ctx, info, "/tmp/triad-0/ab12cd/k", jupyter.Options{Logger: log})
//	defer c.Close()
//	err = c.WaitReady(ctx)
//	ex, err := c.Execute(ctx, "x*2", jupyter.ExecOptions{})
//	out, err := ex.Wait(ctx) // ctx ended: partial output and ctx.Err(); Interrupt, then Wait again
//
// A caller that must not hold a cell's output (sandbox/docker) takes it
// message by message instead: ExecOptions.OnOutput is called on the iopub
// reader for each stream, display, display update, clear_output, result and
// error message as it arrives, and the client reads nothing more until it
// returns; ExecOptions.MaxOutput bounds what is handed on, after which the
// cell's output is dropped undecoded and Execution.Over closes:
//
//	ex, err := c.Execute(ctx, code, jupyter.ExecOptions{OnOutput: func(m jupyter.Msg) { … }, MaxOutput: 64 << 20})
//
// # API
//
//	func NewConnInfo(ipPrefix string) ConnInfo
//	func Dial(ctx context.Context, info ConnInfo, hostPrefix string, opts Options) (*Client, error)
//	    // Options: Logger, Username, Limits (zmtp.Limits), Dial (one net.Conn per socket)
//	func (c *Client) WaitReady(ctx context.Context) error
//	func (c *Client) Execute(ctx context.Context, code string, opts ExecOptions) (*Execution, error)
//	func (c *Client) Interrupt(ctx context.Context) error
//	func (c *Client) Shutdown(ctx context.Context, restart bool) error
//	func (c *Client) Heartbeat(ctx context.Context) error
//	func (c *Client) Dead() <-chan struct{}
//	func (c *Client) Err() error // nil, or an error matching ErrKernelDead
//	func (c *Client) Close() error
//	func (e *Execution) Wait(ctx context.Context) (Output, error)
//	func (e *Execution) Output() Output // snapshot so far
//	func (e *Execution) Done() <-chan struct{}
//	func (e *Execution) Over() <-chan struct{} // MaxOutput passed
//	func (e *Execution) MsgID() string
//	func (b Bundle) Text(mime string) (string, bool)
//
// Output holds Stdout, Stderr, Displays (display_data and
// update_display_data bundles), Result (execute_result), Error (ename,
// evalue, traceback), Status ("ok", "error", "aborted"), Aborted,
// ExecutionCount, UserExpressions and Complete; with OnOutput set only the
// reply's fields and Error. Msg is one output message: Kind (MsgStream,
// MsgDisplay, MsgUpdateDisplay, MsgClear, MsgResult, MsgError), Stream and
// Text, Display, Wait, Result, Error, and Size. Bundle values are the raw
// JSON the kernel sent, so image/png is its base64 string; Bundle has the
// same shape as sandbox.Bundle.
//
// Errors: ErrKernelDead (the kernel is gone: close the client, start a new
// kernel, Dial again; Err also wraps a *zmtp.ViolationError when the kernel
// broke the protocol or the Limits) and ErrClosed (Close was called). A cell
// that raises is not an error: it is reported in Output.Error.
package jupyter
