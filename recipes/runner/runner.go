// Package runner executes recipes: each step a tool call through the one orchestration path, with resume, progress events and a run notebook.
//
// A run's state lives in its own files (run.json), so a server that was
// killed mid-run can report the run as interrupted and resume it: every step
// is keyed by its templated definition plus the hashes of the run's files
// before it, and a step whose key matches a recorded success and whose
// outputs are still present by hash is skipped.
package runner

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/notebook"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Files the runner keeps in the run.
const (
	StatePath    = runfiles.RunState
	NotebookPath = runfiles.Notebook
)

// Run and step statuses.
const (
	Queued    = "queued"
	Running   = "running"
	Succeeded = "succeeded"
	Failed    = "failed"
	Pending   = "pending"
	Skipped   = "skipped"
)

// Request starts or resumes a recipe run.
type Request = wire.RecipeRunRequest

// State is a run as run.json records it.
type State = wire.RecipeState

// StepState is one recipe step's progress.
type StepState = wire.RecipeStep

// Event is a progress event, streamed as Server-Sent Events.
type Event = wire.RunEvent

// Core is what the runner calls of the orchestrator: the runs it creates
// or resumes, the tool calls of their steps (through the one orchestration
// path, with each step's label and expected files), reads of their files,
// checked like every read, and their bookkeeping. *orchestrator.Orchestrator
// implements it.
type Core interface {
	Create(ctx context.Context, run runid.ID, opts ...orchestrator.RunOption) error
	OpenRun(ctx context.Context, run runid.ID, opts ...orchestrator.RunOption) error
	Visible(ctx context.Context, run runid.ID) error
	ReadRun(ctx context.Context, run runid.ID) (*orchestrator.RunReader, error)
	Status(ctx context.Context, run runid.ID) (wire.RunView, error)
	SetRunSetup(ctx context.Context, run runid.ID, s wire.RunSetup) (wire.RunSetup, error)
	SetRecipeState(ctx context.Context, run runid.ID, recipe, status string)
	PutInternal(ctx context.Context, run runid.ID, path string, data []byte) (tmpfs.File, error)
	Exec(ctx context.Context, run runid.ID, in wire.ExecRequest, opts ...orchestrator.CallOption) (wire.ExecResponse, error)
	Search(ctx context.Context, run runid.ID, w wire.SearchRequest, opt orchestrator.SearchOptions, opts ...orchestrator.CallOption) (wire.SearchResponse, error)
	Write(ctx context.Context, run runid.ID, in wire.WriteRequest, opts ...orchestrator.CallOption) (wire.FileRef, error)
	Note(ctx context.Context, run runid.ID, text, author string) error
	Finalize(ctx context.Context, run runid.ID, status string) error
	// Stop stops the run's kernel, if one is live; its files stay.
	Stop(ctx context.Context, run runid.ID) error
	// Graded waits for the verdict of a step the evaluator could not
	// grade yet (UNGRADED), which the orchestrator grades again.
	Graded(ctx context.Context, run runid.ID, step int) (evaluator.Verdict, error)
}

var _ Core = (*orchestrator.Orchestrator)(nil)

// Config configures a Runner.
type Config struct {
	Orchestrator Core
	Catalog      *recipes.Catalog
	// Backend is the sandbox backend's name ("docker" or "wasm"), which
	// decides whether Docker-only recipes can run; "" means no sandbox.
	Backend string
	Logger  *slog.Logger
}

// Runner runs recipes in the background and reports on them.
type Runner struct {
	c   Config
	o   Core
	log *slog.Logger

	ctx    context.Context // the runner's lifetime: runs outlive requests
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	active map[runid.ID]*active
}

type active struct {
	state State
	subs  map[chan Event]struct{}
	done  chan struct{}
}

// New returns a Runner.
func New(c Config) *Runner {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runner{c: c, o: c.Orchestrator, log: c.Logger, ctx: ctx, cancel: cancel, active: map[runid.ID]*active{}}
}

// Supports reports whether this server's sandbox can run rec: a recipe
// that needs the Docker sandbox image runs only on it.
func (r *Runner) Supports(rec *recipes.Recipe) bool {
	return rec.Backend != recipes.BackendDocker || r.c.Backend == "docker"
}

// Catalog returns the recipes the runner knows.
func (r *Runner) Catalog() *recipes.Catalog { return r.c.Catalog }

