package orchestrator

import (
	"fmt"
	"strings"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Each tool contributes an Outcome to its step: its salient inputs and
// the facts its call established, from which the journal builds the Step
// Block, the evaluator's request and the trace line.

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
	return journal.Inputs(Input{Key: "code", Value: e.Code}, Input{Key: "language", Value: e.Language}, Input{Key: "context", Value: e.Context},
		Input{Key: "command", Value: e.command()}, Input{Key: "cwd", Value: e.Cwd}, Input{Key: "env", Value: e.EnvKeys},
		Input{Key: "stdin", Value: e.Stdin}, Input{Key: "pid", Value: e.Pid}, Input{Key: "files_in", Value: e.FilesIn}, Input{Key: "timeout_s", Value: e.TimeoutS})
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

// Grade implements Outcome.
func (e *ExecOutcome) Grade(req *evaluator.Request) {
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

// Describe implements Outcome.
func (e *ExecOutcome) Describe(s *Step) (did, next []string, failed bool) {
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

// Trace implements journal.Tracer: a replay needs the cell's source and
// whether it ran in a fresh interpreter.
func (e *ExecOutcome) Trace(tr *TraceRecord) {
	tr.CodeSHA256, tr.FreshKernel, tr.Egress = e.CodeSHA256, e.Fresh, e.Egress
}

// Connections implements journal.Networker: the Step Block lists them.
func (e *ExecOutcome) Connections() []wire.Connection { return e.Egress }

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
	return journal.Inputs(Input{Key: "op", Value: c.Op}, Input{Key: "context", Value: c.ID}, Input{Key: "language", Value: lang}, Input{Key: "cwd", Value: c.Cwd})
}

// Grade implements Outcome.
func (c *ContextOutcome) Grade(req *evaluator.Request) {}

// Describe implements Outcome.
func (c *ContextOutcome) Describe(s *Step) (did, next []string, failed bool) {
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
	return journal.Inputs(Input{Key: "allow_domains", Value: o.AllowDomains}, Input{Key: "date_range", Value: o.DateRange}, Input{Key: "include_page", Value: o.IncludePage},
		Input{Key: "query", Value: o.Query}, Input{Key: "save_as", Value: o.SaveAs}, Input{Key: "top_k", Value: o.TopK})
}

// Grade implements Outcome.
func (o *SearchOutcome) Grade(req *evaluator.Request) { req.Results = o.Results }

// Describe implements Outcome.
func (o *SearchOutcome) Describe(s *Step) (did, next []string, failed bool) {
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
		return []Input{{Key: "prefix", Value: o.Prefix}}
	case o.Streamed:
		return []Input{{Key: "path", Value: o.Path}, {Key: "streamed", Value: true}}
	case o.Op == ToolWrite:
		return []Input{{Key: "bytes", Value: o.Bytes}, {Key: "path", Value: o.Path}}
	}
	return []Input{{Key: "path", Value: o.Path}}
}

// Grade implements Outcome.
func (o *TmpOutcome) Grade(req *evaluator.Request) {}

// Describe implements Outcome.
func (o *TmpOutcome) Describe(s *Step) (did, next []string, failed bool) {
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

// ToolReplay names the step that records a replay's report. It is Triad's
// own step, not a tool a caller can call.
const ToolReplay = "triad.replay"

// ReplayOutcome is the part of a replay's report step.
type ReplayOutcome struct {
	Report *wire.ReplayReport
}

// Tool implements Outcome.
func (r *ReplayOutcome) Tool() string { return ToolReplay }

// Inputs implements Outcome.
func (r *ReplayOutcome) Inputs() []Input {
	rep := r.Report
	return journal.Inputs(Input{Key: "original", Value: rep.Original}, Input{Key: "seed", Value: rep.Setup.Replay.Seed}, Input{Key: "as_of", Value: rep.Setup.Replay.AsOf})
}

// Grade implements Outcome: it fails a replay that did not reproduce every file: the evaluator's
// verdict then says so on the Step Block.
func (r *ReplayOutcome) Grade(req *evaluator.Request) {
	if rep := r.Report; !rep.Identical {
		req.OK = false
		req.Error = fmt.Sprintf("the replay diverged: %d of %d file(s) differ, first at original step %d",
			rep.Different, rep.Different+rep.Same, rep.FirstDivergence)
	}
}

// Describe implements Outcome.
func (r *ReplayOutcome) Describe(s *Step) (did, next []string, failed bool) {
	rep := r.Report
	replayed := 0
	for _, st := range rep.Steps {
		if st.Replay != 0 {
			replayed++
		}
	}
	did = append(did, fmt.Sprintf("Replayed %d of %d call(s) of run %s with seed %d", replayed, len(rep.Steps), rep.Original, rep.Setup.Replay.Seed),
		fmt.Sprintf("Compared %d file(s) the original produced: %d identical, %d different", rep.Same+rep.Different, rep.Same, rep.Different))
	if rep.Identical {
		return did, []string{"Every file is identical: the run is reproduced"}, false
	}
	next = append(next, fmt.Sprintf("Read %s: the first divergence is at original step %d", runfiles.Reproducibility, rep.FirstDivergence))
	return did, next, true
}
