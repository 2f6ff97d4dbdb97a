package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Reply statuses of execute_reply, as found in Output.Status.
const (
	StatusOK      = "ok"
	StatusError   = "error"
	StatusAborted = "aborted"
)

// ExecOptions are the per-cell knobs of an execute_request. The zero value is
// what a notebook sends for a cell, except that an error does not abort the
// cells queued behind it.
type ExecOptions struct {
	// StopOnError asks the kernel to abort cells queued behind this one if
	// it fails. It is off by default: with it on, ipykernel sometimes
	// answers the next cell sent right after an error (a KeyboardInterrupt
	// especially) with "aborted" while it drains its queue.
	StopOnError bool
	// Silent runs the cell without broadcasting output or counting it.
	Silent bool
	// SkipHistory leaves the cell out of the history and the execution
	// counter (store_history: false). Without history the last
	// expression's value is still sent as execute_result.
	SkipHistory bool
	// UserExpressions are evaluated by the kernel after the cell's code,
	// in its namespace, when the code ran without an exception; their
	// results, keyed by name, come back in Output.UserExpressions.
	UserExpressions map[string]string

	// OnOutput, when set, receives each output message of the cell as it
	// arrives (see Msg), in order, on the client's iopub reader: the
	// client reads nothing more from iopub until it returns, so it holds
	// one message at a time and a slow OnOutput slows the kernel down
	// instead of growing a buffer. OnOutput must return once the caller
	// stops caring (it must not block for ever, or Close waits on it) and
	// must not call the client's methods. The Execution then keeps none of
	// the output itself: Output carries the reply's fields and Error only.
	// When nil, the Execution gathers the output into Output as a notebook
	// shows it.
	OnOutput func(Msg)
	// MaxOutput bounds the output handed on, in bytes as Msg.Size counts
	// them. A message is handed on whole while less than MaxOutput has
	// been (so what was handed on can exceed it by one message, which the
	// caller cuts); after that the cell's stream, display and result
	// messages are dropped without being decoded and Execution.Over is
	// closed at the first one. Zero means no bound.
	MaxOutput int64
}

// Bundle is a Jupyter MIME bundle: data keyed by MIME type, plus metadata,
// with each value kept as the raw JSON the kernel sent. Text types and
// binary types such as image/png are JSON strings (binary ones base64, as on
// the wire); application/json and similar are objects. The maps are never
// modified after the bundle is built, so copies may share them.
type Bundle struct {
	Data     map[string]json.RawMessage `json:"data"`
	Metadata map[string]json.RawMessage `json:"metadata,omitempty"`
}