// Close stops every run in flight (they are left interrupted, resumable)
// and waits for them. It is safe to call twice.
func (r *Runner) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

// Start validates req, records the run as queued and runs it in the
// background. It returns the run's state as queued. inputs are the
// caller's files for the recipe's inputs, by input name (nil for none):
// the run's first steps write them, after its setup is recorded. A
// request that is refused leaves nothing behind: a fresh run is claimed
// only once the request has passed every check.
func (r *Runner) Start(ctx context.Context, req Request, inputs map[string][]byte) (State, error) {
	p, err := r.prepare(ctx, req, inputs)
	if err != nil {
		return State{}, err
	}
	st := cloneState(p.state)
	// The run outlives the request, but acts for the caller who started
	// it: its calls are recorded as theirs and checked against their
	// tenant's quotas.
	rctx := auth.With(r.ctx, auth.From(ctx))
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.execute(rctx, p)
	}()
	return st, nil
}

// Run runs req to the end in the caller's goroutine and returns the final
// state. The CLI uses it.
func (r *Runner) Run(ctx context.Context, req Request, inputs map[string][]byte, progress func(Event)) (State, error) {
	p, err := r.prepare(ctx, req, inputs)
	if err != nil {
		return State{}, err
	}
	if progress != nil {
		ch, cancel := r.Subscribe(p.run)
		defer cancel()
		go func() {
			for e := range ch {
				progress(e)
			}
		}()
	}
	r.execute(ctx, p)
	return r.Status(context.WithoutCancel(ctx), p.run)
}

type prepared struct {
	run    runid.ID
	plan   *recipes.Plan
	state  State
	resume bool
	inputs map[string][]byte
}

