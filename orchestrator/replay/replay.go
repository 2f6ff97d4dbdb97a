// Package replay re-executes a run's calls from its trace through the one orchestration path, and reports whether every file the run produced came out byte for byte the same.
//
// A replay is a new run. It needs only the store: the original's trace
// (the calls, in order, with their inputs), its setup (seed, as_of), the
// cells' sources (kept as blobs by hash), the bytes it wrote (by hash) and
// its citations records (which answer its searches). The original's kernel
// may be long gone. Every replayed call goes through the orchestrator, so
// the replay has its own journal, trace and verdicts, and its last step
// writes artifacts/reproducibility.json: per file, identical or different,
// both hashes, and the first step whose outputs diverged.
package replay

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Options change a replay.
type Options struct {
	// Seed and AsOf replace the original's: a replay with another seed
	// shows which files depend on it. Nil keeps the original's.
	Seed *int64
	AsOf *string
	// Run names the replay run; the zero ID mints one.
	Run runid.ID
}

// Excluded are the records a replay does not compare, by definition: they
// name the run, or carry the real times of its calls, or are the replay's
// own report. They are never in a call's outputs; the report lists them so
// that a reader knows why.
var Excluded = []string{
	runfiles.Index + " (names the run)",
	runfiles.Journal + " and its checkpoints (real times; the run's id)",
	runfiles.Trace + " and " + runfiles.Evaluations + " (real times and durations)",
	runfiles.RunState + " and " + runfiles.Notebook + " (a recipe run's state, with real times)",
	runfiles.Setup + " (names the run)",
	runfiles.Reproducibility + " (the replay's own report)",
}

// Run replays run orig and returns the report it wrote. An error means the
// replay could not be made (no such run, a cell whose source was not kept,
// the store down); a replay whose files differ is not an error.
func Run(ctx context.Context, o *orchestrator.Orchestrator, orig runid.ID, opt Options) (*wire.ReplayReport, error) {
	start := time.Now()
	trace, err := o.Trace(ctx, orig)
	if err != nil {
		return nil, err
	}
	if len(trace) == 0 {
		return nil, fault.New(fault.NotFound, fmt.Sprintf("run %s has no calls to replay", orig),
			"check the run id: GET /runs/{id} shows a run's calls")
	}
	if err := recoverable(ctx, o, orig, trace); err != nil {
		return nil, err
	}
	setup0, recorded, err := o.RunSetup(ctx, orig)
	if err != nil {
		return nil, err
	}
	if !recorded {
		setup0 = wire.RunSetup{RunID: orig.String(), SeedFrom: "none recorded", AsOfFrom: "none recorded"}
	}
	run := opt.Run
	if run.IsZero() {
		run = runid.New()
	}
	// The replay is a new run of the caller's, made before anything can
	// name it.
	if err := o.Create(ctx, run); err != nil {
		return nil, err
	}
	from := "the original's: replay of " + orig.String()
	want := wire.RunSetup{Seed: setup0.Seed, SeedFrom: from, AsOf: setup0.AsOf, AsOfFrom: from, Recipe: setup0.Recipe, ReplayOf: orig.String(),
		Template: setup0.Template}
	// The replay's sandbox is the original's: its template, and its egress
	// policy as recorded (the template's secrets come with it, by name).
	if setup0.Egress != nil {
		eg := *setup0.Egress
		eg.Secrets = nil
		want.Egress = &eg
	} else {
		want.Egress = &wire.EgressPolicy{Allow: []wire.EgressRule{}}
	}
	if opt.Seed != nil && *opt.Seed != setup0.Seed {
		want.Seed, want.SeedFrom = *opt.Seed, fmt.Sprintf("param: replaced the original's %d", setup0.Seed)
	}
	if opt.AsOf != nil && *opt.AsOf != setup0.AsOf {
		want.AsOf, want.AsOfFrom = *opt.AsOf, fmt.Sprintf("param: replaced the original's %q", setup0.AsOf)
	}
	o.SetRunInfo(run, setup0.Recipe, fmt.Sprintf("Replay run %s (%d calls) and compare every file it produced", orig, len(trace)))
	setup1, err := o.SetRunSetup(ctx, run, want)
	if err != nil {
		return nil, err
	}
	o.ReplaySearchesFrom(run, orig)

	rep := &wire.ReplayReport{Format: wire.ReplayFormat, Original: orig.String(), RunID: run.String(),
		Setup: wire.ReplaySetup{Original: setup0, Replay: setup1}, Excluded: Excluded, Files: []wire.ReplayFile{}}
	steps := make(map[int]int, len(trace)) // original step -> replay step
	for _, tr := range trace {
		rep.OriginalMs += tr.ElapsedMs
		st := wire.ReplayStep{Step: tr.Step, Tool: tr.Tool}
		rc := &orchestrator.Receipt{}
		// The original's label, unchanged: a cell that reads the journal
		// sees the same Step Blocks but for their times (the header says
		// the run is a replay).
		cctx := orchestrator.WithStepInfo(ctx, orchestrator.StepInfo{Label: tr.Label, Receipt: rc})
		skipped, code, err := call(cctx, o, run, tr)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("replay of run %s stopped at step %d: %w", orig, tr.Step, ctx.Err())
		}
		if code != "" {
			st.Reads = Reads(code)
		}
		switch {
		case skipped != "":
			st.Skipped = skipped
		case rc.Step == 0:
			// The call was refused before the orchestration path recorded
			// it; that is a divergence only if the original succeeded.
			st.Skipped = "the call was refused: " + errText(err)
		default:
			steps[tr.Step] = rc.Step
			st.Replay = rc.Step
		}
		rep.Steps = append(rep.Steps, st)
	}
	if err := compare(ctx, o, orig, run, trace, steps, rep); err != nil {
		return nil, err
	}
	explain(rep)
	rep.DurationMs = time.Since(start).Milliseconds()
	if _, err := o.RecordReplay(ctx, run, rep); err != nil {
		return nil, err
	}
	if err := o.Note(ctx, run, note(rep), "triad replay"); err != nil {
		return nil, err
	}
	status := "reproduced"
	if !rep.Identical {
		status = "diverged"
	}
	if err := o.Finalize(ctx, run, status); err != nil {
		return nil, err
	}
	return rep, nil
}