// Text returns the value for mime decoded as a JSON string (for image/png
// that is the base64 text). ok is false when mime is absent or not a string.
func (b Bundle) Text(mime string) (s string, ok bool) {
	raw, ok := b.Data[mime]
	if !ok {
		return "", false
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// size is what the bundle counts against ExecOptions.MaxOutput: the bytes
// of its data values, as JSON.
func (b Bundle) size() int64 {
	var n int64
	for _, v := range b.Data {
		n += int64(len(v))
	}
	return n
}

// Display is one display_data output of a cell.
type Display struct {
	Bundle
	// DisplayID is transient.display_id, set when the display can be
	// updated later with update_display_data.
	DisplayID string `json:"display_id,omitempty"`
	// IsUpdate is true when this entry came from an update_display_data
	// whose display this cell did not show (it was shown by an earlier
	// cell). Updates of a display shown by this cell replace that entry in
	// place instead, as a notebook does. It is set in Output.Displays only,
	// never in a Msg.
	IsUpdate bool `json:"is_update,omitempty"`
}

// ExecuteResult is the value of a cell's last expression.
type ExecuteResult struct {
	Bundle
	ExecutionCount int `json:"execution_count"`
}

// ExecError is an exception raised by a cell. Traceback lines carry the
// kernel's ANSI colour codes.
type ExecError struct {
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// MsgKind says what an output Msg carries.
type MsgKind uint8

// Kinds of Msg, one per iopub message type of a cell's output.
const (
	// MsgStream is a stream message: Stream ("stdout" or "stderr") and Text.
	MsgStream MsgKind = iota + 1
	// MsgDisplay is display_data: Display.
	MsgDisplay
	// MsgUpdateDisplay is update_display_data: Display, whose DisplayID
	// names the display (of this cell or an earlier one) it replaces.
	MsgUpdateDisplay
	// MsgClear is clear_output: Wait says the erasure waits for the next
	// output, so that a redrawn frame replaces the last without flicker.
	MsgClear
	// MsgResult is execute_result: Result.
	MsgResult
	// MsgError is the iopub error message: Error. Output.Error keeps it too.
	MsgError
)

// Msg is one output message of a cell, decoded.
type Msg struct {
	Kind    MsgKind
	Stream  string // MsgStream: "stdout" or "stderr"
	Text    string // MsgStream
	Display *Display
	Wait    bool // MsgClear
	Result  *ExecuteResult
	Error   *ExecError
}

// Size is what m counts against ExecOptions.MaxOutput: the bytes of its
// text, or of its bundle's data values as JSON. Clear and error messages
// count nothing.
func (m Msg) Size() int64 {
	switch {
	case m.Kind == MsgStream:
		return int64(len(m.Text))
	case m.Display != nil:
		return m.Display.size()
	case m.Result != nil:
		return m.Result.size()
	}
	return 0
}

// Output is what a cell produced, in the shape a caller wants rather than
// message by message. With ExecOptions.OnOutput set, only the reply's
// fields (Status, Aborted, ExecutionCount, UserExpressions, Complete) and
// Error are filled in; the rest went to OnOutput.
//
// clear_output is applied as a notebook applies it: it erases the Stdout,
// Stderr and Displays gathered so far for this cell (never Result or Error,
// which only come at the end). With wait=true the erasure is deferred until
// the next output arrives, so a cell that redraws a progress bar ends with
// only its last frame.
type Output struct {
	Stdout   string
	Stderr   string
	Displays []Display
	// Result is the execute_result, nil when the last statement had no value.
	Result *ExecuteResult
	// Error is the exception the cell raised, from the iopub error message
	// (or from execute_reply when that message was lost).
	Error *ExecError
	// Status is execute_reply's status: StatusOK, StatusError or
	// StatusAborted; "" until the reply arrives.
	Status string
	// Aborted is true when the kernel skipped the cell (Status is aborted)
	// because an earlier cell failed with stop_on_error.
	Aborted bool
	// ExecutionCount is the kernel's execution counter from execute_reply.
	ExecutionCount int
	// UserExpressions are the results of ExecOptions.UserExpressions, by
	// name, as the kernel sent them: {"status": "ok", "data": {...}} or an
	// error. Nil when the cell raised (the kernel then evaluates none).
	UserExpressions map[string]json.RawMessage
	// Complete is true when both execute_reply and the iopub status idle for
	// this cell have arrived (and, for a kernel with Options.StdioBarrier,
	// the barrier's line after them): nothing more will be added.
	Complete bool
}

// executeRequest is the content of execute_request.
type executeRequest struct {
	Code            string            `json:"code"`
	Silent          bool              `json:"silent"`
	StoreHistory    bool              `json:"store_history"`
	UserExpressions map[string]string `json:"user_expressions"`
	AllowStdin      bool              `json:"allow_stdin"`
	StopOnError     bool              `json:"stop_on_error"`
}

// Execution is a cell sent to the kernel. Wait for it as often as needed:
// a Wait cut short by its context leaves the execution running, so a caller
// can Interrupt the kernel and Wait again for the cell to finish.
type Execution struct {
	c     *Client
	msgID string
	done  chan struct{} // closed when Output.Complete becomes true
	over  chan struct{} // closed when the first message is dropped for MaxOutput

	// Touched only by the iopub reader, one message at a time.
	onOutput func(Msg)  // the caller's, or col.add
	max      int64      // ExecOptions.MaxOutput; 0 is no bound
	used     int64      // bytes handed on
	dropping bool       // over is closed
	col      *collector // nil when the caller takes the output

	mu       sync.Mutex
	out      Output // the reply's fields and Error; col holds the rest
	gotReply bool
	gotIdle  bool
	barrier  barrierState // Options.StdioBarrier's progress for this cell
}

// barrierState is how far a cell of a kernel with Options.StdioBarrier is
// from complete once its reply and idle are in.
type barrierState uint8

const (
	barrierNone   barrierState = iota // not sent (or the kernel needs none)
	barrierSent                       // sent; the cell waits for its line
	barrierPassed                     // its line arrived: every earlier line is in
)

func newExecution(c *Client, msgID string, opts ExecOptions) *Execution {
	e := &Execution{c: c, msgID: msgID, done: make(chan struct{}), over: make(chan struct{}), onOutput: opts.OnOutput, max: opts.MaxOutput}
	if e.onOutput == nil {
		e.col = &collector{mu: &e.mu}
		e.onOutput = e.col.add
	}
	return e
}

// MsgID is the msg_id of the execute_request; every message of this cell
// carries it as its parent.
func (e *Execution) MsgID() string { return e.msgID }

// Done is closed once the cell is complete (execute_reply and status idle
// have both arrived, and the stdio barrier's line when the kernel has one).
// Every output message of the cell has been handed to
// ExecOptions.OnOutput, and OnOutput has returned, before it closes.
func (e *Execution) Done() <-chan struct{} { return e.done }

// Over is closed when the cell's output passed ExecOptions.MaxOutput and
// a message was dropped for it. The cell goes on running: stop it.
func (e *Execution) Over() <-chan struct{} { return e.over }

// Output returns a snapshot of what the cell has produced so far; it is
// safe to call at any time, from any goroutine.
func (e *Execution) Output() Output {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.out
	if e.out.Error != nil {
		x := *e.out.Error
		o.Error = &x
	}
	if e.col != nil {
		e.col.snapshotLocked(&o)
	}
	return o
}

// Wait blocks until the cell completes and returns its output. If ctx ends
// first it returns the output gathered so far and ctx.Err(); the cell keeps
// running and Wait may be called again. If the kernel dies it returns the
// partial output and an error matching ErrKernelDead; after Close it returns
// ErrClosed. A cell that raised an exception is not an error here: see
// Output.Error and Output.Status.
func (e *Execution) Wait(ctx context.Context) (Output, error) {
	select {
	case <-e.done:
		return e.Output(), nil
	default:
	}
	select {
	case <-e.done:
		return e.Output(), nil
	case <-e.c.dead:
		// The cell may have completed just before the kernel went away;
		// prefer its full output to a death report.
		select {
		case <-e.done:
			return e.Output(), nil
		default:
		}
		return e.Output(), fmt.Errorf("execute %s: %w", e.msgID, e.c.Err())
	case <-e.c.closing:
		return e.Output(), ErrClosed
	case <-ctx.Done():
		return e.Output(), ctx.Err()
	}
}

// streamContent is the content of a stream message.
type streamContent struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

// displayContent is the content of display_data, update_display_data and
// execute_result.
type displayContent struct {
	Data      map[string]json.RawMessage `json:"data"`
	Metadata  map[string]json.RawMessage `json:"metadata"`
	Transient struct {
		DisplayID string `json:"display_id"`
	} `json:"transient"`
	ExecutionCount int `json:"execution_count"`
}

// statusContent is the content of an iopub status message.
type statusContent struct {
	ExecutionState string `json:"execution_state"`
}

// executeReply is the content of execute_reply; an error reply repeats the
// exception.
type executeReply struct {
	Status          string                     `json:"status"`
	ExecutionCount  int                        `json:"execution_count"`
	Ename           string                     `json:"ename"`
	Evalue          string                     `json:"evalue"`
	Traceback       []string                   `json:"traceback"`
	UserExpressions map[string]json.RawMessage `json:"user_expressions"`
}

// counted are the message types whose size counts against MaxOutput.
var counted = map[string]bool{"stream": true, "display_data": true, "update_display_data": true, "execute_result": true}

// onIOPub hands one iopub message whose parent is this cell on, or notes
// the status idle that ends it. It runs on the iopub reader only, so the
// budget fields need no lock, and OnOutput is called without one. It
// reports whether the cell is now complete.
func (e *Execution) onIOPub(m message) (complete bool, err error) {
	t := m.Header.MsgType
	if t == "status" {
		var c statusContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if c.ExecutionState == "idle" {
			e.gotIdle = true
		}
		return e.completeLocked(), nil
	}
	return false, e.handOn(m)
}

// handOn decodes one output message of this cell, counts it against
// MaxOutput and hands it to OnOutput. It runs on the iopub reader only.
func (e *Execution) handOn(m message) error {
	if counted[m.Header.MsgType] && e.pastBudget() {
		return nil
	}
	msg, err := decodeOutput(m)
	if err != nil || msg.Kind == 0 {
		return err
	}
	e.take(msg)
	return nil
}

// pastBudget reports whether the cell's output is past MaxOutput; past it
// nothing is decoded: the flood costs the host one message's read at a
// time, and the caller stops the cell.
func (e *Execution) pastBudget() bool {
	if e.max == 0 || e.used < e.max {
		return false
	}
	if !e.dropping {
		e.dropping = true
		close(e.over)
	}
	return true
}

// take hands one decoded output message on. It runs on the iopub reader
// only.
func (e *Execution) take(msg Msg) {
	e.used += msg.Size()
	if msg.Kind == MsgError {
		e.mu.Lock()
		x := *msg.Error
		e.out.Error = &x
		e.mu.Unlock()
	}
	e.onOutput(msg)
}

// decodeOutput decodes an output message; its Kind is 0 for a type that
// is not output (execute_input, say).
func decodeOutput(m message) (Msg, error) {
	switch t := m.Header.MsgType; t {
	case "stream":
		c, err := decodeStream(m.Content)
		if err != nil {
			return Msg{}, err
		}
		return Msg{Kind: MsgStream, Stream: c.Name, Text: c.Text}, nil
	case "display_data", "update_display_data":
		var c displayContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return Msg{}, err
		}
		kind := MsgDisplay
		if t == "update_display_data" {
			kind = MsgUpdateDisplay
		}
		return Msg{Kind: kind, Display: &Display{Bundle: Bundle{Data: c.Data, Metadata: c.Metadata}, DisplayID: c.Transient.DisplayID}}, nil
	case "execute_result":
		var c displayContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return Msg{}, err
		}
		return Msg{Kind: MsgResult, Result: &ExecuteResult{Bundle: Bundle{Data: c.Data, Metadata: c.Metadata}, ExecutionCount: c.ExecutionCount}}, nil
	case "error":
		var c ExecError
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return Msg{}, err
		}
		return Msg{Kind: MsgError, Error: &c}, nil
	case "clear_output":
		var c struct {
			Wait bool `json:"wait"`
		}
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return Msg{}, err
		}
		return Msg{Kind: MsgClear, Wait: c.Wait}, nil
	}
	return Msg{}, nil
}