func (r *Runner) prepare(ctx context.Context, req Request, inputs map[string][]byte) (*prepared, error) {
	if r.c.Backend == "" {
		return nil, fault.New(fault.NotConfigured, "no sandbox backend is configured, and recipes need one",
			"start triad with --sandbox docker, wasm or auto")
	}
	// A run_id names the caller's own run to resume, or a fresh id for a
	// new run (another tenant's is not found); without one, the run gets
	// an id nobody can have named. Either is made the caller's in the core
	// only once every check below has passed.
	run := runid.New()
	exists := false // the run has an owner, and it is the caller's tenant
	if req.RunID != "" {
		id, err := runid.Parse(req.RunID)
		if err != nil {
			return nil, err
		}
		run = id
		// Another tenant's run is not found, like one nobody made; a run
		// nobody made is claimed below, once the request has passed every
		// check, so a refused request leaves no run behind.
		switch err := r.o.Visible(ctx, run); {
		case err == nil:
			exists = true
		case !isNotFound(err):
			return nil, err
		}
	}
	var (
		prev    State
		hasPrev bool
	)
	if exists {
		var err error
		if prev, hasPrev, err = r.load(ctx, run); err != nil {
			return nil, err
		}
	}
	if req.Recipe == "" && hasPrev {
		req.Recipe = prev.Recipe
	}
	if req.Recipe == "" && req.RunID != "" {
		if !exists {
			// A resume of a run the caller cannot see.
			return nil, fault.New(fault.NotFound, fmt.Sprintf("no run %s to resume", run), "check the run id (GET /runs lists your runs), or name a recipe to start a new run")
		}
		return nil, fault.New(fault.NotFound, fmt.Sprintf("run %s is no recipe run to resume", run),
			"name a recipe to start one in it (GET /recipes lists them), or name a failed or interrupted recipe run")
	}
	if req.Recipe == "" {
		return nil, fault.New(fault.BadInput, "recipe is empty", "name a recipe; GET /recipes lists them")
	}
	rec, err := r.c.Catalog.Get(req.Recipe)
	if err != nil {
		if fe := fault.As(err); fe != nil && fe.Kind == fault.NotFound {
			return nil, &fault.Error{Kind: fault.BadInput, Message: fe.Message, Suggestion: fe.Suggestion, Err: err}
		}
		return nil, err
	}
	if hasPrev {
		r.mu.Lock()
		_, busy := r.active[run]
		r.mu.Unlock()
		if busy {
			return nil, fault.New(fault.Conflict, fmt.Sprintf("run %s is still running", run), "wait for it: GET /runs/"+run.String())
		}
		if prev.Recipe != rec.Name {
			return nil, fault.New(fault.Conflict, fmt.Sprintf("run %s ran recipe %s, not %s", run, prev.Recipe, rec.Name),
				"resume it with its own recipe, or start a new run without run_id")
		}
	}
	params := map[string]any{}
	if hasPrev && len(req.Params) == 0 {
		for k, v := range prev.Params {
			params[k] = v
		}
	}
	for k, v := range req.Params {
		params[k] = v
	}
	objective := req.Objective
	if objective == "" && hasPrev {
		objective = prev.Objective
	}
	if _, ok := rec.Param("objective"); ok && objective != "" {
		params["objective"] = objective
	}
	data, err := r.inputData(ctx, run, exists, rec, inputs)
	if err != nil {
		return nil, err
	}
	params, derived, err := rec.Derive(params, data)
	if err != nil {
		return nil, err
	}
	plan, err := rec.Bind(params)
	if err != nil {
		return nil, err
	}
	if !r.Supports(rec) {
		return nil, fault.New(fault.Unsupported,
			fmt.Sprintf("recipe %s needs the Docker sandbox (numpy, pandas and more), and this server runs the %s sandbox", rec.Name, r.c.Backend),
			"start triad with --sandbox docker (or auto, with a Docker engine running), or run a recipe whose backend is any")
	}
	if objective == "" {
		if v, ok := plan.Params["objective"].(string); ok {
			objective = v
		}
	}
	for name := range inputs {
		found := false
		for _, in := range rec.Inputs {
			found = found || in.Name == name
		}
		if !found {
			return nil, fault.Badf("the recipe's inputs are listed by GET /recipes/"+rec.Name, "recipe %s has no input %q", rec.Name, name)
		}
	}
	// Every check passed: a fresh id becomes the caller's run now, in the
	// core, once (another call may have made it meanwhile: then it is not
	// found, or the caller's own); a run the caller has stays so.
	if err := r.o.OpenRun(ctx, run); err != nil {
		return nil, err
	}
	// The kernel's setup (seed, as_of) is recorded before the first call;
	// a resume that would change it is refused here.
	if _, err := r.o.SetRunSetup(ctx, run, wire.RunSetup{Seed: plan.Params[recipes.ParamSeed].(int64), SeedFrom: derived.SeedFrom,
		AsOf: plan.Params[recipes.ParamAsOf].(string), AsOfFrom: derived.AsOfFrom, Recipe: rec.Name, Template: cmp.Or(req.Template, rec.Template)}); err != nil {
		if fe := fault.As(err); fe != nil && fe.Kind == fault.Conflict && !hasPrev {
			// Files uploaded by tool calls before the recipe started fixed
			// the run's setup at its default.
			return nil, &fault.Error{Kind: fe.Kind, Message: fe.Message, Err: err,
				Suggestion: "send the recipe's input files with POST /run itself (multipart/form-data: a request part with this JSON and one input:<name> part per file), so the run is set up before its first call; or start a new run without run_id"}
		}
		return nil, err
	}
	st := State{RunID: run.String(), Recipe: rec.Name, Objective: objective, Params: plan.Params, Status: Queued, Created: time.Now().UTC()}
	if hasPrev {
		st.Created = prev.Created
		st.Resumes = prev.Resumes + 1
	}
	for _, s := range plan.Steps {
		ss := StepState{N: s.N, ID: s.ID, Title: s.Title, Kind: string(s.Kind), Status: Pending}
		if hasPrev {
			for _, old := range prev.Steps {
				if old.ID == s.ID && (old.Status == Succeeded || old.Status == Skipped) {
					ss.Key, ss.Outputs, ss.Produced = old.Key, old.Outputs, old.Produced
				}
			}
		}
		st.Steps = append(st.Steps, ss)
	}
	p := &prepared{run: run, plan: plan, state: st, resume: hasPrev, inputs: inputs}
	r.mu.Lock()
	r.active[run] = &active{state: st, subs: map[chan Event]struct{}{}, done: make(chan struct{})}
	r.mu.Unlock()
	if err := r.save(ctx, run, st); err != nil {
		r.mu.Lock()
		delete(r.active, run)
		r.mu.Unlock()
		return nil, err
	}
	r.o.SetRecipeState(ctx, run, st.Recipe, st.Status)
	return p, nil
}