// recoverable checks, before anything is replayed, that every call can be:
// each cell's source and each written file's bytes are in the store.
func recoverable(ctx context.Context, o *orchestrator.Orchestrator, orig runid.ID, trace []orchestrator.TraceRecord) error {
	blobs := o.Store().Blobs()
	for _, tr := range trace {
		var need tmpfs.Digest
		switch {
		case tr.Tool == orchestrator.ToolExec && tr.CodeSHA256.IsZero():
			return fault.New(fault.Unsupported, fmt.Sprintf("run %s step %d: the trace does not name the cell's source, which Triad keeps since runs could be replayed", orig, tr.Step),
				"replay runs made by this version of Triad or a later one")
		case tr.Tool == orchestrator.ToolExec:
			need = tr.CodeSHA256
		case tr.Tool == orchestrator.ToolWrite && tr.OK && len(tr.Outputs) > 0:
			need = tr.Outputs[0].SHA256
		default:
			continue
		}
		if _, err := blobs.Stat(ctx, need); err != nil {
			if errors.Is(err, tmpfs.ErrNotFound) {
				return fault.Wrap(fault.NotFound, err, fmt.Sprintf("run %s step %d: blob %s is not in the store", orig, tr.Step, need.Short()),
					"replay the run against the store it was made in (the same --data directory or S3 bucket)")
			}
			return fault.Wrap(fault.StoreUnavailable, err, "the file store does not answer", "retry in a few seconds")
		}
	}
	return nil
}

