package api

import (
	"net/http"
)

func (s *Server) sandboxRestart(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	if err := s.orch.Restart(r.Context(), id); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]any{"ok": true, "kernel": map[string]any{"restarted": true}})
}