// execute runs a prepared plan to its end.
func (r *Runner) execute(ctx context.Context, p *prepared) {
	run := p.run
	defer func() {
		r.mu.Lock()
		a := r.active[run]
		delete(r.active, run)
		if a != nil {
			for ch := range a.subs {
				close(ch)
				delete(a.subs, ch)
			}
			close(a.done)
		}
		r.mu.Unlock()
	}()
	st := &p.state
	if err := r.o.OpenRun(ctx, run, orchestrator.WithRunInfo(p.plan.Recipe.Name, st.Objective)); err != nil {
		r.log.Error("name the run's recipe and objective in its journal", "run", run, "err", err)
	}
	st.Status = Running
	r.update(ctx, run, st, Event{Type: "run", Status: Running})

	results := make([]*notebook.Exec, len(p.plan.Steps))
	// finish records the run's end: its notebook and the journal's
	// summary first, then the terminal status, so a caller that sees the
	// run ended finds every record of it written.
	finish := func(status, msg string) {
		wctx := context.WithoutCancel(ctx)
		if err := r.writeNotebook(wctx, run, p.plan, results); err != nil {
			r.log.Error("write run notebook", "run", run, "err", err)
		}
		if err := r.o.Finalize(wctx, run, status); err != nil {
			r.log.Error("finalize journal", "run", run, "err", err)
		}
		// A finished run needs its kernel no more: its slot in the
		// tenant's kernel quota is free at once, not after --idle-ttl.
		// Its files stay, and a resume starts a fresh kernel.
		if err := r.o.Stop(wctx, run); err != nil {
			r.log.Error("release the run's kernel", "run", run, "err", err)
		}
		st.Status, st.Error = status, msg
		now := time.Now().UTC()
		st.Finished = &now
		r.update(wctx, run, st, Event{Type: "run", Status: status, Error: msg})
	}
	fail := func(msg string) {
		if ctx.Err() != nil {
			msg = "interrupted: " + msg
		}
		finish(Failed, msg)
	}

	if err := r.seed(ctx, run, p); err != nil {
		fail("seeding inputs: " + errText(err))
		return
	}

	skipped := []string{}
	announced := false
	ran := make([]bool, len(p.plan.Steps)) // steps executed in this session
	for i := range p.plan.Steps {
		step := &p.plan.Steps[i]
		ss := &st.Steps[i]
		if ctx.Err() != nil {
			fail(fmt.Sprintf("the server stopped before step %d (%s)", step.N, step.ID))
			return
		}
		// The files before this step: on resume, what this step and the
		// later ones not yet run again produced last time did not exist then.
		exclude := map[string]bool{}
		if p.resume {
			for j := i; j < len(st.Steps); j++ {
				if !ran[j] {
					for path := range st.Steps[j].Produced {
						exclude[path] = true
					}
				}
			}
		}
		key, err := r.key(ctx, run, p.plan, step, exclude)
		if err != nil {
			fail(errText(err))
			return
		}
		if p.resume && !step.Rerun && ss.Key == key && r.outputsPresent(ctx, run, ss.Outputs) {
			ss.Status = Skipped
			skipped = append(skipped, fmt.Sprintf("%d (%s)", step.N, step.ID))
			r.update(ctx, run, st, Event{Type: "step", Step: step.N, ID: step.ID, Title: step.Title, Status: Skipped})
			continue
		}
		if p.resume && !announced && !step.Rerun {
			// The first step that runs again: say in the journal what the
			// resume skipped and where it continues.
			announced = true
			note := fmt.Sprintf("Resumed (resume %d): no step could be skipped; running again from step %d (%s).", st.Resumes, step.N, step.ID)
			if len(skipped) > 0 {
				note = fmt.Sprintf("Resumed (resume %d): skipped step(s) %s, whose inputs are unchanged and whose outputs are present by hash; continuing at step %d (%s).",
					st.Resumes, strings.Join(skipped, ", "), step.N, step.ID)
			}
			if err := r.o.Note(ctx, run, note, "triad resume"); err != nil {
				r.log.Error("journal resume note", "run", run, "err", err)
			}
		}
		ran[i] = true
		ss.Status, ss.Key, ss.Error, ss.Produced = Running, key, "", nil
		r.update(ctx, run, st, Event{Type: "step", Step: step.N, ID: step.ID, Title: step.Title, Status: Running})
		t0 := time.Now()
		rc := &orchestrator.Receipt{}
		res, produced, err := r.step(ctx, run, p.plan, i, rc)
		ss.Produced = produced
		ss.DurationMs = time.Since(t0).Milliseconds()
		results[i] = res
		ss.Evaluation = r.evaluation(ctx, run, rc)
		if err == nil {
			ss.Outputs, err = r.outputs(ctx, run, step)
		}
		if err != nil {
			ss.Status, ss.Error = Failed, errText(err)
			r.update(context.WithoutCancel(ctx), run, st, Event{Type: "step", Step: step.N, ID: step.ID, Title: step.Title, Status: Failed, Error: ss.Error})
			fail(fmt.Sprintf("step %d (%s) failed: %s", step.N, step.ID, ss.Error))
			return
		}
		ss.Status = Succeeded
		r.update(ctx, run, st, Event{Type: "step", Step: step.N, ID: step.ID, Title: step.Title, Status: Succeeded})
	}
	if p.resume && !announced {
		r.o.Note(ctx, run, fmt.Sprintf("Resumed (resume %d): every step was unchanged with its outputs present by hash; skipped %s.",
			st.Resumes, strings.Join(skipped, ", ")), "triad resume")
	}
	finish(Succeeded, "")
}

