package jupyter

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
)

// A kernel with Options.StdioBarrier may publish a cell's console output
// after the cell's status idle: Deno's kernel queues console.log lines to a
// task of its own, which publishes them under whichever request it last
// started, and nothing orders that task before the idle. A cell that
// completed at reply and idle would lose those lines (DECISIONS, "A cell's
// late stdout").
//
// So once such a cell's reply and idle are in, the client runs the
// barrier: a silent request whose code writes one line holding a fresh
// token through the same queue. The queue is first in, first out, so when
// that line arrives every line the cell wrote has arrived before it: with
// the cell's parent (still registered, so handed on) or, if the queue's
// task ran after the barrier started, with the barrier's (handed to the
// cell here). The cell completes when the line, the barrier's reply and
// its idle are all in. No clock is involved.

// sendBarrier sends e's barrier request. It runs on a goroutine of its
// own, once per cell.
func (e *Execution) sendBarrier() {
	c := e.c
	var r [16]byte
	_, _ = rand.Read(r[:])
	b := &stdioBarrier{e: e, token: "triad-barrier-" + hex.EncodeToString(r[:])}
	h := c.sess.newHeader("execute_request")
	c.register(h.MsgID, b)
	err := c.send("shell", c.shell, h, executeRequest{
		Code:            c.barrier(b.token),
		Silent:          true,
		StoreHistory:    false,
		UserExpressions: map[string]string{},
	})
	if err != nil {
		// The client is dead or closed, which Wait reports; should it be
		// neither, the cell completes with what it has rather than hang.
		c.forget(h.MsgID)
		c.log.Warn("jupyter: the stdio barrier was not sent", "cell", e.msgID, "err", err)
		b.pass()
	}
}

// stdioBarrier receives the messages of one cell's barrier request.
type stdioBarrier struct {
	e     *Execution
	token string

	mu       sync.Mutex
	seen     bool // the token's line arrived
	gotReply bool
	gotIdle  bool
	failed   bool // the barrier's code raised: its line will never come
	passed   bool
}

func (b *stdioBarrier) onIOPub(m message) (bool, error) {
	switch t := m.Header.MsgType; t {
	case "status":
		var c statusContent
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return false, err
		}
		if c.ExecutionState != "idle" {
			return false, nil
		}
		b.mu.Lock()
		b.gotIdle = true
		b.mu.Unlock()
	case "error":
		b.mu.Lock()
		b.failed = true
		b.mu.Unlock()
	case "stream":
		if b.isSeen() {
			return false, nil
		}
		c, err := decodeStream(m.Content)
		if err != nil {
			return false, err
		}
		before, after, found := strings.Cut(c.Text, b.token)
		if !found {
			// The cell's own line, published after the barrier started.
			return false, b.e.handOn(m)
		}
		b.mu.Lock()
		b.seen = true
		b.mu.Unlock()
		if rest := before + strings.TrimPrefix(after, "\n"); rest != "" && !b.e.pastBudget() {
			b.e.take(Msg{Kind: MsgStream, Stream: c.Name, Text: rest})
		}
	case "display_data", "update_display_data", "clear_output":
		if !b.isSeen() {
			return false, b.e.handOn(m)
		}
		return false, nil
	default:
		return false, nil
	}
	return b.check(), nil
}

func (b *stdioBarrier) onShell(m message) (bool, error) {
	if m.Header.MsgType != "execute_reply" {
		return false, nil
	}
	var c executeReply
	if err := json.Unmarshal(m.Content, &c); err != nil {
		return false, err
	}
	b.mu.Lock()
	b.gotReply = true
	if c.Status != StatusOK {
		b.failed = true
	}
	b.mu.Unlock()
	return b.check(), nil
}

func (b *stdioBarrier) isSeen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen
}

// check passes the barrier once its line (or its failure), reply and idle
// are in, and reports whether it is done.
func (b *stdioBarrier) check() bool {
	b.mu.Lock()
	ready := b.gotReply && b.gotIdle && (b.seen || b.failed)
	if b.failed && !b.seen && ready {
		b.e.c.log.Warn("jupyter: the stdio barrier raised; the cell completes without it", "cell", b.e.msgID)
	}
	b.mu.Unlock()
	if ready {
		b.pass()
	}
	return ready
}

// pass completes the cell and forgets it.
func (b *stdioBarrier) pass() {
	b.mu.Lock()
	first := !b.passed
	b.passed = true
	b.mu.Unlock()
	if !first {
		return
	}
	e := b.e
	e.mu.Lock()
	e.barrier = barrierPassed
	e.completeLocked()
	e.mu.Unlock()
	e.c.forget(e.msgID)
}
