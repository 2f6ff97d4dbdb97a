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
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes"
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
	return writeJSON(w, http.StatusAccepted, map[string]any{
		"run_id": st.RunID, "status": st.Status, "status_url": "/runs/" + st.RunID,
		"events_url": "/runs/" + st.RunID + "/events", "resumes": st.Resumes,
	})
}

// RunView is GET /runs/{id}: the journal's view of every call, plus the
// recipe run's steps when the run is a recipe run.
type RunView struct {
	orchestrator.RunStatus
	Recipe      string             `json:"recipe,omitempty"`
	Objective   string             `json:"objective,omitempty"`
	Error       string             `json:"error,omitempty"`
	Resumes     int                `json:"resumes,omitempty"`
	RecipeSteps []runner.StepState `json:"recipe_steps,omitempty"`
	Params      map[string]any     `json:"params,omitempty"`
	Created     *time.Time         `json:"created,omitempty"`
	Finished    *time.Time         `json:"finished,omitempty"`
}

func (s *Server) runGet(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var view RunView
	var rs *runner.State
	if s.runner != nil {
		st, err := s.runner.Status(r.Context(), id)
		if err == nil {
			rs = &st
		} else if fe := fault.As(err); fe == nil || fe.Kind != fault.NotFound {
			return err
		}
	}
	js, err := s.orch.Status(r.Context(), id)
	if err != nil && rs == nil {
		return err
	}
	view.RunStatus = js
	view.RunID = id.String()
	if rs != nil {
		view.Status = rs.Status
		view.Recipe, view.Objective, view.Error, view.Resumes = rs.Recipe, rs.Objective, rs.Error, rs.Resumes
		view.RecipeSteps, view.Params, view.Created, view.Finished = rs.Steps, rs.Params, &rs.Created, rs.Finished
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

// RecipeInfo describes a recipe in GET /recipes.
type RecipeInfo struct {
	Name        string           `json:"name"`
	Title       string           `json:"title"`
	Description string           `json:"description"`
	Backend     string           `json:"backend"`
	Origin      string           `json:"origin"`
	Params      []ParamInfo      `json:"params,omitempty"`
	Inputs      []InputInfo      `json:"inputs,omitempty"`
	Outputs     []recipes.Output `json:"outputs,omitempty"`
	Steps       []StepInfo       `json:"steps,omitempty"`
}

// ParamInfo describes a recipe param.
type ParamInfo struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Default     any    `json:"default,omitempty"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
}

// InputInfo describes a recipe input file.
type InputInfo struct {
	Name        string `json:"name"`
	Path        string `json:"path"`
	Default     string `json:"default,omitempty"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
}

// StepInfo describes a recipe block.
type StepInfo struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Title string `json:"title"`
	Line  int    `json:"line"`
}

func recipeInfo(rc *recipes.Recipe, full bool) RecipeInfo {
	ri := RecipeInfo{Name: rc.Name, Title: rc.Title, Description: rc.Description, Backend: string(rc.Backend), Origin: rc.Origin}
	if !full {
		return ri
	}
	for _, p := range rc.Params {
		ri.Params = append(ri.Params, ParamInfo{p.Name, string(p.Type), p.Default, p.Required, p.Description})
	}
	for _, in := range rc.Inputs {
		ri.Inputs = append(ri.Inputs, InputInfo{in.Name, in.Path, in.Default, in.Required, in.Description})
	}
	ri.Outputs = rc.Outputs
	for _, b := range rc.Blocks {
		ri.Steps = append(ri.Steps, StepInfo{b.ID, string(b.Kind), b.Title, b.Line})
	}
	return ri
}

func (s *Server) recipesList(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	out := []RecipeInfo{}
	for _, rc := range s.runner.List() {
		out = append(out, recipeInfo(rc, false))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"recipes": out})
}

func (s *Server) recipeGet(w http.ResponseWriter, r *http.Request) error {
	if err := s.needRunner(); err != nil {
		return err
	}
	rc, err := s.runner.Catalog().Get(mux.Vars(r)["name"])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, recipeInfo(rc, true))
}
