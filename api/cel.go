package api

import (
	"net/http"

	"github.com/triadhq/triad/wire"
)

func (s *Server) celGet(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	b, err := s.orch.Journal(r.Context(), id)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
	_, err = w.Write(b)
	return err
}

func (s *Server) celNote(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	var in wire.NoteRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	if err := s.orch.Note(r.Context(), id, in.Text, in.Author); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.OK{OK: true})
}

func (s *Server) celFinalize(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	if err := s.orch.Finalize(r.Context(), id, ""); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.OK{OK: true})
}