// call makes one recorded call again in run. It returns why the call was
// not made (skipped), and an exec's source.
func call(ctx context.Context, o *orchestrator.Orchestrator, run runid.ID, tr orchestrator.TraceRecord) (skipped, code string, err error) {
	in := tr.Inputs
	switch tr.Tool {
	case orchestrator.ToolWrite:
		if !tr.OK || len(tr.Outputs) == 0 {
			return "a tmp.write that failed keeps no content to write again", "", nil
		}
		f := tr.Outputs[0]
		r, err := o.Store().OpenBlob(ctx, f.SHA256)
		if err != nil {
			return "", "", err
		}
		defer r.Close()
		if b, _ := in["streamed"].(bool); b {
			_, err = o.WriteStream(ctx, run, f.Path, r)
			return "", "", err
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return "", "", err
		}
		w := wire.WriteRequest{Path: f.Path}
		if utf8.Valid(data) {
			t := string(data)
			w.Text = &t
		} else {
			e := base64.StdEncoding.EncodeToString(data)
			w.BytesB64 = &e
		}
		_, err = o.Write(ctx, run, w)
		return "", "", err
	case orchestrator.ToolRead:
		p, _ := in["path"].(string)
		if b, _ := in["streamed"].(bool); b {
			_, r, err := o.Open(ctx, run, p)
			if r != nil {
				r.Close()
			}
			return "", "", err
		}
		_, err := o.Read(ctx, run, p)
		return "", "", err
	case orchestrator.ToolList:
		p, _ := in["prefix"].(string)
		_, err := o.List(ctx, run, p)
		return "", "", err
	case orchestrator.ToolDelete:
		p, _ := in["path"].(string)
		_, err := o.Delete(ctx, run, p)
		return "", "", err
	case orchestrator.ToolSearch:
		var args struct {
			wire.SearchRequest
			SaveAs string `json:"save_as"`
		}
		if err := remarshal(in, &args); err != nil {
			return "", "", err
		}
		_, err := o.Search(ctx, run, args.SearchRequest, orchestrator.SearchOptions{SaveAs: args.SaveAs})
		return "", "", err
	case orchestrator.ToolExec:
		var args struct {
			FilesIn  []wire.FileIn `json:"files_in"`
			TimeoutS *float64      `json:"timeout_s"`
		}
		if err := remarshal(in, &args); err != nil {
			return "", "", err
		}
		b, _, err := readBlob(ctx, o, tr.CodeSHA256)
		if err != nil {
			return "", "", err
		}
		code := string(b)
		if tr.FreshKernel {
			// The original cell ran in a fresh interpreter (a new kernel, or
			// one restarted): so does its replay. Restart is a no-op when
			// the replay has no kernel yet.
			if err := o.Restart(ctx, run); err != nil {
				return "", code, err
			}
		}
		_, err = o.Exec(ctx, run, wire.ExecRequest{Code: code, FilesIn: args.FilesIn, TimeoutS: args.TimeoutS})
		return "", code, err
	}
	return fmt.Sprintf("%s is not a call a replay makes again", tr.Tool), "", nil
}

func readBlob(ctx context.Context, o *orchestrator.Orchestrator, d tmpfs.Digest) ([]byte, int64, error) {
	r, err := o.Store().OpenBlob(ctx, d)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return b, int64(len(b)), err
}

// remarshal decodes a trace record's inputs (JSON values) into v.
func remarshal(in map[string]any, v any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	return d.Decode(v)
}

