package api

import (
	"mime"
	"net/http"
	"path"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/runid"
)

// runFiles is GET /runs/{id}/files: the run's files for a person, with
// the call that produced each.
func (s *Server) runFiles(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	rr, err := s.orch.ReadRun(r.Context(), id)
	if err != nil {
		return err
	}
	out, err := rr.Files(r.Context())
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusOK, out)
}

// runFile is GET /runs/{id}/files/{path}: a run file's bytes for a person
// to preview in the console or download. Unlike tmp.read it is not a
// tool call, so looking at a run does not add steps to its journal.
//
// The bytes are the run's, which a cell (or whoever it fetched them
// from) chose: every answer carries nosniff, and every type but PDF a
// Content-Security-Policy with sandbox, so an HTML or SVG file opened
// here runs no script and is never same-origin with the console. The
// console may frame it (frame-ancestors 'self') for previews. PDF is the
// exception because Chromium refuses to show a PDF in a sandboxed
// document; its viewer runs the file in its own process and origin. See
// docs/DECISIONS.md, "The web console".
func (s *Server) runFile(w http.ResponseWriter, r *http.Request) error {
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	p, err := pathVar(r)
	if err != nil {
		return err
	}
	dl, err := query(r, "download", false)
	if err != nil {
		return err
	}
	rr, err := s.orch.ReadRun(r.Context(), id)
	if err != nil {
		return err
	}
	f, rd, err := rr.Open(r.Context(), p)
	if err != nil {
		return err
	}
	defer rd.Close()
	h := w.Header()
	h.Set("X-Content-SHA256", f.SHA256.String())
	h.Set("Cache-Control", "private, no-cache")
	h.Set("Vary", "Authorization, Cookie")
	h.Set("X-Frame-Options", "SAMEORIGIN")
	if mime.TypeByExtension(path.Ext(f.Path)) == "application/pdf" {
		h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'self'")
	} else {
		h.Set("Content-Security-Policy", "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; frame-ancestors 'self'; sandbox")
	}
	if dl == "1" || dl == "true" {
		h.Set("Content-Disposition", attachment(path.Base(f.Path)))
	}
	return s.serveBlob(w, r, blobRead{run: id, path: f.Path, d: f.SHA256, modUnix: f.ModifiedAt.Unix()}, rd)
}

// attachment is a Content-Disposition that downloads as name.
func attachment(name string) string {
	if v := mime.FormatMediaType("attachment", map[string]string{"filename": name}); v != "" {
		return v
	}
	return "attachment"
}