// seed writes the recipe's inputs through tmp.write: the caller's files,
// else what the run already has, else the bundled sample data.
func (r *Runner) seed(ctx context.Context, run runid.ID, p *prepared) error {
	for _, in := range p.plan.Recipe.Inputs {
		data, given := p.inputs[in.Name]
		if !given {
			if _, err := r.stat(ctx, run, in.Path); err == nil {
				continue
			}
			if in.Default == "" {
				if in.Required {
					return fault.Badf("upload it first with tmp.write, or pass --input "+in.Name+"=FILE", "input %s (%s) is required", in.Name, in.Path)
				}
				continue
			}
			b, err := in.DefaultData()
			if err != nil {
				return err
			}
			data = b
		}
		req := wire.WriteRequest{Path: in.Path}
		if text := string(data); utf8.ValidString(text) {
			req.Text = &text
		} else { // an uploaded spreadsheet, say
			b64 := base64.StdEncoding.EncodeToString(data)
			req.BytesB64 = &b64
		}
		info := orchestrator.WithStep(orchestrator.StepInfo{Label: fmt.Sprintf("Seeded recipe input %s", in.Name),
			Expected: []evaluator.Expect{{Path: in.Path}}})
		if _, err := r.o.Write(ctx, run, req, info); err != nil {
			return err
		}
	}
	return nil
}

