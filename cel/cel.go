// Package cel keeps a run's Context Engineering Log: CEL.md, a markdown journal with a Step Block after every tool call.
//
// The journal lives in the run's own file space, so cells can read it for
// context and people can download it. Format writes the spec's Step Block;
// Journal appends blocks, operator notes and the closing summary, keeping a
// checkpoint copy CEL.step_{n}.md before each append (free, because the store
// is content-addressed: the checkpoint is a second name for the old blob).
// An append stores only its own bytes (tmpfs.Store.Append), so a step costs
// the same at step 5,000 as at step 10.
package cel

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Path is the journal's path in the run.
const Path = runfiles.Journal

// Artifact is one file a step produced.
type Artifact = wire.FileRef

// Evaluation is the evaluator's verdict on a step.
type Evaluation struct {
	Pass         bool
	Score        float64
	Completeness float64
	Correctness  float64
	Evidence     float64
	Hygiene      float64
	Critique     string
	// Ungraded is a step the evaluator could not grade (it did not
	// answer in time): neither PASS nor FAIL. Its verdict comes later, in
	// a late verdict section (FormatLate). Critique says why.
	Ungraded bool
}

// Line renders the verdict for the Evaluation line.
func (e Evaluation) Line() string {
	if e.Ungraded {
		s := "UNGRADED — the evaluator could not grade this step yet; it is graded again and its verdict appended to this journal"
		if c := strings.TrimSpace(e.Critique); c != "" {
			s += ". " + inline(c)
		}
		return s
	}
	v := "FAIL"
	if e.Pass {
		v = "PASS"
	}
	s := fmt.Sprintf("%s — score=%.2f (completeness=%.2f, correctness=%.2f, evidence=%.2f, hygiene=%.2f)",
		v, e.Score, e.Completeness, e.Correctness, e.Evidence, e.Hygiene)
	if c := strings.TrimSpace(e.Critique); c != "" {
		s += ". " + inline(c)
	}
	return s
}

// Block is one Step Block.
type Block struct {
	N     int
	Tool  string
	When  time.Time
	Input []KV // salient inputs, in order
	Did   []string
	// Artifacts are listed by path; Name defaults to the path's base.
	Artifacts []Artifact
	// Network lists the connections the step's sandbox opened through
	// the egress proxy, or tried to; the section is left out when there
	// are none.
	Network []string
	Next    []string
	Eval    Evaluation
}

// KV is one salient input. Key is Triad's own name for it and is written as
// is; Value may come from a caller and is escaped.
type KV struct {
	Key   string
	Value string
}

// Format renders b in the spec's Step Block format.
func Format(b Block) string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n## Step %d: %s\n", b.N, b.Tool)
	fmt.Fprintf(&w, "**When:** %s\n", b.When.UTC().Format(time.RFC3339))
	in := make([]string, 0, len(b.Input))
	for _, kv := range b.Input {
		in = append(in, kv.Key+"="+inline(kv.Value))
	}
	if len(in) == 0 {
		in = append(in, "(none)")
	}
	fmt.Fprintf(&w, "**Inputs:** %s\n", strings.Join(in, ", "))
	w.WriteString("**What I did:**\n")
	for _, d := range b.Did {
		fmt.Fprintf(&w, "- %s\n", inline(d))
	}
	w.WriteString("**Artifacts:**\n")
	if len(b.Artifacts) == 0 {
		w.WriteString("- (none)\n")
	}
	for _, a := range b.Artifacts {
		fmt.Fprintf(&w, "- %s: %s (size=%d, sha256=%s)\n", inline(baseName(a.Path)), codeSpan("tmp/"+a.Path), a.Size, a.SHA256)
	}
	if len(b.Network) > 0 {
		w.WriteString("**Network:**\n")
		for _, n := range b.Network {
			fmt.Fprintf(&w, "- %s\n", inline(n))
		}
	}
	w.WriteString("**Next steps:**\n")
	if len(b.Next) == 0 {
		w.WriteString("- [ ] (none)\n")
	}
	for _, n := range b.Next {
		fmt.Fprintf(&w, "- [ ] %s\n", inline(n))
	}
	fmt.Fprintf(&w, "**Evaluation (by Evaluator):** %s\n", b.Eval.Line())
	return w.String()
}

// Late is the verdict of a step that was ungraded when its Step Block
// was written, appended when the evaluator graded it again. The journal
// is append-only: the Step Block keeps its UNGRADED line, and a reader
// takes the late verdict for step N as the step's verdict.
type Late struct {
	N    int
	Tool string
	When time.Time
	Eval Evaluation
}