// compare fills the report's files and divergences from the two traces and
// the two runs' files as they stand.
func compare(ctx context.Context, o *orchestrator.Orchestrator, orig, run runid.ID, trace []orchestrator.TraceRecord, steps map[int]int, rep *wire.ReplayReport) error {
	replayed, err := o.Trace(ctx, run)
	if err != nil {
		return err
	}
	byStep := map[int]orchestrator.TraceRecord{}
	for _, tr := range replayed {
		byStep[tr.Step] = tr
	}
	type fileInfo struct{ step, diverged int }
	files := map[string]*fileInfo{}
	touch := func(p string) *fileInfo {
		if files[p] == nil {
			files[p] = &fileInfo{}
		}
		return files[p]
	}
	for i, tr := range trace {
		st := &rep.Steps[i]
		if !isCall(tr.Tool) {
			continue // not a call (a replay's report step): nothing to compare
		}
		want := outputs(tr.Outputs)
		for p := range want {
			touch(p).step = tr.Step
		}
		got := map[string]tmpfs.Digest{}
		ok := false
		if st.Replay != 0 {
			r := byStep[st.Replay]
			got, ok = outputs(r.Outputs), r.OK
		}
		if ok != tr.OK {
			st.Diverged = true
		}
		for p := range union(want, got) {
			if want[p] != got[p] {
				st.Diverged = true
				if f := touch(p); f.diverged == 0 {
					f.diverged = tr.Step
				}
			}
		}
		if st.Diverged && rep.FirstDivergence == 0 {
			rep.FirstDivergence = tr.Step
		}
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := files[p]
		a, err := final(ctx, o, orig, p)
		if err != nil {
			return err
		}
		b, err := final(ctx, o, run, p)
		if err != nil {
			return err
		}
		rf := wire.ReplayFile{Path: p, Status: wire.ReplayIdentical, Original: a, Replay: b, Step: f.step, DivergedAt: f.diverged}
		if a != b {
			rf.Status = wire.ReplayDifferent
			rep.Different++
		} else {
			rep.Same++
		}
		rep.Files = append(rep.Files, rf)
	}
	rep.Identical = rep.Different == 0 && rep.FirstDivergence == 0
	return nil
}

// isCall reports whether tool is one of the tools a caller calls.
func isCall(tool string) bool {
	switch tool {
	case orchestrator.ToolExec, orchestrator.ToolSearch, orchestrator.ToolWrite, orchestrator.ToolRead, orchestrator.ToolList, orchestrator.ToolDelete:
		return true
	}
	return false
}

// final returns a file's hash in a run as it stands, zero when absent.
func final(ctx context.Context, o *orchestrator.Orchestrator, run runid.ID, p string) (tmpfs.Digest, error) {
	f, err := o.Store().Stat(ctx, run, p)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return tmpfs.Digest{}, nil
	}
	return f.SHA256, err
}

func outputs(refs []wire.FileRef) map[string]tmpfs.Digest {
	m := make(map[string]tmpfs.Digest, len(refs))
	for _, r := range refs {
		m[r.Path] = r.SHA256
	}
	return m
}

