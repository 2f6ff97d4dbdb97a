package api

import (
	"net/http"

	"github.com/triadhq/triad/wire"
)

func (s *Server) sandboxRestart(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	if err := s.orch.Restart(r.Context(), id); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.RestartResponse{OK: true, Kernel: wire.RestartKernel{Restarted: true}})
}
