package orchestrator

import (
	"context"
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

// Tool names, as the spec spells them.
const (
	ToolExec   = "sandbox.exec"
	ToolSearch = "browser.search"
	ToolWrite  = "tmp.write"
	ToolRead   = "tmp.read"
	ToolList   = "tmp.list"
	ToolDelete = "tmp.delete"
	// ToolContext makes, restarts or removes a code context.
	ToolContext = "sandbox.context"
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

	verdict *evaluator.Verdict // set once the journal recorded the step
}

// Outcome is what one tool contributes to its Step. The evaluator's
// request, the Step Block and the trace record are each built from a Step
// by one function (evalRequest, stepBlock, traceRecord), which asks the
// Outcome for the tool's part: adding a tool adds an Outcome type, not a
// case to three switches.
// See "Typed step outcomes" in docs/DECISIONS.md.
type Outcome interface {
	// Tool is the tool's name, e.g. ToolExec.
	Tool() string
	// Inputs are the call's salient inputs in the order the Step Block
	// lists them: never secrets, and code shortened to a summary.
	Inputs() []Input
	// grade adds the tool's facts to the evaluator's request.
	grade(req *evaluator.Request)
	// describe returns the Step Block's "What I did" bullets and the next
	// steps the tool suggests, and whether the call failed inside an
	// answer that is not an error (a cell that raised).
	describe(s *Step) (did, next []string, failed bool)
}

// Input is one salient input of a call.
type Input struct {
	Key   string
	Value any
}

// inputs builds an Input list, dropping keys whose value is the zero value
// of its type (an absent optional input).
func inputs(kv ...Input) []Input {
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

// ExecOutcome is sandbox.exec's part of a step.
type ExecOutcome struct {
	// Code is the cell's summary: its first line and a hash.
	Code string
	// CodeSHA256 is the hash of the cell's source, which is kept as a blob
	// so a replay can run the same cell.
	CodeSHA256 tmpfs.Digest
	// Fresh is true when the cell ran in an interpreter no earlier cell of
	// the run ran in (a new kernel, or one restarted since the last cell).
	Fresh    bool
	TimeoutS float64
	FilesIn  []wire.FileIn
	// Backend ran the cell ("docker", "wasm", ...); empty when the call
	// failed before a kernel was found.
	Backend string
	// Ran is true when the cell ran and answered (OK or not).
	Ran bool
	OK  bool
	// Error is the cell's failure, when it ran and failed.
	Error     *wire.ExecError
	Stderr    string
	Restarted bool
	// Tampered are Triad's records the cell changed; they were restored.
	Tampered []string
	// Skipped are working-directory entries not harvested (symlinks,
	// special files, names the path rules refuse).
	Skipped []string
	// Refused are files the cell wrote that were not stored, with why
	// (over the disk quota: a sparse file's apparent size counts).
	Refused []string
	Timeout time.Duration

	// Language is the cell's language ("r", "javascript", ...), "bash"
	// for a command or a bash cell, empty for a Python cell.
	Language string
	// Context is the code context that ran the cell, empty for the run's
	// kernel.
	Context string
	// Cwd and EnvKeys are a command's directory and the names (never the
	// values) of the environment variables it was given.
	Cwd     string
	EnvKeys []string
	// Phase is PhaseStart or PhaseEnd for a command started in the
	// background (StartCommand), whose start and end are steps of their
	// own; empty for a call that answers when it ends.
	Phase string
	// Command numbers a background command in the run.
	Command int
	// ExitCode is a command's exit status once it ended.
	ExitCode *int
	// Stdin says how a background command's stdin was set up ("open", a
	// terminal) and, at its end, what the caller sent it.
	Stdin string
	// Pid is a background command's pid in the sandbox, at its end.
	Pid int
	// HarvestErr says why the files a background command wrote could
	// not all be stored.
	HarvestErr string
	// Egress are the connections the run's sandbox opened through the
	// egress proxy (or tried to) since the last step: this cell's, and
	// any its background threads made between cells.
	Egress []wire.Connection
}

// The phases of a background command's steps.
const (
	PhaseStart = "start"
	PhaseEnd   = "end"
)

// Tool implements Outcome.
func (e *ExecOutcome) Tool() string { return ToolExec }

// Inputs implements Outcome.
func (e *ExecOutcome) Inputs() []Input {
	return inputs(Input{"code", e.Code}, Input{"language", e.Language}, Input{"context", e.Context},
		Input{"command", e.command()}, Input{"cwd", e.Cwd}, Input{"env", e.EnvKeys},
		Input{"stdin", e.Stdin}, Input{"pid", e.Pid}, Input{"files_in", e.FilesIn}, Input{"timeout_s", e.TimeoutS})
}

// command names a background command's step: "#2 started", "#2 ended".
func (e *ExecOutcome) command() string {
	switch e.Phase {
	case PhaseStart:
		return fmt.Sprintf("#%d started in the background", e.Command)
	case PhaseEnd:
		return fmt.Sprintf("#%d ended", e.Command)
	}
	return ""
}

func (e *ExecOutcome) grade(req *evaluator.Request) {
	if e.Ran && !e.OK {
		req.OK = false
		if e.Error != nil {
			req.Error = e.Error.Message
		}
	}
	req.Stderr = e.Stderr
	req.Restarted = e.Restarted
	req.Tampered = e.Tampered
	req.BudgetMs = e.Timeout.Milliseconds()
}

func (e *ExecOutcome) describe(s *Step) (did, next []string, failed bool) {
	what := fmt.Sprintf("Ran a Python cell in the %s kernel", e.Backend)
	switch {
	case e.Context != "" && e.Context == e.Language:
		what = fmt.Sprintf("Ran a %s cell in the run's %s kernel, in the %s sandbox", languageName(e.Language), languageName(e.Language), e.Backend)
	case e.Context != "":
		what = fmt.Sprintf("Ran a %s cell in context %s of the %s kernel", languageName(e.Language), e.Context, e.Backend)
	case e.Phase == PhaseStart:
		what = fmt.Sprintf("Started bash command #%d in the %s kernel's container; it runs without holding the run, and its end is a step of its own", e.Command, e.Backend)
	case e.Phase == PhaseEnd:
		what = fmt.Sprintf("Bash command #%d (started in the background) ended", e.Command)
	case e.Language == "bash":
		what = fmt.Sprintf("Ran a bash command in the %s kernel's container", e.Backend)
	}
	if e.ExitCode != nil {
		what += fmt.Sprintf(" with exit code %d", *e.ExitCode)
	}
	switch {
	case e.Error != nil:
		did = append(did, fmt.Sprintf("%s: failed (%s)", what, e.Error.Message))
		next = append(next, e.Error.Suggestion)
		failed = true
	case e.Ran:
		did = append(did, what+": ok")
	}
	if e.HarvestErr != "" {
		did = append(did, "Could not store every file the command wrote: "+e.HarvestErr)
	}
	if n := len(s.Artifacts); n > 0 {
		did = append(did, fmt.Sprintf("Stored %d file(s) the cell wrote or its outputs, content-addressed", n))
	}
	if len(e.Tampered) > 0 {
		did = append(did, fmt.Sprintf("Restored %d record(s) of Triad's the cell changed: %s", len(e.Tampered), strings.Join(e.Tampered, ", ")))
	}
	if len(e.Refused) > 0 {
		did = append(did, fmt.Sprintf("Refused to store %d file(s) the cell wrote: %s", len(e.Refused), strings.Join(e.Refused, "; ")))
	}
	if len(e.Skipped) > 0 {
		did = append(did, fmt.Sprintf("Did not store %d working-directory entr(y/ies): %s", len(e.Skipped), strings.Join(e.Skipped, ", ")))
	}
	return did, next, failed
}

func (e *ExecOutcome) trace(tr *TraceRecord) {
	tr.CodeSHA256, tr.FreshKernel, tr.Egress = e.CodeSHA256, e.Fresh, e.Egress
}

// network lists the step's connections for the Step Block.
func (e *ExecOutcome) network() []string { return networkLines(e.Egress) }

// networker is an Outcome whose step reached (or tried to reach) the
// network: its Step Block lists each connection.
type networker interface{ network() []string }

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

// The operations of sandbox.context.
const (
	ContextCreate  = "create"
	ContextRestart = "restart"
	ContextRemove  = "remove"
)

// ContextOutcome is sandbox.context's part of a step: a code context made,
// restarted or removed.
type ContextOutcome struct {
	Op string
	// ID is the context; empty (on restart) is the run's kernel.
	ID       string
	Cwd      string
	Language string
	Backend  string
	// Done is true when the operation succeeded.
	Done bool
}

// languageName names a cell's language in the journal: "" is Python.
func languageName(l string) string {
	switch l {
	case "", wire.LanguagePython:
		return "Python"
	case wire.LanguageR:
		return "R"
	case wire.LanguageJavaScript:
		return "JavaScript"
	case wire.LanguageTypeScript:
		return "TypeScript"
	}
	return l
}

// Tool implements Outcome.
func (c *ContextOutcome) Tool() string { return ToolContext }

// Inputs implements Outcome.
func (c *ContextOutcome) Inputs() []Input {
	lang := c.Language
	if lang == wire.LanguagePython {
		lang = "" // the default goes unsaid, as in earlier journals
	}
	return inputs(Input{"op", c.Op}, Input{"context", c.ID}, Input{"language", lang}, Input{"cwd", c.Cwd})
}

func (c *ContextOutcome) grade(req *evaluator.Request) {}

func (c *ContextOutcome) describe(s *Step) (did, next []string, failed bool) {
	if !c.Done {
		return nil, nil, false
	}
	where := "the run's root"
	if c.Cwd != "" {
		where = c.Cwd
	}
	switch {
	case c.Op == ContextCreate:
		did = append(did, fmt.Sprintf("Started context %s: a %s interpreter of its own in the run's %s sandbox, its cells starting in %s", c.ID, languageName(c.Language), c.Backend, where))
	case c.Op == ContextRestart && c.ID == "":
		what := "Restarted the run's kernel: its variables are gone; the files stay"
		if c.Backend == "docker" {
			what += " (the restart ends its contexts too: each comes back fresh on its next cell)"
		}
		did = append(did, what)
	case c.Op == ContextRestart:
		did = append(did, fmt.Sprintf("Restarted context %s: its variables are gone; the run's kernel and other contexts keep theirs", c.ID))
	case c.Op == ContextRemove:
		did = append(did, fmt.Sprintf("Removed context %s", c.ID))
	}
	return did, nil, false
}

// SearchOutcome is browser.search's part of a step.
type SearchOutcome struct {
	Query        string
	TopK         int
	IncludePage  bool
	AllowDomains []string
	DateRange    string
	SaveAs       string
	// Searched is true when the search answered.
	Searched bool
	Results  int
	// Domains are the answer's most frequent domains, most frequent first.
	Domains []string
}

// Tool implements Outcome.
func (o *SearchOutcome) Tool() string { return ToolSearch }

// Inputs implements Outcome.
func (o *SearchOutcome) Inputs() []Input {
	return inputs(Input{"allow_domains", o.AllowDomains}, Input{"date_range", o.DateRange}, Input{"include_page", o.IncludePage},
		Input{"query", o.Query}, Input{"save_as", o.SaveAs}, Input{"top_k", o.TopK})
}

func (o *SearchOutcome) grade(req *evaluator.Request) { req.Results = o.Results }

func (o *SearchOutcome) describe(s *Step) (did, next []string, failed bool) {
	if o.Searched {
		did = append(did, fmt.Sprintf("Searched the web: %d result(s); top domains %s", o.Results, strings.Join(o.Domains, ", ")),
			"Kept the raw results as a citations record")
	}
	return did, nil, false
}

// TmpOutcome is the part of a step of the tmp.* tools.
type TmpOutcome struct {
	Op     string // ToolWrite, ToolRead, ToolList or ToolDelete
	Path   string
	Prefix string
	// Bytes is the inline content's size (tmp.write).
	Bytes int
	// Streamed is true for the raw upload and download endpoints.
	Streamed bool
}

// Tool implements Outcome.
func (o *TmpOutcome) Tool() string { return o.Op }

// Inputs implements Outcome.
func (o *TmpOutcome) Inputs() []Input {
	switch {
	case o.Op == ToolList:
		return []Input{{"prefix", o.Prefix}}
	case o.Streamed:
		return []Input{{"path", o.Path}, {"streamed", true}}
	case o.Op == ToolWrite:
		return []Input{{"bytes", o.Bytes}, {"path", o.Path}}
	}
	return []Input{{"path", o.Path}}
}

func (o *TmpOutcome) grade(req *evaluator.Request) {}

func (o *TmpOutcome) describe(s *Step) (did, next []string, failed bool) {
	switch o.Op {
	case ToolWrite:
		if len(s.Artifacts) > 0 {
			did = append(did, fmt.Sprintf("Stored %s (%d bytes)", s.Artifacts[0].Path, s.Artifacts[0].Size))
		}
	case ToolRead:
		did = append(did, fmt.Sprintf("Read %s", o.Path))
	case ToolList:
		did = append(did, fmt.Sprintf("Listed files under %q", o.Prefix))
	case ToolDelete:
		did = append(did, fmt.Sprintf("Deleted %s", o.Path))
	}
	return did, nil, false
}

// StepInfo is what a caller (the recipe runner) knows about a call beyond
// its inputs: the artifacts it must produce and what comes next.
type StepInfo struct {
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

type stepInfoKey struct{}

// WithStepInfo attaches StepInfo to the calls made with ctx.
func WithStepInfo(ctx context.Context, si StepInfo) context.Context {
	return context.WithValue(ctx, stepInfoKey{}, si)
}

func stepInfo(ctx context.Context) StepInfo {
	si, _ := ctx.Value(stepInfoKey{}).(StepInfo)
	return si
}

// evalRequest builds the evaluator's request for s.
func evalRequest(s *Step, si StepInfo) evaluator.Request {
	req := evaluator.Request{Tool: s.Outcome.Tool(), OK: s.Err == nil, ElapsedMs: s.Elapsed.Milliseconds(), Expected: si.Expected}
	if s.Err != nil {
		req.Error = errText(s.Err)
	}
	for _, a := range s.Artifacts {
		req.Artifacts = append(req.Artifacts, wire.Ref(a))
	}
	s.Outcome.grade(&req)
	return req
}

// stepBlock builds s's Step Block, numbered n, with the notes it saw and
// the evaluator's verdict.
func stepBlock(s *Step, si StepInfo, n int, notes []cel.Note, v evaluator.Verdict) cel.Block {
	var did, next []string
	if si.Label != "" {
		did = append(did, si.Label)
	}
	tdid, tnext, failed := s.Outcome.describe(s)
	did = append(did, tdid...)
	next = append(next, tnext...)
	if s.Err != nil {
		failed = true
		fe := fault.As(s.Err)
		did = append(did, "Failed: "+errText(s.Err))
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
		Eval: cel.Evaluation{Pass: v.Pass, Score: v.Score, Completeness: v.Completeness,
			Correctness: v.Correctness, Evidence: v.Evidence, Hygiene: v.Hygiene, Critique: v.Critique}}
	for _, in := range s.Outcome.Inputs() {
		b.Input = append(b.Input, cel.KV{Key: in.Key, Value: inputText(in.Value)})
	}
	for _, a := range s.Artifacts {
		b.Artifacts = append(b.Artifacts, wire.Ref(a))
	}
	if n, ok := s.Outcome.(networker); ok {
		b.Network = n.network()
	}
	return b
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

// tracer is an Outcome with facts of its own for the trace, beyond its
// inputs: what a replay needs to repeat the call.
type tracer interface{ trace(tr *TraceRecord) }

// TraceError is a failed call's error in the trace.
type TraceError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// traceRecord builds s's trace line.
func traceRecord(s *Step, si StepInfo, n int, v evaluator.Verdict) TraceRecord {
	tr := TraceRecord{Step: n, Tool: s.Outcome.Tool(), Started: s.Started, ElapsedMs: s.Elapsed.Milliseconds(),
		Inputs: map[string]any{}, OK: s.Err == nil, Outputs: wire.Refs(s.Artifacts), Eval: &v, Label: si.Label}
	for _, in := range s.Outcome.Inputs() {
		tr.Inputs[in.Key] = in.Value
	}
	if t, ok := s.Outcome.(tracer); ok {
		t.trace(&tr)
	}
	if s.Err != nil {
		fe := fault.From(s.Err)
		tr.Error = &TraceError{Kind: string(fe.Kind), Message: fe.Message}
	}
	return tr
}

// inputText renders an input value for the Step Block.
func inputText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// errText is an error as the journal and evaluator show it: its kind and
// message, never its cause (which may name host paths).
func errText(err error) string {
	if fe := fault.As(err); fe != nil {
		return string(fe.Kind) + ": " + fe.Message
	}
	return err.Error()
}

// touched returns the files the step wrote whose blobs its tenant now
// holds (for files_in by hash): its artifacts. The journal's own versions,
// three or four new blobs a step, are not marked one by one; a run's
// first flush in a process marks every file it holds then.
func (s *Step) touched() []tmpfs.File {
	return s.Artifacts
}
