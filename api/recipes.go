package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

func (s *Server) needRunner() error {
	if s.runner == nil {
		return fault.New(fault.NotConfigured, "recipes are not available on this server", "start triad serve with a sandbox (--sandbox docker, wasm or auto)")
	}
	return nil
}

// postRun is POST /run: start a recipe run, or resume one by run_id. The
// body is the request as JSON, or multipart/form-data with the request in
// a part named request and the recipe's input files in parts named
// input:<name>: the files then arrive with the request, and the run's
// first steps write them once its setup is recorded (uploading them
// first, with tool calls, would fix the run's setup before the recipe
// could).
func (s *Server) postRun(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	var (
		req    runner.Request
		inputs map[string][]byte
	)
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		var err error
		if req, inputs, err = s.recipeForm(w, r); err != nil {
			return err
		}
	} else if err := s.decode(w, r, &req); err != nil {
		return err
	}
	st, err := s.runner.Start(r.Context(), req, inputs)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/runs/"+st.RunID)
	return writeJSON(w, http.StatusAccepted, runner.Started(st))
}

// inputPart prefixes the form name of a recipe input file's part.
const inputPart = "input:"

// recipeForm reads POST /run's multipart form: the request (JSON, strict)
// and the input files, all of them within the JSON body limit.
func (s *Server) recipeForm(w http.ResponseWriter, r *http.Request) (runner.Request, map[string][]byte, error) {
	var req runner.Request
	limit := s.orch.Limits().JSONBody
	r.Body = http.MaxBytesReader(w, r.Body, limit+64<<10)
	mr, err := r.MultipartReader()
	if err != nil {
		return req, nil, fault.Wrap(fault.BadInput, err, "the multipart body could not be read: "+err.Error(), "send multipart/form-data with a boundary")
	}
	inputs := map[string][]byte{}
	seen := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return req, nil, err
			}
			return req, nil, fault.Wrap(fault.BadInput, err, "the multipart body could not be read: "+err.Error(), "send multipart/form-data as a browser's FormData makes it")
		}
		name := part.FormName()
		b, err := io.ReadAll(part)
		if err != nil {
			return req, nil, err
		}
		switch {
		case name == "request":
			if seen {
				return req, nil, fault.New(fault.BadInput, "the form has two request parts", "send the request once")
			}
			seen = true
			// The part is checked as the JSON body would be.
			if err := s.decodeJSON(s.routeOf(r), r.Method, b, &req); err != nil {
				return req, nil, err
			}
		case strings.HasPrefix(name, inputPart) && len(name) > len(inputPart):
			in := strings.TrimPrefix(name, inputPart)
			if _, dup := inputs[in]; dup {
				return req, nil, fault.Badf("send each input once", "the form has input %q twice", in)
			}
			inputs[in] = b
		default:
			return req, nil, fault.Badf(`name the parts "request" and "input:<name>" (GET /recipes/{name} lists a recipe's inputs)`, "the form has a part named %q", name)
		}
	}
	if !seen {
		return req, nil, fault.New(fault.BadInput, "the form has no request part", `send the request as JSON in a part named "request"`)
	}
	return req, inputs, nil
}

func (s *Server) runGet(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	view, err := runner.View(r.Context(), s.orch, s.runner, id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, view)
}

