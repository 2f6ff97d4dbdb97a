package api

import (
	"net/http"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/orchestrator"
)

func (s *Server) browserSearch(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	req, err := browser.DecodeRequest(r.Body)
	if err != nil {
		return err
	}
	out, err := s.orch.Search(r.Context(), id, req.Wire(), orchestrator.SearchOptions{})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