// FormatLate renders a late verdict section.
func FormatLate(l Late) string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n### Late verdict of Step %d: %s\n", l.N, l.Tool)
	fmt.Fprintf(&w, "**When:** %s\n", l.When.UTC().Format(time.RFC3339))
	fmt.Fprintf(&w, "**Evaluation (by Evaluator):** %s\n", l.Eval.Line())
	return w.String()
}

// Reclaim records that Triad stopped a run's idle kernel to start another
// run's at their tenant's kernel quota: the run's interpreter state (its
// variables) is gone, its files stay.
type Reclaim struct {
	When time.Time
	// For is the run whose new kernel it made room for.
	For    runid.ID
	Tenant string
	// Limit is the tenant's kernel quota; Idle how long the kernel had
	// sat unused.
	Limit int
	Idle  time.Duration
}

// FormatReclaim renders a kernel reclaim section.
func FormatReclaim(r Reclaim) string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n### Kernel state reclaimed — %s\n", r.When.UTC().Format(time.RFC3339))
	fmt.Fprintf(&w, "Triad stopped this run's kernel to start one for run %s: tenant %s was at its kernel quota (%d), and this kernel was its least recently used idle one (idle for %s).\n",
		codeSpan(r.For.String()), inline(r.Tenant), r.Limit, r.Idle.Round(time.Second))
	w.WriteString("The run's files stay; its next cell runs in a fresh kernel, without the variables of earlier cells.\n")
	return w.String()
}

// Header is the journal's opening section.
type Header struct {
	Run       runid.ID
	Started   time.Time
	Recipe    string
	Objective string
	// Setup, when set, is what the run's kernel is set up with (seed,
	// as_of, sandbox image): the facts a replay must match.
	Setup *wire.RunSetup
}

// FormatHeader renders h.
func FormatHeader(h Header) string {
	var w strings.Builder
	w.WriteString("# Context Engineering Log (CEL)\n\n")
	fmt.Fprintf(&w, "- **Run:** %s\n", h.Run)
	fmt.Fprintf(&w, "- **Started:** %s\n", h.Started.UTC().Format(time.RFC3339))
	if h.Recipe != "" {
		fmt.Fprintf(&w, "- **Recipe:** %s\n", inline(h.Recipe))
	}
	if h.Objective != "" {
		fmt.Fprintf(&w, "- **Objective:** %s\n", inline(h.Objective))
	}
	if s := h.Setup; s != nil {
		fmt.Fprintf(&w, "- **Seed:** %d (%s): Python's random and NumPy's global generator start from it in every fresh kernel; PYTHONHASHSEED=%d\n",
			s.Seed, inline(s.SeedFrom), s.PythonHashSeed)
		asOf := "none"
		if s.AsOf != "" {
			asOf = inline(s.AsOf)
		}
		fmt.Fprintf(&w, "- **As of:** %s (%s): SOURCE_DATE_EPOCH=%d\n", asOf, inline(s.AsOfFrom), s.SourceDateEpoch)
		if s.Backend != "" {
			sb := inline(s.Backend)
			switch s.Runtime {
			case "runsc", "gvisor":
				sb += " under gVisor (runsc: a second kernel between the cell and the host's)"
			case "runc":
				sb += " under runc (the host's kernel, behind Triad's seccomp profile)"
			case "":
			default:
				sb += " under runtime " + inline(s.Runtime)
			}
			if s.Template != "" {
				sb += ", template " + codeSpan(s.Template)
			}
			if s.Image != "" {
				sb += ", image " + codeSpan(s.Image)
			}
			if s.ImageDigest != "" {
				sb += " (" + codeSpan(s.ImageDigest) + ")"
			}
			fmt.Fprintf(&w, "- **Sandbox:** %s\n", sb)
		}
		if s.Template != "" {
			fmt.Fprintf(&w, "- **Egress:** %s\n", egressLine(s.Egress))
		}
		if s.ReplayOf != "" {
			fmt.Fprintf(&w, "- **Replay of:** %s\n", inline(s.ReplayOf))
		}
	}
	return w.String()
}

