package api

import (
	"io"
	"net/http"
	"strconv"

	"github.com/triadhq/triad/wire"
)

func (s *Server) celGet(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	// Streamed, verified as it streams: a journal is read whole only by
	// the client.
	rr, err := s.orch.ReadRun(r.Context(), id)
	if err != nil {
		return err
	}
	f, body, err := rr.OpenJournal(r.Context())
	if err != nil {
		return err
	}
	defer body.Close()
	w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
	if _, err := io.Copy(w, body); err != nil {
		// Headers are out: cut the connection so the client sees a
		// truncated body, never a complete-looking one.
		s.log.ErrorContext(r.Context(), "stream journal", "run", id, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
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