// inputData returns the bytes each of the recipe's inputs will hold, as
// seed will write them: the caller's file, else what the run already has,
// else the bundled sample data. The seed and as_of are derived from them.
func (r *Runner) inputData(ctx context.Context, run runid.ID, exists bool, rec *recipes.Recipe, given map[string][]byte) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, in := range rec.Inputs {
		if b, ok := given[in.Name]; ok {
			out[in.Name] = b
			continue
		}
		// A run the caller does not hold yet has no files to read.
		err := tmpfs.ErrNotFound
		var b []byte
		if exists {
			b, err = r.readAll(ctx, run, in.Path)
		}
		switch {
		case err == nil:
			out[in.Name] = b
		case !errors.Is(err, tmpfs.ErrNotFound):
			return nil, err
		case in.Default != "":
			if out[in.Name], err = in.DefaultData(); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// step runs one plan step through the orchestrator.
func (r *Runner) step(ctx context.Context, run runid.ID, plan *recipes.Plan, i int, rc *orchestrator.Receipt) (*notebook.Exec, map[string]string, error) {
	s := plan.Steps[i]
	info := orchestrator.StepInfo{Receipt: rc, Label: fmt.Sprintf("Recipe %s, step %d/%d: %s (%s)", plan.Recipe.Name, s.N, len(plan.Steps), s.Title, s.ID)}
	for _, o := range s.Outputs {
		info.Expected = append(info.Expected, o.ExpectedFile)
	}
	if i+1 < len(plan.Steps) {
		n := plan.Steps[i+1]
		info.Next = []string{fmt.Sprintf("Step %d: %s (%s)", n.N, n.Title, n.ID)}
	} else {
		info.Next = []string{"Read the deliverables under artifacts/ (artifacts/index.json lists them)"}
	}
	opt := orchestrator.WithStep(info)
	switch s.Kind {
	case recipes.KindExec:
		in := wire.ExecRequest{Code: s.Code, Language: s.Language}
		if s.Language == wire.LanguageBash {
			in.Context = wire.LanguageBash // the run's bash kernel, not a one-off command
		}
		if s.Timeout > 0 {
			t := s.Timeout.Seconds()
			in.TimeoutS = &t
		}
		out, err := r.o.Exec(ctx, run, in, opt)
		if err != nil {
			return nil, nil, err
		}
		produced := map[string]string{}
		for _, f := range out.FilesOut {
			produced[f.Path] = f.SHA256.String()
		}
		res := &notebook.Exec{Answer: &out, Images: rc.Images}
		if !out.OK {
			msg := "the cell failed"
			if out.Error != nil {
				msg = out.Error.Message
			}
			return res, produced, errors.New(msg)
		}
		return res, produced, nil
	case recipes.KindSearch:
		_, err := r.o.Search(ctx, run, s.Search.Wire(), orchestrator.SearchOptions{SaveAs: s.SaveAs}, opt)
		if err != nil {
			return nil, nil, err
		}
		f, err := r.stat(ctx, run, s.SaveAs)
		return nil, map[string]string{s.SaveAs: f.SHA256.String()}, err
	case recipes.KindWrite:
		text := s.Write.Text
		ref, err := r.o.Write(ctx, run, wire.WriteRequest{Path: s.Write.Path, Text: &text}, opt)
		if err != nil {
			return nil, nil, err
		}
		return nil, map[string]string{ref.Path: ref.SHA256.String()}, nil
	}
	return nil, nil, fmt.Errorf("unknown step kind %q", s.Kind)
}

// key is the step's resume key: its definition plus the run's files
// before it.
func (r *Runner) key(ctx context.Context, run runid.ID, plan *recipes.Plan, s *recipes.Step, exclude map[string]bool) (string, error) {
	rr, err := r.o.ReadRun(ctx, run)
	if err != nil {
		return "", err
	}
	files, err := rr.List(ctx, "")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(s.Definition())
	h.Write([]byte{0})
	// The run's seed and as_of are not in the parameters cell's source but
	// decide what every cell computes.
	fmt.Fprintf(h, "seed=%v\x00as_of=%v\x00", plan.Params[recipes.ParamSeed], plan.Params[recipes.ParamAsOf])
	for _, f := range files {
		if runfiles.IsKept(f.Path) || exclude[f.Path] {
			continue
		}
		fmt.Fprintf(h, "%s\x00%s\n", f.Path, f.SHA256)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// outputs checks the step's declared outputs exist and returns their hashes.
func (r *Runner) outputs(ctx context.Context, run runid.ID, s *recipes.Step) (map[string]string, error) {
	out := map[string]string{}
	var missing []string
	for _, o := range s.Outputs {
		f, err := r.stat(ctx, run, o.Path)
		if err != nil || f.Size == 0 {
			missing = append(missing, o.Path)
			continue
		}
		out[o.Path] = f.SHA256.String()
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the step did not leave its declared output(s) %s", strings.Join(missing, ", "))
	}
	return out, nil
}

func (r *Runner) outputsPresent(ctx context.Context, run runid.ID, want map[string]string) bool {
	for p, sha := range want {
		f, err := r.stat(ctx, run, p)
		if err != nil || f.SHA256.String() != sha {
			return false
		}
	}
	return true
}

// evaluation renders the verdict the orchestration path recorded for a
// step's last tool call. A step the evaluator could not grade yet waits
// for its regrade (Core.Graded): an infrastructure hiccup never counts as
// the step's FAIL. Only the run's own end (ctx) stops the wait, and the
// step then shows UNGRADED.
func (r *Runner) evaluation(ctx context.Context, run runid.ID, rc *orchestrator.Receipt) string {
	if rc.Step == 0 {
		return "" // the step made no tool call that was recorded
	}
	v := rc.Verdict
	if v.Ungraded {
		if g, err := r.o.Graded(ctx, run, rc.Step); err == nil {
			v = g
		} else {
			r.log.Warn("wait for a step's verdict", "run", run, "step", rc.Step, "err", err)
		}
	}
	if v.Ungraded {
		return "UNGRADED"
	}
	return fmt.Sprintf("%s %.2f", v.Word(), v.Score)
}

// update saves the state and tells subscribers.
func (r *Runner) update(ctx context.Context, run runid.ID, st *State, e Event) {
	e.RunID, e.Time = run.String(), time.Now().UTC()
	// Stored first, then shown: a reader that sees the new state finds
	// run.json and the run index saying the same.
	if err := r.save(ctx, run, *st); err != nil {
		r.log.Error("save run state", "run", run, "err", err)
	}
	r.o.SetRecipeState(ctx, run, st.Recipe, st.Status)
	r.mu.Lock()
	a := r.active[run]
	if a != nil {
		a.state = cloneState(*st)
		for ch := range a.subs {
			select {
			case ch <- e:
			default: // a subscriber that does not keep up misses events, not the run
			}
		}
	}
	r.mu.Unlock()
}

func (r *Runner) save(ctx context.Context, run runid.ID, st State) error {
	b, err := runfiles.MarshalIndent(st)
	if err != nil {
		return err
	}
	_, err = r.o.PutInternal(ctx, run, StatePath, append(b, '\n'))
	return err
}

// stat returns a file of the run, read as the run's caller (an access
// checked like every read).
func (r *Runner) stat(ctx context.Context, run runid.ID, path string) (tmpfs.File, error) {
	rr, err := r.o.ReadRun(ctx, run)
	if err != nil {
		return tmpfs.File{}, err
	}
	return rr.Stat(ctx, path)
}

// readAll reads a file of the run whole, as the run's caller.
func (r *Runner) readAll(ctx context.Context, run runid.ID, path string) ([]byte, error) {
	rr, err := r.o.ReadRun(ctx, run)
	if err != nil {
		return nil, err
	}
	b, _, err := rr.ReadAll(ctx, path)
	return b, err
}

func isNotFound(err error) bool {
	fe := fault.As(err)
	return fe != nil && fe.Kind == fault.NotFound
}

func (r *Runner) load(ctx context.Context, run runid.ID) (State, bool, error) {
	b, err := r.readAll(ctx, run, StatePath)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, false, fmt.Errorf("run %s: corrupt %s: %w", run, StatePath, err)
	}
	return st, true, nil
}

// Status reports a recipe run. A run recorded as queued or running that no
// goroutine of this process owns was interrupted (the server stopped): it
// is reported failed, and POST /run with its id resumes it.
func (r *Runner) Status(ctx context.Context, run runid.ID) (State, error) {
	if err := r.o.Visible(ctx, run); err != nil {
		return State{}, err
	}
	r.mu.Lock()
	a := r.active[run]
	r.mu.Unlock()
	if a != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		return cloneState(a.state), nil
	}
	st, ok, err := r.load(ctx, run)
	if err != nil {
		return State{}, err
	}
	if !ok {
		return State{}, fault.New(fault.NotFound, fmt.Sprintf("run %s has no recipe run", run), "POST /run starts one")
	}
	if st.Status == Queued || st.Status == Running {
		st.Status = Failed
		st.Error = "interrupted: the server stopped during the run; POST /run with this run_id resumes it"
	}
	return st, nil
}

// Active counts the recipe runs in flight in this process by status
// (queued, running).
func (r *Runner) Active() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, a := range r.active {
		out[a.state.Status]++
	}
	return out
}

// Subscribe returns a channel of the run's events, closed when the run
// ends (at once if it is not running), and a cancel func.
func (r *Runner) Subscribe(run runid.ID) (<-chan Event, func()) {
	ch := make(chan Event, 256)
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.active[run]
	if a == nil {
		close(ch)
		return ch, func() {}
	}
	a.subs[ch] = struct{}{}
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := a.subs[ch]; ok {
			delete(a.subs, ch)
			close(ch)
		}
	}
}

// Wait blocks until the run ends or ctx is done.
func (r *Runner) Wait(ctx context.Context, run runid.ID) error {
	r.mu.Lock()
	a := r.active[run]
	r.mu.Unlock()
	if a == nil {
		return nil
	}
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeNotebook writes run.ipynb from the cells this session executed.
func (r *Runner) writeNotebook(ctx context.Context, run runid.ID, plan *recipes.Plan, results []*notebook.Exec) error {
	b, err := plan.RunNotebook(results, map[string]any{"run_id": run.String()})
	if err != nil {
		return err
	}
	_, err = r.o.PutInternal(ctx, run, NotebookPath, b)
	return err
}

func cloneState(s State) State {
	s.Steps = append([]StepState(nil), s.Steps...)
	return s
}

func errText(err error) string {
	if fe := fault.As(err); fe != nil {
		return string(fe.Kind) + ": " + fe.Message
	}
	return err.Error()
}

// List returns the recipes, sorted by name.
func (r *Runner) List() []*recipes.Recipe {
	l := r.c.Catalog.List()
	sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
	return l
}
