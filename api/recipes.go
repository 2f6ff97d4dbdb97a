package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/recipes/runner"
)

func (s *Server) needRunner() error {
	if s.runner == nil {
		return fault.New(fault.NotConfigured, "recipes are not available on this server", "start triad serve with a sandbox (--sandbox docker, wasm or auto)")
	}
	return nil
}

// postRun is POST /run: start a recipe run, or resume one by run_id.
func (s *Server) postRun(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	var req runner.Request
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	st, err := s.runner.Start(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/runs/"+st.RunID)
	return writeJSON(w, http.StatusAccepted, runner.Started(st))
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

// runEvents streams a run's progress as Server-Sent Events: one "state"
// event with the run as it is, then "step" and "run" events until it ends.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	ch, cancel := s.runner.Subscribe(id)
	defer cancel()
	st, err := s.runner.Status(r.Context(), id)
	if err != nil {
		return err
	}
	sse, err := newEventStream(w)
	if err != nil {
		return err
	}
	send := sse.send
	send("state", st)
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				if final, err := s.runner.Status(r.Context(), id); err == nil {
					send("end", final)
				}
				return nil
			}
			send(e.Type, e)
		case <-keep.C:
			sse.comment("keep-alive")
		case <-r.Context().Done():
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
	out, err := s.orch.Runs(r.Context(), tenant, cursor, n)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
