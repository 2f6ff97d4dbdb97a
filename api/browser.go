package api

import (
	"net/http"

	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

func (s *Server) browserSearch(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	var in wire.SearchRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	out, err := s.orch.Search(r.Context(), id, in, orchestrator.SearchOptions{})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
