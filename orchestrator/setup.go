package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// PythonHashSeed is PYTHONHASHSEED in every kernel of every backend. It is
// a constant, not the run's seed, because warm-pool kernels start before a
// run claims them and the hash seed is fixed when the interpreter starts;
// the run's own seed is applied by the kernel setup when the run claims it.
const PythonHashSeed = 0

// MaxSeed is the largest seed: NumPy's legacy global generator takes seeds
// below 2**32.
const MaxSeed = math.MaxUint32

// setupTimeout bounds the kernel setup cell.
const setupTimeout = time.Minute

// Setup sources for runs that were given none.
const (
	defaultSeedFrom = "default: no seed was given"
	defaultAsOfFrom = "none given"
)

// SetRunSetup records what the run's kernel is set up with, its seed and
// as_of date (and, for a replay, the run it replays), as run.setup.json,
// before the run's first tool call. The backend, image and version are
// filled in here. Calling it again with the same seed and as_of keeps the
// record (a resumed recipe run); a run that has made calls cannot change
// them, since its kernel was already seeded. The run must be the caller's:
// Create or OpenRun it first.
func (o *Orchestrator) SetRunSetup(ctx context.Context, run runid.ID, s wire.RunSetup) (wire.RunSetup, error) {
	s, err := o.completeSetup(ctx, run, s)
	if err != nil {
		return s, err
	}
	if _, err := o.access(ctx, run, auth.Runs, false); err != nil {
		return s, err
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return s, err
	}
	defer held.Unlock()
	old, recorded, err := o.recordedSetup(ctx, run)
	if err != nil {
		return s, err
	}
	if recorded {
		if old.Seed == s.Seed && old.AsOf == s.AsOf && old.Template == s.Template && sameEgress(old.Egress, s.Egress) {
			o.cacheSetup(run, old)
			return old, nil
		}
		if tr, err := o.trace(ctx, run); err != nil {
			return s, err
		} else if len(tr) > 0 {
			return s, fault.New(fault.Conflict, fmt.Sprintf("run %s was set up with seed %d, as_of %q and template %q, and has made calls", run, old.Seed, old.AsOf, old.Template),
				fmt.Sprintf("keep seed %d, as_of %q, template %q and its egress for this run, or start a new run with the new values", old.Seed, old.AsOf, old.Template))
		}
	}
	if err := o.writeSetup(ctx, run, s); err != nil {
		return s, err
	}
	o.cacheSetup(run, s)
	return s, nil
}

// CheckSetup validates s as the setup of run, a run about to be created,
// without recording anything: a surface checks a setup before it creates
// the run, so that a refused setup leaves no run behind.
func (o *Orchestrator) CheckSetup(ctx context.Context, run runid.ID, s wire.RunSetup) error {
	_, err := o.completeSetup(ctx, run, s)
	return err
}

// RunSetup returns the run's setup as recorded, and false when the run has
// no record (it has made no call, or predates run.setup.json).
func (o *Orchestrator) RunSetup(ctx context.Context, run runid.ID) (wire.RunSetup, bool, error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		return wire.RunSetup{}, false, err
	}
	if err := o.settle(ctx, run); err != nil {
		return wire.RunSetup{}, false, err
	}
	return o.recordedSetup(ctx, run)
}

// completeSetup validates s and fills in what the server knows: the
// run's sandbox (template, image, egress) among it.
func (o *Orchestrator) completeSetup(ctx context.Context, run runid.ID, s wire.RunSetup) (wire.RunSetup, error) {
	if s.Seed < 0 || s.Seed > MaxSeed {
		return s, fault.Badf(fmt.Sprintf("send a seed from 0 to %d", int64(MaxSeed)), "seed %d is out of range", s.Seed)
	}
	epoch, err := SourceDateEpoch(s.AsOf)
	if err != nil {
		return s, err
	}
	s.RunID, s.SourceDateEpoch, s.PythonHashSeed, s.Triad = run.String(), epoch, PythonHashSeed, version.String()
	if s.SeedFrom == "" {
		s.SeedFrom = "param"
	}
	if s.AsOfFrom == "" {
		s.AsOfFrom = "param"
		if s.AsOf == "" {
			s.AsOfFrom = defaultAsOfFrom
		}
	}
	if o.kernels != nil {
		s.Backend, s.Image = o.kernels.Backend(), o.kernels.Image()
	}
	if err := o.resolveSandbox(ctx, &s); err != nil {
		return s, err
	}
	return s, nil
}

