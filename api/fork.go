package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// runSnapshot is POST /runs/{id}/snapshots: the run's files kept, by
// reference, as a read-only run of the caller's (a step of the run's
// journal). The optional body names it.
func (s *Server) runSnapshot(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var in wire.SnapshotRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	sn, err := s.orch.Snapshot(r.Context(), id, in)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/runs/"+sn.ID)
	return writeJSON(w, http.StatusCreated, sn)
}

// runFork is POST /runs/{id}/fork: a new run of the caller's from the run
// or snapshot {id}, whose first step records the fork. The optional body
// names the new run's id.
func (s *Server) runFork(w http.ResponseWriter, r *http.Request) error {
	from, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var in wire.ForkRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	var into runid.ID
	if in.RunID != "" {
		if into, err = runid.Parse(in.RunID); err != nil {
			return err
		}
	}
	f, err := s.orch.Fork(r.Context(), from, into)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/runs/"+f.RunID)
	return writeJSON(w, http.StatusCreated, f)
}
