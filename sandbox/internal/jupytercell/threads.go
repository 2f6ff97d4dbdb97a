package jupytercell

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/triadhq/triad/sandbox/jupyter"
)

// Background threads (see docs/DECISIONS.md, "Background threads"): a cell
// can start threads that go on running after it returns. Triad does not
// wait for them and cannot stop them short of a restart; it tells the
// caller which are still running when each cell returns, so the caller
// knows that files may still appear (they are harvested at the next cell)
// and that the kernel is not idle.

// threadsKey names the user expression that lists the threads.
const threadsKey = "triad_threads"

// threadsExpr lists, by name, the live threads other than the main thread
// and the kernel's own (ipykernel's iopub, heartbeat, control, pipe
// watchers and parent poller, which belong to the ipykernel, IPython,
// zmq, jupyter_client, tornado and traitlets modules, by their class or,
// for a plain Thread, by their target). It answers base64 of a JSON list,
// so the repr the kernel sends back is a quoted string with nothing
// escaped. It is evaluated by the kernel after the cell, in the cell's
// namespace: a cell can fool it, which only changes what its own answer
// says.
const threadsExpr = `(lambda th, js, b64: b64.b64encode(js.dumps([t.name for t in th.enumerate() ` +
	`if t is not th.main_thread() and ((type(t).__module__ if type(t) is not th.Thread ` +
	`else getattr(getattr(t, "_target", None), "__module__", None)) or "").split(".")[0] ` +
	`not in ("ipykernel", "IPython", "zmq", "jupyter_client", "tornado", "traitlets")]).encode()).decode())` +
	`(__import__("threading"), __import__("json"), __import__("base64"))`

// threadExprs are the user expressions sent with every cell.
var threadExprs = map[string]string{threadsKey: threadsExpr}

// Bounds on what a cell's thread report may put in an answer.
const (
	maxThreads    = 16
	maxThreadName = 80
	// probeTimeout bounds the extra round trip that asks a kernel for
	// its threads when the cell's own reply could not carry them.
	probeTimeout = 5 * time.Second
)

// parseThreads reads the thread list from a reply's user expressions;
// ok is false when they do not hold it (the cell raised, so the kernel
// evaluated none, or the expression failed).
func parseThreads(exprs map[string]json.RawMessage) (names []string, ok bool) {
	raw, found := exprs[threadsKey]
	if !found {
		return nil, false
	}
	var r struct {
		Status string            `json:"status"`
		Data   map[string]string `json:"data"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Status != "ok" {
		return nil, false
	}
	text := r.Data["text/plain"]
	if len(text) < 2 || (text[0] != '\'' && text[0] != '"') || text[len(text)-1] != text[0] {
		return nil, false
	}
	js, err := base64.StdEncoding.DecodeString(text[1 : len(text)-1])
	if err != nil {
		return nil, false
	}
	var all []string
	if err := json.Unmarshal(js, &all); err != nil {
		return nil, false
	}
	for i, n := range all {
		if i == maxThreads {
			names = append(names, fmt.Sprintf("… and %d more", len(all)-maxThreads))
			break
		}
		if len(n) > maxThreadName {
			n = strings.ToValidUTF8(n[:maxThreadName], "") + "…"
		}
		names = append(names, n)
	}
	return names, true
}

// threads returns the threads still running after a cell whose reply is
// o: from the reply's user expressions when the kernel evaluated them, or
// else from a silent cell that asks (after an exception, an interrupt, a
// redial). A kernel that does not answer in time reports none.
func (c *run) threads(ctx context.Context, o jupyter.Output) []string {
	if c.cfg.NoThreads {
		return nil
	}
	if names, ok := parseThreads(o.UserExpressions); ok {
		return names
	}
	client := c.k.Client()
	if client == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	ex, err := client.Execute(pctx, "", jupyter.ExecOptions{Silent: true, SkipHistory: true, UserExpressions: threadExprs})
	if err != nil {
		return nil
	}
	po, err := ex.Wait(pctx)
	if err != nil {
		c.cfg.Log.WarnContext(ctx, "could not list the kernel's threads", "kernel", c.cfg.ID, "err", err)
		return nil
	}
	names, _ := parseThreads(po.UserExpressions)
	return names
}