// egressLine summarises a run's egress policy for the header.
func egressLine(p *wire.EgressPolicy) string {
	if p == nil || len(p.Allow) == 0 {
		return "none: the sandbox reaches nothing"
	}
	var rules []string
	for _, r := range p.Allow {
		s := r.Host
		if len(r.Ports) > 0 {
			var ps []string
			for _, p := range r.Ports {
				ps = append(ps, strconv.Itoa(p))
			}
			s += ":" + strings.Join(ps, ",")
		}
		if len(r.Methods) > 0 {
			s += " " + strings.Join(r.Methods, ",")
		}
		rules = append(rules, s)
	}
	out := "allowed " + inline(strings.Join(rules, "; "))
	if len(p.Deny) > 0 {
		out += "; denied " + inline(strings.Join(p.Deny, ", "))
	}
	for _, s := range p.Secrets {
		out += "; the proxy adds " + inline(s.Header) + " for " + inline(s.Host)
	}
	return out + " (through Triad's egress proxy; every connection is listed in its step)"
}

// Note is an operator's note.
type Note struct {
	When   time.Time
	Author string
	Text   string
}

// FormatNote renders a timestamped operator note block.
func FormatNote(n Note) string {
	var w strings.Builder
	by := ""
	if n.Author != "" {
		by = " by " + inline(n.Author)
	}
	fmt.Fprintf(&w, "\n### Operator note%s — %s\n", by, n.When.UTC().Format(time.RFC3339))
	for _, l := range noteLines(n.Text) {
		w.WriteString(l + "\n")
	}
	return w.String()
}

// Summary closes a run.
type Summary struct {
	When   time.Time
	Status string
	Steps  int
	Passed int
	Failed int
	// Ungraded counts the steps still without a verdict.
	Ungraded  int
	Artifacts []Artifact
}

// FormatSummary renders the closing summary section.
func FormatSummary(s Summary) string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n## Summary\n**When:** %s\n", s.When.UTC().Format(time.RFC3339))
	if s.Status != "" {
		fmt.Fprintf(&w, "**Status:** %s\n", s.Status)
	}
	fmt.Fprintf(&w, "**Steps:** %d (%d PASS, %d FAIL", s.Steps, s.Passed, s.Failed)
	if s.Ungraded > 0 {
		fmt.Fprintf(&w, ", %d UNGRADED", s.Ungraded)
	}
	w.WriteString(")\n**Artifacts:**\n")
	if len(s.Artifacts) == 0 {
		w.WriteString("- (none)\n")
	}
	for _, a := range s.Artifacts {
		fmt.Fprintf(&w, "- %s: %s (size=%d, sha256=%s)\n", inline(baseName(a.Path)), codeSpan("tmp/"+a.Path), a.Size, a.SHA256)
	}
	return w.String()
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// Write is one file a Journal call wrote.
type Write struct {
	tmpfs.File
	// Appended, when set, is the text added to the file's version Prev
	// (the journal itself); a checkpoint is a new name for a whole file
	// and has none. A copy of the journal elsewhere (a kernel's working
	// directory) is brought up to date by appending it.
	Appended []byte
	Prev     tmpfs.Digest
}

// Journal reads and appends run journals in a store. Callers serialize
// calls per run (the orchestrator's run lock); the journal trusts that.
type Journal struct {
	store *tmpfs.Store

	mu   sync.Mutex
	runs map[runid.ID]*state
}

type state struct {
	steps  int    // Step Blocks written
	notes  []Note // notes since the last step, which the next step sees
	header bool
	// summary is the journal's last section when it is a summary (nothing
	// was appended after it): a second Finalize that would say the same
	// appends nothing.
	summary *summaryMark
}

// summaryMark is what a summary section says that a later one could
// change: the run's status and its number of steps.
type summaryMark struct {
	status string
	steps  int
}

// New returns a Journal over store.
func New(store *tmpfs.Store) *Journal {
	return &Journal{store: store, runs: map[runid.ID]*state{}}
}

var (
	stepRE = regexp.MustCompile(`(?m)^## Step (\d+): `)
	// noteRE matches an operator note as FormatNote writes it.
	noteRE = regexp.MustCompile(`(?m)^### Operator note(?: by (.*))? — (\S+)\n((?:> .*\n?)*)`)
	// summaryRE matches the summary section as FormatSummary writes it.
	summaryRE = regexp.MustCompile(`(?m)^## Summary\n\*\*When:\*\* \S+\n(?:\*\*Status:\*\* (.*)\n)?\*\*Steps:\*\* (\d+) `)
	// sectionRE matches the start of any section a Journal appends.
	sectionRE = regexp.MustCompile(`(?m)^(?:## Step \d+: |### Operator note|### Late verdict|### Kernel state reclaimed|## Summary\n)`)
)

