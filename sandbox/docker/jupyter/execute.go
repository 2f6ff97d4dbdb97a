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

// Display is one display_data output of a cell.
type Display struct {
	Bundle
	// DisplayID is transient.display_id, set when the display can be
	// updated later with update_display_data.
	DisplayID string `json:"display_id,omitempty"`
	// IsUpdate is true when this entry came from an update_display_data
	// whose display this cell did not show (it was shown by an earlier
	// cell). Updates of a display shown by this cell replace that entry in
	// place instead, as a notebook does.
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

// Output is what a cell produced, in the shape a caller wants rather than
// message by message.
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
	// Complete is true when both execute_reply and the iopub status idle for
	// this cell have arrived: nothing more will be added.
	Complete bool
}

// executeRequest is the content of execute_request.
type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	StopOnError     bool           `json:"stop_on_error"`
}

// Execution is a cell sent to the kernel. Wait for it as often as needed:
// a Wait cut short by its context leaves the execution running, so a caller
// can Interrupt the kernel and Wait again for the cell to finish.
type Execution struct {
	c     *Client
	msgID string
	done  chan struct{} // closed when Output.Complete becomes true

	mu           sync.Mutex
	out          Output
	stdout       strings.Builder
	stderr       strings.Builder
	gotReply     bool
	gotIdle      bool
	pendingClear bool // clear_output(wait=True) seen; erase at next output
}

// MsgID is the msg_id of the execute_request; every message of this cell
// carries it as its parent.
func (e *Execution) MsgID() string { return e.msgID }

// Done is closed once the cell is complete (execute_reply and status idle
// have both arrived).
func (e *Execution) Done() <-chan struct{} { return e.done }

// Output returns a snapshot of what the cell has produced so far; it is
// safe to call at any time, from any goroutine.
func (e *Execution) Output() Output {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapshotLocked()
}

func (e *Execution) snapshotLocked() Output {
	o := e.out
	// strings.Builder only ever appends, so the strings it returned earlier
	// stay valid while the cell keeps writing.
	o.Stdout = e.stdout.String()
	o.Stderr = e.stderr.String()
	o.Displays = append([]Display(nil), e.out.Displays...)
	if e.out.Result != nil {
		r := *e.out.Result
		o.Result = &r
	}
	if e.out.Error != nil {
		x := *e.out.Error
		o.Error = &x
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
	Status         string   `json:"status"`
	ExecutionCount int      `json:"execution_count"`
	Ename          string   `json:"ename"`
	Evalue         string   `json:"evalue"`
	Traceback      []string `json:"traceback"`
}

// onIOPub folds one iopub message whose parent is this cell into the output.
// It reports whether the cell is now complete.
func (e *Execution) onIOPub(m message) (complete bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch m.Header.MsgType {
	case "status":
		var c statusContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		if c.ExecutionState == "idle" {
			e.gotIdle = true
		}
	case "stream":
		var c streamContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		e.applyPendingClearLocked()
		switch c.Name {
		case "stdout":
			e.stdout.WriteString(c.Text)
		case "stderr":
			e.stderr.WriteString(c.Text)
		}
	case "display_data", "update_display_data":
		var c displayContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		e.applyPendingClearLocked()
		d := Display{Bundle: Bundle{Data: c.Data, Metadata: c.Metadata}, DisplayID: c.Transient.DisplayID}
		if m.Header.MsgType == "update_display_data" {
			if e.updateDisplayLocked(d) {
				break
			}
			d.IsUpdate = true
		}
		e.out.Displays = append(e.out.Displays, d)
	case "execute_result":
		var c displayContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		e.applyPendingClearLocked()
		e.out.Result = &ExecuteResult{Bundle: Bundle{Data: c.Data, Metadata: c.Metadata}, ExecutionCount: c.ExecutionCount}
	case "error":
		var c ExecError
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		e.applyPendingClearLocked()
		e.out.Error = &c
	case "clear_output":
		var c struct {
			Wait bool `json:"wait"`
		}
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		if c.Wait {
			e.pendingClear = true
		} else {
			e.pendingClear = false
			e.clearLocked()
		}
	}
	return e.completeLocked(), nil
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
	if c.Status == StatusError && e.out.Error == nil {
		e.out.Error = &ExecError{Ename: c.Ename, Evalue: c.Evalue, Traceback: c.Traceback}
	}
	return e.completeLocked(), nil
}

// completeLocked closes done the first time both halves have arrived.
func (e *Execution) completeLocked() bool {
	if !e.gotReply || !e.gotIdle {
		return false
	}
	if !e.out.Complete {
		e.out.Complete = true
		close(e.done)
	}
	return true
}

func (e *Execution) applyPendingClearLocked() {
	if e.pendingClear {
		e.pendingClear = false
		e.clearLocked()
	}
}

func (e *Execution) clearLocked() {
	e.stdout = strings.Builder{}
	e.stderr = strings.Builder{}
	e.out.Displays = nil
}

// updateDisplayLocked replaces every display of this cell that has d's
// display id and reports whether there was one.
func (e *Execution) updateDisplayLocked(d Display) bool {
	if d.DisplayID == "" {
		return false
	}
	found := false
	for i := range e.out.Displays {
		if e.out.Displays[i].DisplayID == d.DisplayID {
			e.out.Displays[i] = d
			found = true
		}
	}
	return found
}
