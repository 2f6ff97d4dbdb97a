package api

import (
	"net/http"

	"github.com/triadhq/triad/internal/orchestrator"
)

func (s *Server) sandboxExec(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	var in orchestrator.ExecInput
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	out, err := s.orch.Exec(r.Context(), id, in)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

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