func (j *Journal) state(ctx context.Context, run runid.ID) (*state, error) {
	j.mu.Lock()
	st, ok := j.runs[run]
	j.mu.Unlock()
	if ok {
		return st, nil
	}
	st = &state{}
	b, _, err := j.store.ReadAll(ctx, run, Path)
	switch {
	case errors.Is(err, tmpfs.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		st.header = true
		last := 0 // where the last Step Block starts
		for _, m := range stepRE.FindAllSubmatchIndex(b, -1) {
			if n, _ := strconv.Atoi(string(b[m[2]:m[3]])); n > st.steps {
				st.steps, last = n, m[0]
			}
		}
		// Notes after the last step are for the next one, whichever
		// process wrote them. Their text comes back as written, with
		// FormatNote's escapes.
		for _, m := range noteRE.FindAllSubmatch(b[last:], -1) {
			n := Note{Author: string(m[1])}
			n.When, _ = time.Parse(time.RFC3339, string(m[2]))
			var lines []string
			for _, l := range strings.Split(strings.TrimRight(string(m[3]), "\n"), "\n") {
				lines = append(lines, strings.TrimPrefix(l, "> "))
			}
			n.Text = strings.Join(lines, "\n")
			st.notes = append(st.notes, n)
		}
		// A summary that is the journal's last section.
		if all := sectionRE.FindAllIndex(b, -1); len(all) > 0 {
			if m := summaryRE.FindSubmatch(b[all[len(all)-1][0]:]); m != nil {
				n, _ := strconv.Atoi(string(m[2]))
				st.summary = &summaryMark{status: string(m[1]), steps: n}
			}
		}
	}
	j.mu.Lock()
	j.runs[run] = st
	j.mu.Unlock()
	return st, nil
}

// Forget drops what the journal caches about run (its step count and the
// notes the next step must see), so that the next call reads them from the
// store again: another process appended to the run meanwhile.
func (j *Journal) Forget(run runid.ID) {
	j.mu.Lock()
	delete(j.runs, run)
	j.mu.Unlock()
}

// Cached is the number of runs whose state the journal holds in memory.
func (j *Journal) Cached() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.runs)
}

// Started reports whether the run's journal exists.
func (j *Journal) Started(ctx context.Context, run runid.ID) (bool, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return false, err
	}
	return st.header, nil
}

// Start writes the header if the journal does not exist yet.
func (j *Journal) Start(ctx context.Context, h Header) ([]Write, error) {
	st, err := j.state(ctx, h.Run)
	if err != nil || st.header {
		return nil, err
	}
	text := []byte(FormatHeader(h))
	f, err := j.store.Append(ctx, h.Run, Path, text)
	if err != nil {
		return nil, err
	}
	st.header = true
	return []Write{{File: f, Appended: text}}, nil
}

// Next returns the number the run's next Step Block will carry, and the
// operator notes it must see.
func (j *Journal) Next(ctx context.Context, run runid.ID) (int, []Note, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return 0, nil, err
	}
	return st.steps + 1, append([]Note(nil), st.notes...), nil
}

// Append checkpoints the journal as CEL.step_{n}.md and appends b. It
// returns the files it wrote (the checkpoint and the journal).
func (j *Journal) Append(ctx context.Context, run runid.ID, b Block) ([]Write, error) {
	sb, err := j.Stage(ctx, run, b)
	if err != nil {
		return nil, err
	}
	res, err := j.store.Commit(ctx, run, sb.Changes)
	if err != nil {
		return nil, err
	}
	return sb.Done(res), nil
}

// Staged is a Step Block ready to be committed together with the step's
// other records, in one tmpfs.Store.Commit: Changes checkpoint the
// journal as CEL.step_{n}.md and append the block. Once they are
// committed, Done takes their results and returns the files written.
type Staged struct {
	Changes []tmpfs.Change
	st      *state
	n       int
	text    []byte
}

// Stage prepares the append of b (Append, in two halves, for a caller
// that commits it with other changes). Nothing is written, and the
// journal's count of steps moves only at Done.
func (j *Journal) Stage(ctx context.Context, run runid.ID, b Block) (Staged, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return Staged{}, err
	}
	if b.N != st.steps+1 {
		return Staged{}, fmt.Errorf("journal of run %s: step %d appended after step %d", run, b.N, st.steps)
	}
	f, err := j.store.Stat(ctx, run, Path)
	if err != nil {
		return Staged{}, fmt.Errorf("journal of run %s: %w", run, err)
	}
	// The checkpoint is a second name for the journal's current blob,
	// and the append stores only the block's bytes: the cost does not
	// grow with the journal.
	text := []byte(Format(b))
	return Staged{
		Changes: []tmpfs.Change{{Path: runfiles.Checkpoint(b.N), Link: &f}, {Path: Path, Data: text}},
		st:      st, n: b.N, text: text,
	}, nil
}

