package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/wire"
)

// runReplay is POST /runs/{id}/replay: a new run that re-executes the run's
// calls from its trace and compares every file it produced. The optional
// body {"seed", "as_of"} replaces the original's. It answers when the
// replay has finished, with its report (artifacts/reproducibility.json of
// the new run, which Location names).
func (s *Server) runReplay(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var in wire.ReplayRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	rep, err := replay.Run(r.Context(), s.orch, id, replay.Options{Seed: in.Seed, AsOf: in.AsOf})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/runs/"+rep.RunID)
	return writeJSON(w, http.StatusCreated, rep)
}