// onShell folds the execute_reply into the output and reports whether the
// cell is now complete.
func (e *Execution) onShell(m message) (complete bool, err error) {
	if m.Header.MsgType != "execute_reply" {
		return false, nil
	}
	var c executeReply
	if err := json.Unmarshal(m.Content, &c); err != nil {
		return false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gotReply = true
	e.out.Status = c.Status
	e.out.Aborted = c.Status == StatusAborted
	e.out.ExecutionCount = c.ExecutionCount
	e.out.UserExpressions = c.UserExpressions
	if c.Status == StatusError && e.out.Error == nil {
		e.out.Error = &ExecError{Ename: c.Ename, Evalue: c.Evalue, Traceback: c.Traceback}
	}
	return e.completeLocked(), nil
}

// completeLocked closes done the first time both halves have arrived
// (and, for a kernel with Options.StdioBarrier, the barrier's line after
// them).
func (e *Execution) completeLocked() bool {
	if !e.gotReply || !e.gotIdle {
		return false
	}
	switch {
	case e.c.barrier == nil || e.barrier == barrierPassed:
	case e.barrier == barrierNone:
		e.barrier = barrierSent
		// Not on this reader: the send may wait for the kernel to read,
		// and the kernel may be waiting for this reader.
		go e.sendBarrier()
		return false
	default:
		return false
	}
	if !e.out.Complete {
		e.out.Complete = true
		close(e.done)
	}
	return true
}

// collector gathers a cell's output as a notebook shows it, for callers
// that set no ExecOptions.OnOutput. It shares the Execution's lock, so
// Output can take a snapshot while the cell runs.
type collector struct {
	mu           *sync.Mutex
	stdout       strings.Builder
	stderr       strings.Builder
	displays     []Display
	result       *ExecuteResult
	pendingClear bool // clear_output(wait=True) seen; erase at next output
}

func (c *collector) add(m Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Kind == MsgClear {
		c.pendingClear = m.Wait
		if !m.Wait {
			c.clear()
		}
		return
	}
	if c.pendingClear {
		c.pendingClear = false
		c.clear()
	}
	switch m.Kind {
	case MsgStream:
		switch m.Stream {
		case "stdout":
			c.stdout.WriteString(m.Text)
		case "stderr":
			c.stderr.WriteString(m.Text)
		}
	case MsgDisplay:
		c.displays = append(c.displays, *m.Display)
	case MsgUpdateDisplay:
		if !c.update(*m.Display) {
			d := *m.Display
			d.IsUpdate = true
			c.displays = append(c.displays, d)
		}
	case MsgResult:
		c.result = m.Result
	}
}

func (c *collector) clear() {
	c.stdout = strings.Builder{}
	c.stderr = strings.Builder{}
	c.displays = nil
}

// update replaces every display of this cell that has d's display id and
// reports whether there was one.
func (c *collector) update(d Display) bool {
	if d.DisplayID == "" {
		return false
	}
	found := false
	for i := range c.displays {
		if c.displays[i].DisplayID == d.DisplayID {
			c.displays[i] = d
			found = true
		}
	}
	return found
}

// snapshotLocked copies what was gathered into o; c.mu is held.
func (c *collector) snapshotLocked(o *Output) {
	// strings.Builder only ever appends, so the strings it returned earlier
	// stay valid while the cell keeps writing.
	o.Stdout = c.stdout.String()
	o.Stderr = c.stderr.String()
	o.Displays = append([]Display(nil), c.displays...)
	if c.result != nil {
		r := *c.result
		o.Result = &r
	}
}