// sameEgress reports whether two recorded egress policies are the same.
func sameEgress(a, b *wire.EgressPolicy) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// SourceDateEpoch returns SOURCE_DATE_EPOCH for an as_of date: midnight UTC
// of a YYYY-MM-DD date, or 0 for none.
func SourceDateEpoch(asOf string) (int64, error) {
	if asOf == "" {
		return 0, nil
	}
	t, err := time.Parse(time.DateOnly, asOf)
	if err != nil {
		return 0, fault.Badf("send as_of as a date, YYYY-MM-DD, or leave it out", "as_of %q is not a date", asOf)
	}
	return t.Unix(), nil
}

func (o *Orchestrator) cacheSetup(run runid.ID, s wire.RunSetup) {
	o.touch(run)
	o.smu.Lock()
	defer o.smu.Unlock()
	o.setups[run] = s
}

// recordedSetup reads run.setup.json.
func (o *Orchestrator) recordedSetup(ctx context.Context, run runid.ID) (wire.RunSetup, bool, error) {
	var s wire.RunSetup
	b, _, err := o.store.ReadAll(ctx, run, runfiles.Setup)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return s, false, nil
	}
	if err != nil {
		return s, false, storeErr(err, run, runfiles.Setup)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, false, fault.Wrap(fault.Internal, err, fmt.Sprintf("run %s: %s does not parse", run, runfiles.Setup), "report this with the run id")
	}
	return s, true, nil
}

func (o *Orchestrator) writeSetup(ctx context.Context, run runid.ID, s wire.RunSetup) error {
	b, err := runfiles.MarshalIndent(s)
	if err != nil {
		return err
	}
	_, err = o.PutInternal(ctx, run, runfiles.Setup, append(b, '\n'))
	return err
}

// runSetup returns the run's setup: the one set or recorded, else the
// default (seed 0, no as_of), which the run's first call records.
func (o *Orchestrator) runSetup(ctx context.Context, run runid.ID) (wire.RunSetup, error) {
	o.smu.Lock()
	s, ok := o.setups[run]
	o.smu.Unlock()
	if ok {
		return s, nil
	}
	s, recorded, err := o.recordedSetup(ctx, run)
	if err != nil {
		return s, err
	}
	if !recorded {
		if s, err = o.completeSetup(ctx, run, wire.RunSetup{SeedFrom: defaultSeedFrom}); err != nil {
			return s, err
		}
	}
	o.cacheSetup(run, s)
	return s, nil
}

// ensureSetup records the run's setup if it has no record yet, at its
// first call, and returns it for the journal's header.
func (o *Orchestrator) ensureSetup(ctx context.Context, run runid.ID) (wire.RunSetup, error) {
	s, err := o.runSetup(ctx, run)
	if err != nil {
		return s, err
	}
	if _, recorded, err := o.recordedSetup(ctx, run); err != nil || recorded {
		return s, err
	}
	return s, o.writeSetup(ctx, run, s)
}

// setupCell is the cell Triad runs in a run's kernel when the kernel starts
// or restarts, before any cell of the caller's: it seeds random, NumPy's
// global generator (when numpy.random is first imported, so a kernel that
// never imports NumPy pays nothing, and the wasm kernel, which has none,
// works the same) and matplotlib's SVG ids, and sets TRIAD_SEED,
// TRIAD_AS_OF and SOURCE_DATE_EPOCH as variables and in the environment.
// It defines nothing else in the caller's namespace. It is not a tool call
// and has no Step Block; the journal's header and run.setup.json record
// what it set. See "Reproducible runs" in docs/DECISIONS.md.
func setupCell(s wire.RunSetup) string {
	asOf, _ := json.Marshal(s.AsOf)
	return strings.NewReplacer("$SEED", fmt.Sprint(s.Seed), "$ASOF", string(asOf), "$EPOCH", fmt.Sprint(s.SourceDateEpoch)).Replace(`# Triad's kernel setup: the run's seed and as-of date.
def _triad_setup(seed, as_of, epoch):
    import importlib.machinery, os, random, sys
    os.environ.update(TRIAD_SEED=str(seed), TRIAD_AS_OF=as_of, SOURCE_DATE_EPOCH=str(epoch))
    random.seed(seed)

    def seed_module(name, module):
        if name == "numpy.random":
            module.seed(seed)
        elif name == "matplotlib":
            module.rcParams["svg.hashsalt"] = str(seed)

    class TriadSeeder:
        def find_spec(self, name, path=None, target=None):
            if name not in ("numpy.random", "matplotlib"):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module):
                run(module)
                seed_module(name, module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "TriadSeeder"]
    sys.meta_path.insert(0, TriadSeeder())
    for name in ("numpy.random", "matplotlib"):
        if name in sys.modules:
            seed_module(name, sys.modules[name])


TRIAD_SEED, TRIAD_AS_OF = $SEED, $ASOF
_triad_setup(TRIAD_SEED, TRIAD_AS_OF, $EPOCH)
del _triad_setup
`)
}