func union(a, b map[string]tmpfs.Digest) map[string]bool {
	u := make(map[string]bool, len(a)+len(b))
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

// explain says why files differ, as far as Triad can tell: a setup that
// changed, the cells that read what a replay cannot repeat, and the steps
// that diverged with nothing to blame.
func explain(rep *wire.ReplayReport) {
	a, b := rep.Setup.Original, rep.Setup.Replay
	if a.Seed != b.Seed {
		rep.Why = append(rep.Why, fmt.Sprintf("the replay ran with seed %d and the original with seed %d: files computed from random draws are expected to differ", b.Seed, a.Seed))
	}
	if a.AsOf != b.AsOf {
		rep.Why = append(rep.Why, fmt.Sprintf("the replay ran as of %q and the original as of %q: files dated by as_of (SOURCE_DATE_EPOCH) are expected to differ", b.AsOf, a.AsOf))
	}
	if a.Backend != b.Backend || a.Image != b.Image {
		rep.Why = append(rep.Why, fmt.Sprintf("the original ran on %s %s and the replay on %s %s: bit-identical results across sandbox images are not promised",
			a.Backend, a.Image, b.Backend, b.Image))
	}
	for _, st := range rep.Steps {
		if st.Diverged && len(st.Reads) > 0 {
			rep.Why = append(rep.Why, fmt.Sprintf("step %d's cell reads %s, which a replay cannot repeat", st.Step, strings.Join(st.Reads, ", ")))
		}
	}
	setupChanged := len(rep.Why) > 0
	for _, st := range rep.Steps {
		switch {
		case st.Skipped != "" && isCall(st.Tool):
			rep.Why = append(rep.Why, fmt.Sprintf("step %d (%s) was not replayed: %s", st.Step, st.Tool, st.Skipped))
		case st.Diverged && len(st.Reads) == 0 && !setupChanged:
			rep.Why = append(rep.Why, fmt.Sprintf("step %d (%s) diverged with the same call, seed, as_of and image; no clock, entropy or network read was found in its source", st.Step, st.Tool))
		}
	}
	for _, st := range rep.Steps {
		if !st.Diverged && len(st.Reads) > 0 {
			rep.Why = append(rep.Why, fmt.Sprintf("step %d's cell reads %s but its outputs came out the same this time", st.Step, strings.Join(st.Reads, ", ")))
		}
	}
	if rep.Why == nil {
		rep.Why = []string{}
	}
}

// note is the journal note a replay leaves.
func note(rep *wire.ReplayReport) string {
	n := rep.Same + rep.Different
	if rep.Identical {
		asOf := "no as_of"
		if a := rep.Setup.Replay.AsOf; a != "" {
			asOf = "as of " + a
		}
		return fmt.Sprintf("Replay of run %s: all %d file(s) it produced are identical, byte for byte (seed %d, %s). See %s.",
			rep.Original, n, rep.Setup.Replay.Seed, asOf, runfiles.Reproducibility)
	}
	var diff []string
	for _, f := range rep.Files {
		if f.Status == wire.ReplayDifferent {
			diff = append(diff, f.Path)
		}
	}
	if len(diff) > 5 {
		diff = append(diff[:5], fmt.Sprintf("and %d more", len(diff)-5))
	}
	s := fmt.Sprintf("Replay of run %s: %d of %d file(s) differ (%s); the first divergence is at original step %d.",
		rep.Original, rep.Different, n, strings.Join(diff, ", "), rep.FirstDivergence)
	if len(rep.Why) > 0 {
		s += " Why: " + rep.Why[0] + "."
	}
	return s + " See " + runfiles.Reproducibility + "."
}

func errText(err error) string {
	if err == nil {
		return "no reason given"
	}
	if fe := fault.As(err); fe != nil {
		return string(fe.Kind) + ": " + fe.Message
	}
	return err.Error()
}

// reads are the calls in a cell's source that a replay cannot repeat: what
// they return depends on when or where the cell runs, not on its inputs.
// The check reads the source; it is a heuristic that names what it sees
// (an aliased import or a library that reads the clock inside is missed),
// and it flags, never fixes. See "Reproducible runs" in docs/DECISIONS.md.
var reads = []struct {
	what string
	re   *regexp.Regexp
}{
	{"the clock", regexp.MustCompile(`\btime\.(?:time|time_ns)\s*\(|\b(?:datetime|date|Timestamp)\.(?:now|utcnow|today)\s*\(|\btime\.(?:localtime|gmtime|ctime)\s*\(\s*\)|\btime\.strftime\s*\([^,()]*\)|\bTimestamp\(\s*["'](?:now|today)["']`)},
	{"entropy", regexp.MustCompile(`\bos\.urandom\s*\(|\buuid\.uuid[14]\s*\(|\bsecrets\.\w+|\bSystemRandom\s*\(|\bdefault_rng\s*\(\s*\)|\bRandomState\s*\(\s*\)|\brandom_state\s*=\s*None\b|\brandom\.seed\s*\(\s*\)`)},
	{"the journal", regexp.MustCompile(`\b(?:CEL(?:\.step_\d+)?\.md|trace\.jsonl|evaluations\.jsonl)\b`)},
	{"the network", regexp.MustCompile(`\burllib\.request\b|\burlopen\s*\(|\brequests\.(?:get|post|put|head|request|Session)\b|\bhttpx\.|\bhttp\.client\b|\bsocket\.(?:socket|create_connection)\s*\(`)},
}

// Reads returns what a cell's source reads that a replay cannot repeat, as
// "the clock (time.time())": the clock, entropy, the journal (whose times
// and run id are records) and the network.
func Reads(code string) []string {
	var out []string
	for _, r := range reads {
		if m := r.re.FindString(code); m != "" {
			out = append(out, fmt.Sprintf("%s (%s)", r.what, strings.TrimSpace(m)))
		}
	}
	return out
}
