package journal

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Step is one finished tool call, as the journal, evaluator and trace see it.
type Step struct {
	Run runid.ID
	// Outcome is the tool's own part: its salient inputs and the facts its
	// call established. Each tool has its own type.
	Outcome Outcome
	// Artifacts are the files the call created or changed, with the
	// metadata the store reports for them.
	Artifacts []tmpfs.File
	// Touched are other run paths the call changed: files it linked in
	// (files_in) or deleted. With Artifacts they keep what the evaluator
	// knows of the run up to date without listing it.
	Touched []string
	// Err is the call's failure, if it failed.
	Err     error
	Started time.Time
	Elapsed time.Duration

	// Verdict is set once the journal recorded the step.
	Verdict *evaluator.Verdict
}

// Outcome is what one tool contributes to its Step. The evaluator's
// request, the Step Block and the trace record are each built from a Step
// by one function (evalRequest, stepBlock, traceRecord), which asks the
// Outcome for the tool's part: adding a tool adds an Outcome type, not a
// case to three switches.
// See "Typed step outcomes" in docs/DECISIONS.md.
type Outcome interface {
	// Tool is the tool's name, e.g. "sandbox.exec".
	Tool() string
	// Inputs are the call's salient inputs in the order the Step Block
	// lists them: never secrets, and code shortened to a summary.
	Inputs() []Input
	// Grade adds the tool's facts to the evaluator's request.
	Grade(req *evaluator.Request)
	// Describe returns the Step Block's "What I did" bullets and the next
	// steps the tool suggests, and whether the call failed inside an
	// answer that is not an error (a cell that raised).
	Describe(s *Step) (did, next []string, failed bool)
}

// Tracer is an Outcome with facts of its own for the trace, beyond its
// inputs: what a replay needs to repeat the call.
type Tracer interface{ Trace(tr *TraceRecord) }

// Networker is an Outcome whose step reached (or tried to reach) the
// network through the egress proxy: its Step Block lists each connection,
// its trace record keeps them, and a report may cite the URLs it fetched.
type Networker interface{ Connections() []wire.Connection }

// Input is one salient input of a call.
type Input struct {
	Key   string
	Value any
}

// Inputs builds an Input list, dropping keys whose value is the zero value
// of its type (an absent optional input).
func Inputs(kv ...Input) []Input {
	out := make([]Input, 0, len(kv))
	for _, in := range kv {
		switch v := in.Value.(type) {
		case nil:
			continue
		case string:
			if v == "" {
				continue
			}
		case bool:
			if !v {
				continue
			}
		case int:
			if v == 0 {
				continue
			}
		case []string:
			if len(v) == 0 {
				continue
			}
		case []wire.FileIn:
			if len(v) == 0 {
				continue
			}
		}
		out = append(out, in)
	}
	return out
}

// Info is what a caller (the recipe runner, a replay) knows about a call
// beyond its inputs: the artifacts it must produce and what comes next.
type Info struct {
	// Label names the step ("recipe step 3: fit the model").
	Label string
	// Expected are the artifacts the evaluator's completeness check wants.
	Expected []evaluator.Expect
	// Next lists the next steps for the journal.
	Next []string
	// Receipt, when set, receives what the journal recorded about the
	// call: the in-process result, so the caller need not read it back.
	Receipt *Receipt
}

// Receipt is what the orchestration path recorded about one call.
type Receipt struct {
	// Step is the call's number in the run's journal.
	Step int
	// Verdict is the evaluator's verdict on the call.
	Verdict evaluator.Verdict
	// Images are the image bytes a cell displayed, by the run path they
	// were stored at (sandbox.exec only): verified by construction, since
	// they are the bytes that were hashed and stored.
	Images map[string][]byte
}

// evalRequest builds the evaluator's request for s.
func evalRequest(s *Step, si Info) evaluator.Request {
	req := evaluator.Request{Tool: s.Outcome.Tool(), OK: s.Err == nil, ElapsedMs: s.Elapsed.Milliseconds(), Expected: si.Expected}
	if s.Err != nil {
		req.Error = ErrText(s.Err)
	}
	for _, a := range s.Artifacts {
		req.Artifacts = append(req.Artifacts, wire.Ref(a))
	}
	s.Outcome.Grade(&req)
	return req
}

// stepBlock builds s's Step Block, numbered n, with the notes it saw and
// the evaluator's verdict.
func stepBlock(s *Step, si Info, n int, notes []cel.Note, v evaluator.Verdict) cel.Block {
	var did, next []string
	if si.Label != "" {
		did = append(did, si.Label)
	}
	tdid, tnext, failed := s.Outcome.Describe(s)
	did = append(did, tdid...)
	next = append(next, tnext...)
	if s.Err != nil {
		failed = true
		fe := fault.As(s.Err)
		did = append(did, "Failed: "+ErrText(s.Err))
		if fe != nil && fe.Suggestion != "" {
			next = append(next, fe.Suggestion)
		}
	}
	if !failed {
		next = append(next, si.Next...)
		if len(next) == 0 {
			next = append(next, "Review the artifacts above, or continue with the next tool call")
		}
	}
	if len(did) > 3 {
		did = did[:3]
	}
	for _, nt := range notes {
		did = append(did, fmt.Sprintf("Saw operator note: “%s”", strings.TrimSpace(nt.Text)))
	}
	b := cel.Block{N: n, Tool: s.Outcome.Tool(), When: s.Started, Did: did, Next: next,
		Eval: celEval(v)}
	for _, in := range s.Outcome.Inputs() {
		b.Input = append(b.Input, cel.KV{Key: in.Key, Value: inputText(in.Value)})
	}
	for _, a := range s.Artifacts {
		b.Artifacts = append(b.Artifacts, wire.Ref(a))
	}
	if nw, ok := s.Outcome.(Networker); ok {
		b.Network = networkLines(nw.Connections())
	}
	return b
}