// setCode is the setup cell that sets a cell's environment in an
// interpreter of lang ("" or python, r, javascript, typescript, bash):
// in Python, Kernel once per interpreter (a marker in its namespace says
// it was) and Call always; in the other languages, which keep no such
// marker, Kernel and then Call before every cell.
func (e CellEnv) setCode(lang string) string {
	if lang != "" && lang != wire.LanguagePython {
		all := maps.Clone(e.Kernel)
		if all == nil {
			all = map[string]string{}
		}
		maps.Copy(all, e.Call)
		return langEnvCode(lang, all, nil)
	}
	return "# Triad: the cell's environment variables (their values are not kept)\n" +
		"exec(" + pyStr(fmt.Sprintf(`import json as __triad_json, os as __triad_os
if not globals().get("__triad_env_set"):
    __triad_os.environ.update(__triad_json.loads(%s))
    __triad_env_set = True
__triad_os.environ.update(__triad_json.loads(%s))
del __triad_json, __triad_os`, pyJSON(e.Kernel), pyJSON(e.Call))) + ")\n"
}

// resetCode is the setup cell that undoes a cell's Call variables in an
// interpreter of lang: each back to its Kernel value, or unset.
func (e CellEnv) resetCode(lang string) string {
	restore := map[string]string{}
	var unset []string
	for k := range e.Call {
		if v, ok := e.Kernel[k]; ok {
			restore[k] = v
		} else {
			unset = append(unset, k)
		}
	}
	sort.Strings(unset)
	if lang != "" && lang != wire.LanguagePython {
		return langEnvCode(lang, restore, unset)
	}
	u, _ := json.Marshal(unset)
	return "# Triad: restore the environment after the cell\n" +
		"exec(" + pyStr(fmt.Sprintf(`import json as __triad_json, os as __triad_os
__triad_os.environ.update(__triad_json.loads(%s))
[__triad_os.environ.pop(k, None) for k in __triad_json.loads(%s)]
del __triad_json, __triad_os`, pyJSON(restore), pyStr(string(u)))) + ")\n"
}

// langEnvCode is a cell in lang (R, JavaScript, TypeScript or bash) that
// sets the variables in set and removes those in unset, printing nothing.
// A JSON string literal is a string literal in R and JavaScript too.
func langEnvCode(lang string, set map[string]string, unset []string) string {
	keys := slices.Sorted(maps.Keys(set))
	var b strings.Builder
	switch lang {
	case wire.LanguageR:
		if len(keys) > 0 {
			b.WriteString("invisible(Sys.setenv(")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%s = %s", pyStr(k), pyStr(set[k]))
			}
			b.WriteString("))\n")
		}
		if len(unset) > 0 {
			b.WriteString("invisible(Sys.unsetenv(c(")
			for i, k := range unset {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(pyStr(k))
			}
			b.WriteString(")))\n")
		}
	case wire.LanguageJavaScript, wire.LanguageTypeScript:
		for _, k := range keys {
			fmt.Fprintf(&b, "Deno.env.set(%s, %s);\n", pyStr(k), pyStr(set[k]))
		}
		for _, k := range unset {
			fmt.Fprintf(&b, "Deno.env.delete(%s);\n", pyStr(k))
		}
	case wire.LanguageBash:
		for _, k := range keys {
			fmt.Fprintf(&b, "export %s=%s\n", shQuote(k), shQuote(set[k]))
		}
		for _, k := range unset {
			fmt.Fprintf(&b, "unset %s\n", shQuote(k))
		}
	}
	return b.String()
}