// runEvents streams a run's progress as Server-Sent Events, for every
// run. A recipe run's stream opens with a "state" event (the recipe run as
// it is); every run's then has a "call" event for each journaled call so
// far and each one after (its id is the step number: a client that
// reconnects with Last-Event-ID gets only the calls it missed), and a
// "journal" event for each note and summary, and a "verdict" event (the
// call again, with its verdict) when a call that was UNGRADED is graded. A recipe run's "step" and
// "run" events report its progress, and its stream ends with "end" (the
// final state) when it ends; a manual run's stream lasts until the client
// leaves.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	ctx := r.Context()
	calls, cancelCalls, err := s.orch.Subscribe(ctx, id)
	if err != nil {
		return err
	}
	defer cancelCalls()
	var (
		recipe <-chan runner.Event // nil for a manual run: never ready
		state  *runner.State
	)
	if s.runner != nil {
		ch, cancel := s.runner.Subscribe(id)
		defer cancel()
		st, err := s.runner.Status(ctx, id)
		if fe := fault.As(err); err != nil && (fe == nil || fe.Kind != fault.NotFound) {
			return err
		}
		if err == nil {
			recipe, state = ch, &st
		}
	}
	rr, err := s.orch.ReadRun(ctx, id)
	if err != nil {
		return err
	}
	past, err := rr.Calls(ctx)
	if err != nil {
		return err
	}
	sse, err := newEventStream(w)
	if err != nil {
		return err
	}
	if state != nil {
		sse.send("state", state)
	}
	last, _ := strconv.Atoi(r.Header.Get("Last-Event-ID"))
	call := func(c *wire.CallEvent) {
		if c.Step > last {
			sse.sendID("call", strconv.Itoa(c.Step), c)
			last = c.Step
		}
	}
	for i := range past {
		call(&past[i])
	}
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case u, ok := <-calls:
			if !ok {
				return nil // fell behind: the client reconnects with Last-Event-ID
			}
			switch {
			case u.Call != nil:
				call(u.Call)
			case u.Verdict != nil:
				sse.send("verdict", u.Verdict)
			case u.Journal != nil:
				sse.send("journal", u.Journal)
			}
		case e, ok := <-recipe:
			if !ok {
				// The run's last calls and its summary were published
				// before it ended: send them before the end.
				for drained := false; !drained; {
					select {
					case u, ok := <-calls:
						if !ok {
							drained = true
						} else if u.Call != nil {
							call(u.Call)
						} else if u.Verdict != nil {
							sse.send("verdict", u.Verdict)
						} else if u.Journal != nil {
							sse.send("journal", u.Journal)
						}
					default:
						drained = true
					}
				}
				if final, err := s.runner.Status(ctx, id); err == nil {
					sse.send("end", final)
				}
				return nil
			}
			sse.send(e.Type, e)
		case <-keep.C:
			sse.comment("keep-alive")
		case <-ctx.Done():
			return nil
		case <-s.closing:
			return nil
		}
	}
}

func (s *Server) recipesList(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s.runner.Recipes())
}

func (s *Server) recipeGet(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	rc, err := s.runner.Catalog().Get(mux.Vars(r)["name"])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, rc.Info(true))
}

// runLabels is PATCH /runs/{id}: a run's name and tags.
func (s *Server) runLabels(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var in wire.RunLabels
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	out, err := s.orch.SetLabels(r.Context(), id, in)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// runDelete is DELETE /runs/{id}.
func (s *Server) runDelete(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	if err := s.orch.DeleteRun(r.Context(), id); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.OK{OK: true})
}

// runsList is GET /runs: the caller's runs from its tenant's run index.
func (s *Server) runsList(w http.ResponseWriter, r *http.Request) error {
	cursor, err := query(r, "cursor", false)
	if err != nil {
		return err
	}
	tenant, err := query(r, "tenant", false)
	if err != nil {
		return err
	}
	lim, err := query(r, "limit", false)
	if err != nil {
		return err
	}
	n := 0
	if lim != "" {
		if n, err = strconv.Atoi(lim); err != nil || n < 1 {
			return fault.Badf("send limit between 1 and 200, or omit it for 50", "limit %q is not a positive integer", lim)
		}
	}
	status, err := query(r, "status", false)
	if err != nil {
		return err
	}
	recipe, err := query(r, "recipe", false)
	if err != nil {
		return err
	}
	q, err := query(r, "q", false)
	if err != nil {
		return err
	}
	sort, err := query(r, "sort", false)
	if err != nil {
		return err
	}
	out, err := s.orch.Runs(r.Context(), orchestrator.RunsQuery{Tenant: tenant, Cursor: cursor, Limit: n, Status: status, Recipe: recipe, Query: q, Sort: sort})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// usageGet is GET /usage: what the caller's tenant's runs used (another
// tenant's, for an admin).
func (s *Server) usageGet(w http.ResponseWriter, r *http.Request) error {
	tenant, err := query(r, "tenant", false)
	if err != nil {
		return err
	}
	out, err := s.orch.TenantUsage(r.Context(), tenant)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