// networkLines renders connection records, one line each: what was
// asked, the verdict and why, and the bytes each way.
func networkLines(cs []wire.Connection) []string {
	var out []string
	for _, c := range cs {
		what := c.URL
		if c.Method != "" {
			what = c.Method + " " + c.URL
		}
		if what == "" {
			what = fmt.Sprintf("%s:%d", c.Host, c.Port)
		}
		line := fmt.Sprintf("%s: %s", c.Verdict, what)
		if c.Status != 0 {
			line += fmt.Sprintf(" → %d", c.Status)
		}
		if c.Addr != "" {
			line += " via " + c.Addr
		}
		if c.Verdict == wire.VerdictAllowed {
			line += fmt.Sprintf(", %s sent, %s received", humanBytes(c.Sent), humanBytes(c.Received))
		}
		switch {
		case c.Open:
			line += " (still open)"
		case c.Reason != "":
			line += " — " + c.Reason
		}
		out = append(out, line)
	}
	return out
}

// humanBytes renders a byte count for people: 512 B, 12.3 KB, 4.0 MB.
func humanBytes(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprintf("%d B", n)
	case n < 1000*1000:
		return fmt.Sprintf("%.1f KB", float64(n)/1e3)
	case n < 1000*1000*1000:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.1f GB", float64(n)/1e9)
}

// TraceRecord is one line of trace.jsonl: enough, with the recorded search
// results and the content-addressed files, to replay the call.
type TraceRecord struct {
	Step      int                `json:"step"`
	Tool      string             `json:"tool"`
	Started   time.Time          `json:"started"`
	ElapsedMs int64              `json:"elapsed_ms"`
	Inputs    map[string]any     `json:"inputs"`
	OK        bool               `json:"ok"`
	Error     *TraceError        `json:"error,omitempty"`
	Outputs   []wire.FileRef     `json:"outputs"`
	Eval      *evaluator.Verdict `json:"evaluation"`
	Label     string             `json:"label,omitempty"`
	// CodeSHA256 is a cell's source, kept as a blob (sandbox.exec).
	CodeSHA256 tmpfs.Digest `json:"code_sha256,omitzero"`
	// FreshKernel is true when the cell ran in an interpreter no earlier
	// cell of the run ran in (sandbox.exec).
	FreshKernel bool `json:"fresh_kernel,omitempty"`
	// KeyID is the API key that made the call (never the key itself),
	// empty for the operator; Tenant is its tenant.
	KeyID  string `json:"key_id,omitempty"`
	Tenant string `json:"tenant"`
	// Egress are the connections the run's sandbox made through the
	// egress proxy, as the step's Step Block lists them.
	Egress []wire.Connection `json:"egress,omitempty"`
}

// TraceError is a failed call's error in the trace.
type TraceError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// traceRecord builds s's trace line.
func traceRecord(s *Step, si Info, n int, v evaluator.Verdict) TraceRecord {
	tr := TraceRecord{Step: n, Tool: s.Outcome.Tool(), Started: s.Started, ElapsedMs: s.Elapsed.Milliseconds(),
		Inputs: map[string]any{}, OK: s.Err == nil, Outputs: wire.Refs(s.Artifacts), Eval: &v, Label: si.Label}
	for _, in := range s.Outcome.Inputs() {
		tr.Inputs[in.Key] = in.Value
	}
	if t, ok := s.Outcome.(Tracer); ok {
		t.Trace(&tr)
	}
	if s.Err != nil {
		fe := fault.From(s.Err)
		tr.Error = &TraceError{Kind: string(fe.Kind), Message: fe.Message}
	}
	return tr
}

// CallEvent is a trace record as a run's feed shows it.
func CallEvent(tr TraceRecord) wire.CallEvent {
	e := wire.CallEvent{Step: tr.Step, Tool: tr.Tool, Label: tr.Label, Started: tr.Started, DurationMs: tr.ElapsedMs,
		OK: tr.OK, Inputs: tr.Inputs, Outputs: tr.Outputs, Verdict: evaluator.Verdict{}.Word(), FreshKernel: tr.FreshKernel}
	if e.Inputs == nil {
		e.Inputs = map[string]any{}
	}
	if e.Outputs == nil {
		e.Outputs = []wire.FileRef{}
	}
	if tr.Error != nil {
		e.Error = tr.Error.Kind + ": " + tr.Error.Message
	}
	if v := tr.Eval; v != nil {
		e.Score, e.Critique, e.Verdict = v.Score, v.Critique, v.Word()
	}
	return e
}

// inputText renders an input value for the Step Block.
func inputText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// ErrText is an error as the journal and evaluator show it: its kind and
// message, never its cause (which may name host paths).
func ErrText(err error) string {
	if fe := fault.As(err); fe != nil {
		return string(fe.Kind) + ": " + fe.Message
	}
	return err.Error()
}
