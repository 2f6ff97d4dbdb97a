package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
	fl, ok := w.(http.Flusher)
	if !ok {
		return errors.New("streaming unsupported by the connection")
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		fl.Flush()
	}
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
			fmt.Fprint(w, ": keep-alive\n\n")
			fl.Flush()
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