// Done records that the staged changes were committed; res are the
// commit's results for them, in order.
func (s Staged) Done(res []tmpfs.Committed) []Write {
	s.st.steps = s.n
	s.st.notes = nil
	s.st.summary = nil
	return []Write{{File: res[0].File}, {File: res[1].File, Appended: s.text, Prev: res[1].Prev.SHA256}}
}

// AddNote appends an operator note; the next Step Block sees it.
func (j *Journal) AddNote(ctx context.Context, run runid.ID, n Note) ([]Write, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return nil, err
	}
	files, err := j.append(ctx, run, "", FormatNote(n))
	if err != nil {
		return nil, err
	}
	st.notes = append(st.notes, n)
	st.summary = nil
	return files, nil
}

// Finalize appends the summary section. It is idempotent: when the
// journal already ends with a summary of the same steps and status (or s
// names no status), it appends nothing and returns no writes.
func (j *Journal) Finalize(ctx context.Context, run runid.ID, s Summary) ([]Write, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return nil, err
	}
	if m := st.summary; m != nil && m.steps == s.Steps && (s.Status == "" || s.Status == m.status) {
		return nil, nil
	}
	sort.Slice(s.Artifacts, func(a, b int) bool { return s.Artifacts[a].Path < s.Artifacts[b].Path })
	files, err := j.append(ctx, run, "", FormatSummary(s))
	if err != nil {
		return nil, err
	}
	st.summary = &summaryMark{status: s.Status, steps: s.Steps}
	return files, nil
}

// AppendLate appends the late verdict of a step graded after its Step
// Block was written (FormatLate). It is no step: the next Step Block's
// number and notes are unchanged.
func (j *Journal) AppendLate(ctx context.Context, run runid.ID, l Late) ([]Write, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return nil, err
	}
	if l.N < 1 || l.N > st.steps {
		return nil, fmt.Errorf("journal of run %s: late verdict of step %d, which it does not have", run, l.N)
	}
	files, err := j.append(ctx, run, "", FormatLate(l))
	if err != nil {
		return nil, err
	}
	st.summary = nil
	return files, nil
}

// AppendReclaim appends a kernel reclaim section (FormatReclaim). It is
// no step: the next Step Block's number and notes are unchanged.
func (j *Journal) AppendReclaim(ctx context.Context, run runid.ID, r Reclaim) ([]Write, error) {
	st, err := j.state(ctx, run)
	if err != nil {
		return nil, err
	}
	files, err := j.append(ctx, run, "", FormatReclaim(r))
	if err != nil {
		return nil, err
	}
	st.summary = nil
	return files, nil
}

// Read returns the journal's text.
func (j *Journal) Read(ctx context.Context, run runid.ID) ([]byte, error) {
	b, _, err := j.store.ReadAll(ctx, run, Path)
	return b, err
}

// append checkpoints the journal (when checkpoint is set) and appends text.
// The checkpoint is a second name for the journal's current blob, and the
// append stores only text's bytes (tmpfs.Store.Append): the cost does not
// grow with the journal.
func (j *Journal) append(ctx context.Context, run runid.ID, checkpoint, text string) ([]Write, error) {
	f, err := j.store.Stat(ctx, run, Path)
	if err != nil {
		return nil, fmt.Errorf("journal of run %s: %w", run, err)
	}
	var out []Write
	var (
		cp   tmpfs.File
		cerr error
		done = make(chan struct{})
	)
	// The checkpoint names the version the append starts from: the two
	// are independent, so they are written side by side.
	go func() {
		defer close(done)
		if checkpoint != "" {
			cp, cerr = j.store.Link(ctx, run, checkpoint, f.SHA256, f.Size)
		}
	}()
	nf, err := j.store.Append(ctx, run, Path, []byte(text))
	<-done
	if err = errors.Join(cerr, err); err != nil {
		return nil, err
	}
	if checkpoint != "" {
		out = append(out, Write{File: cp})
	}
	return append(out, Write{File: nf, Appended: []byte(text), Prev: f.SHA256}), nil
}
