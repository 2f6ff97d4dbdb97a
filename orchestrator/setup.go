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
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator/journal"
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
	st := o.setups
	s, err := st.complete(ctx, run, s)
	if err != nil {
		return s, err
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, false); err != nil {
		return s, err
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return s, err
	}
	defer held.Unlock()
	old, recorded, err := recordedSetup(ctx, st.store, run)
	if err != nil {
		return s, err
	}
	if recorded {
		if old.Seed == s.Seed && old.AsOf == s.AsOf && old.Template == s.Template && sameEgress(old.Egress, s.Egress) {
			r.cacheSetup(old)
			return old, nil
		}
		if tr, err := journal.ReadTrace(ctx, o.store, run); err != nil {
			return s, err
		} else if len(tr) > 0 {
			return s, fault.New(fault.Conflict, fmt.Sprintf("run %s was set up with seed %d, as_of %q and template %q, and has made calls", run, old.Seed, old.AsOf, old.Template),
				fmt.Sprintf("keep seed %d, as_of %q, template %q and its egress for this run, or start a new run with the new values", old.Seed, old.AsOf, old.Template))
		}
	}
	if err := st.write(ctx, run, s); err != nil {
		return s, err
	}
	r.cacheSetup(s)
	return s, nil
}

// CheckSetup validates s as the setup of run, a run about to be created,
// without recording anything: a surface checks a setup before it creates
// the run, so that a refused setup leaves no run behind.
func (o *Orchestrator) CheckSetup(ctx context.Context, run runid.ID, s wire.RunSetup) error {
	_, err := o.setups.complete(ctx, run, s)
	return err
}

// complete validates s and fills in what the server knows: the run's
// sandbox (template, image, egress) among it.
func (st setups) complete(ctx context.Context, run runid.ID, s wire.RunSetup) (wire.RunSetup, error) {
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
	if st.kernels != nil {
		s.Backend, s.Image = st.kernels.Backend(), st.kernels.Image()
	}
	if err := st.sb.resolve(ctx, &s); err != nil {
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

func (r *run) cacheSetup(s wire.RunSetup) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setup = &s
}

// recordedSetup reads run.setup.json.
func recordedSetup(ctx context.Context, store *tmpfs.Store, run runid.ID) (wire.RunSetup, bool, error) {
	var s wire.RunSetup
	b, _, err := store.ReadAll(ctx, run, runfiles.Setup)
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

func (st setups) write(ctx context.Context, run runid.ID, s wire.RunSetup) error {
	b, err := runfiles.MarshalIndent(s)
	if err != nil {
		return err
	}
	_, err = st.files.write(ctx, run, runfiles.Setup, append(b, '\n'))
	return err
}

// runSetup returns the run's setup: the one set or recorded, else the
// default (seed 0, no as_of), which the run's first call records.
func (st setups) of(ctx context.Context, r *run) (wire.RunSetup, error) {
	r.mu.Lock()
	cached := r.setup
	r.mu.Unlock()
	if cached != nil {
		return *cached, nil
	}
	s, recorded, err := recordedSetup(ctx, st.store, r.id)
	if err != nil {
		return s, err
	}
	if !recorded {
		if s, err = st.complete(ctx, r.id, wire.RunSetup{SeedFrom: defaultSeedFrom}); err != nil {
			return s, err
		}
	}
	r.cacheSetup(s)
	return s, nil
}

// spec is what the run's kernel starts from: its template's image and
// limits, as its setup chose them.
func (st setups) spec(ctx context.Context, r *run) (sandbox.Spec, error) {
	s, err := st.of(ctx, r)
	if err != nil {
		return sandbox.Spec{}, err
	}
	sb, err := st.sb.of(r.id, s)
	return sb.spec, err
}

// ensureSetup records the run's setup if it has no record yet, at its
// first call, and returns it for the journal's header.
func (st setups) ensure(ctx context.Context, r *run) (wire.RunSetup, error) {
	s, err := st.of(ctx, r)
	if err != nil {
		return s, err
	}
	if _, recorded, err := recordedSetup(ctx, st.store, r.id); err != nil || recorded {
		return s, err
	}
	return s, st.write(ctx, r.id, s)
}

// header is the run's journal header, written at its first call or note:
// its recipe and objective as SetRunInfo gave them, and its setup, which
// is recorded then too, so every journaled run has one.
func (st setups) header(ctx context.Context, r *run, when time.Time) (cel.Header, error) {
	r.mu.Lock()
	h := cel.Header{Run: r.id}
	if r.header != nil {
		h = *r.header
	}
	r.mu.Unlock()
	h.Started = when
	setup, err := st.ensure(ctx, r)
	if err != nil {
		return h, err
	}
	h.Setup = &setup
	return h, nil
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
func (st setups) setUp(ctx context.Context, r *run, sess *kernels.Session) error {
	s, err := st.of(ctx, r)
	if err != nil {
		return err
	}
	err = runSetupCell(ctx, sess.Kernel, setupCell(s))
	if err != nil {
		st.kernels.Drop(r.id)
		return sandboxErr(fmt.Errorf("set up the run's kernel (seed %d): %w", s.Seed, err))
	}
	if err := st.sb.setUp(ctx, r.id, s, sess.Kernel); err != nil {
		st.kernels.Drop(r.id)
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
func (st setups) prepare(ctx context.Context, r *run, sess *kernels.Session, oc *ExecOutcome) error {
	r.mu.Lock()
	oc.Fresh = sess.Fresh || r.fresh
	r.fresh = false
	r.mu.Unlock()
	if sess.Fresh {
		return st.setUp(ctx, r, sess)
	}
	return nil
}

// kernelRestarted sets up a kernel whose interpreter was replaced (a cell
// that could not be stopped, a death, POST /sandbox/restart): the next
// cell runs fresh.
func (st setups) restarted(ctx context.Context, r *run, sess *kernels.Session) error {
	r.mu.Lock()
	r.fresh = true
	r.mu.Unlock()
	return st.setUp(ctx, r, sess)
}

// keepCode stores a cell's source as a blob, so a replay can recover it by
// the hash the trace records. The store write runs beside the cell (it is
// a durable write, as long as a short cell): the returned wait reports
// its failure, which fails the call.
func (x *cell) keepCode(ctx context.Context) (wait func() error) {
	o, code, run := x.o, x.in.Code, x.run
	d := tmpfs.DigestOf([]byte(code))
	x.oc.CodeSHA256 = d
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

// RecordReplay writes a replay's report to artifacts/reproducibility.json
// through the orchestration path, so the replay's journal has a Step Block
// for it with the evaluator's verdict, and its trace a line.
func (o *Orchestrator) RecordReplay(ctx context.Context, run runid.ID, rep *wire.ReplayReport) (wire.FileRef, error) {
	var ref wire.FileRef
	err := o.call(ctx, run, &ReplayOutcome{Report: rep}, nil, func(ctx context.Context, c *call) error {
		b, err := runfiles.MarshalIndent(rep)
		if err != nil {
			return err
		}
		f, err := o.store.WriteBytes(ctx, run, runfiles.Reproducibility, append(b, '\n'))
		if err != nil {
			return storeErr(err, run, runfiles.Reproducibility)
		}
		c.step.Artifacts = append(c.step.Artifacts, f)
		ref = wire.Ref(f)
		return o.files.put(ctx, run, f)
	})
	return ref, err
}

// setups keep the runs' setups (seed, as_of) and set up their kernels.
type setups struct {
	store   *tmpfs.Store
	kernels *kernels.Manager // nil: no sandbox
	files   mirror
	sb      *sandboxes
}
