package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/wire"
)

func (s *Server) needKeys() error {
	if s.keys == nil {
		return fault.New(fault.NotConfigured, "authentication is off on this server (--auth none), so it keeps no keys",
			"start triad serve without --auth none to use API keys")
	}
	return nil
}

// keysList is GET /keys (admin).
func (s *Server) keysList(w http.ResponseWriter, r *http.Request) error {
	if err := s.needKeys(); err != nil {
		return err
	}
	ks, err := s.keys.List(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.KeyList{Keys: ks})
}

// keysCreate is POST /keys (admin).
func (s *Server) keysCreate(w http.ResponseWriter, r *http.Request) error {
	if err := s.needKeys(); err != nil {
		return err
	}
	var in wire.NewKeyRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	var scopes []auth.Scope
	for _, sc := range in.Scopes {
		scopes = append(scopes, auth.Scope(sc))
	}
	tok, k, err := s.keys.Create(r.Context(), in.Name, in.Tenant, scopes)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusCreated, wire.NewKey{Token: tok, Key: k})
}

// keysRevoke is DELETE /keys/{id} (admin).
func (s *Server) keysRevoke(w http.ResponseWriter, r *http.Request) error {
	if err := s.needKeys(); err != nil {
		return err
	}
	k, err := s.keys.Revoke(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}