// shQuote quotes s for bash as one word.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// pyJSON returns m as JSON inside a Python string literal.
func pyJSON(m map[string]string) string {
	if m == nil {
		m = map[string]string{}
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return pyStr(string(b))
}

// pyStr quotes s as a Python string literal: a JSON string is one (Go
// escapes every control character, and <, > and & as \u escapes, all of
// which Python reads the same way).
func pyStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// setUpKernel runs the setup cell in a kernel that just started or
// restarted. A kernel that cannot be set up is dropped: the next call
// starts a fresh one.
func (o *Orchestrator) setUpKernel(ctx context.Context, run runid.ID, sess *kernels.Session) error {
	s, err := o.runSetup(ctx, run)
	if err != nil {
		return err
	}
	err = runSetupCell(ctx, sess.Kernel, setupCell(s))
	if err != nil {
		o.kernels.Drop(run)
		return sandboxErr(fmt.Errorf("set up the run's kernel (seed %d): %w", s.Seed, err))
	}
	if err := o.setUpEgress(ctx, run, sess.Kernel); err != nil {
		o.kernels.Drop(run)
		if fault.As(err) != nil {
			return err
		}
		return sandboxErr(fmt.Errorf("set up the run's egress: %w", err))
	}
	return nil
}

// runSetupCell executes the setup cell; it is the one place the setup
// talks to the sandbox seam.
func runSetupCell(ctx context.Context, k sandbox.Kernel, code string) error {
	res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: setupTimeout, Setup: true})
	if err != nil {
		return err
	}
	if !res.OK {
		msg := "the setup cell failed"
		if res.Error != nil {
			msg += ": " + strings.TrimSpace(res.Error.Kind+" "+res.Error.Ename+": "+res.Error.Evalue)
		}
		return errors.New(msg)
	}
	return nil
}

// prepareKernel sets up a session's kernel if it just started, and notes in
// the step whether the cell runs in an interpreter no earlier cell of the
// run ran in (a new kernel, or one restarted since the last cell): a
// replay restarts its kernel there too.
func (o *Orchestrator) prepareKernel(ctx context.Context, run runid.ID, sess *kernels.Session, oc *ExecOutcome) error {
	o.smu.Lock()
	oc.Fresh = sess.Fresh || o.fresh[run]
	delete(o.fresh, run)
	o.smu.Unlock()
	if sess.Fresh {
		return o.setUpKernel(ctx, run, sess)
	}
	return nil
}

// kernelRestarted sets up a kernel whose interpreter was replaced (a cell
// that could not be stopped, a death, POST /sandbox/restart): the next
// cell runs fresh.
func (o *Orchestrator) kernelRestarted(ctx context.Context, run runid.ID, sess *kernels.Session) error {
	o.smu.Lock()
	o.fresh[run] = true
	o.smu.Unlock()
	return o.setUpKernel(ctx, run, sess)
}

// keepCode stores a cell's source as a blob, so a replay can recover it by
// the hash the trace records. The store write runs beside the cell (it is
// a durable write, as long as a short cell): the returned wait reports
// its failure, which fails the call.
func (o *Orchestrator) keepCode(ctx context.Context, run runid.ID, code string, oc *ExecOutcome) (wait func() error) {
	d := tmpfs.DigestOf([]byte(code))
	oc.CodeSHA256 = d
	done := make(chan error, 1)
	go func() {
		// A cell run again (the same source) is stored already.
		if n, err := o.store.Blobs().Stat(ctx, d); err == nil && n == int64(len(code)) {
			done <- nil
			return
		}
		_, _, err := o.store.Blobs().Put(ctx, strings.NewReader(code), 0)
		done <- err
	}()
	return func() error {
		if err := <-done; err != nil {
			return storeErr(err, run, "the cell's source")
		}
		return nil
	}
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
	return inputs(Input{"original", rep.Original}, Input{"seed", rep.Setup.Replay.Seed}, Input{"as_of", rep.Setup.Replay.AsOf})
}

// grade fails a replay that did not reproduce every file: the evaluator's
// verdict then says so on the Step Block.
func (r *ReplayOutcome) grade(req *evaluator.Request) {
	if rep := r.Report; !rep.Identical {
		req.OK = false
		req.Error = fmt.Sprintf("the replay diverged: %d of %d file(s) differ, first at original step %d",
			rep.Different, rep.Different+rep.Same, rep.FirstDivergence)
	}
}

func (r *ReplayOutcome) describe(s *Step) (did, next []string, failed bool) {
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

// RecordReplay writes a replay's report to artifacts/reproducibility.json
// through the orchestration path, so the replay's journal has a Step Block
// for it with the evaluator's verdict, and its trace a line.
func (o *Orchestrator) RecordReplay(ctx context.Context, run runid.ID, rep *wire.ReplayReport) (wire.FileRef, error) {
	var ref wire.FileRef
	err := o.call(ctx, run, &ReplayOutcome{Report: rep}, func(ctx context.Context, s *Step) error {
		b, err := runfiles.MarshalIndent(rep)
		if err != nil {
			return err
		}
		f, err := o.store.WriteBytes(ctx, run, runfiles.Reproducibility, append(b, '\n'))
		if err != nil {
			return storeErr(err, run, runfiles.Reproducibility)
		}
		s.Artifacts = append(s.Artifacts, f)
		ref = wire.Ref(f)
		return o.mirrorPut(ctx, run, f)
	})
	return ref, err
}
