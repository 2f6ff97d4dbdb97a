package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// SharedFilesType is the media type of a prefix link's list of files: JSON,
// named apart from application/json so that a shared .json file and the
// list are never confused.
const SharedFilesType = "application/vnd.triad.shared-files+json"

func (s *Server) needShares() error {
	if s.shares == nil {
		return fault.New(fault.NotConfigured, "share links are not configured on this server", "start triad serve normally; share links are on by default")
	}
	return nil
}

// base is the server's address as callers reach it.
func (s *Server) base(r *http.Request) string {
	if s.c.PublicURL != "" {
		return strings.TrimRight(s.c.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// shareCreate is POST /runs/{id}/share.
func (s *Server) shareCreate(w http.ResponseWriter, r *http.Request) error {
	if err := s.needShares(); err != nil {
		return err
	}
	id, err := runid.Parse(mux.Vars(r)["id"])
	if err != nil {
		return err
	}
	var in wire.ShareRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	ctx := r.Context()
	owner, _, err := s.orch.StartedBy(ctx, id)
	if err != nil {
		return err
	}
	link := share.Link{Run: id, Tenant: owner.Tenant, KeyID: auth.From(ctx).KeyID}
	switch {
	case (in.Path == "") == (in.Prefix == ""):
		return fault.New(fault.BadInput, "send exactly one of path and prefix", `{"path": "artifacts/report.html"} shares one file; {"prefix": "artifacts/"} every file under it`)
	case in.Path != "":
		p, err := safepath.Clean(in.Path)
		if err != nil {
			return err
		}
		if err := s.orch.Settle(ctx, id); err != nil {
			return err
		}
		if _, err := s.orch.Store().Stat(ctx, id, p); errors.Is(err, tmpfs.ErrNotFound) {
			return fault.New(fault.NotFound, fmt.Sprintf("no file %q in run %s", p, id), "tmp.list shows the run's files; share one that exists, or share a prefix")
		} else if err != nil {
			return err
		}
		link.Path = p
	default:
		p, err := safepath.CleanPrefix(in.Prefix)
		if err != nil {
			return err
		}
		link.Prefix = p
	}
	ttl := s.c.ShareTTL
	if in.TTL != "" {
		// The bounds are the ones the document states (ShareRequest's
		// duration tag: wire.MinShareTTL and the server's maximum).
		if ttl, err = time.ParseDuration(in.TTL); err != nil || ttl <= 0 {
			return fault.Badf(`send ttl as a positive duration such as "24h" or "90m", or omit it`, "ttl %q is not a positive duration", in.TTL)
		}
		if ttl < wire.MinShareTTL {
			return fault.Badf(fmt.Sprintf("ask for at least %s: a shorter link is dead before anyone can follow it", wire.MinShareTTL),
				"ttl %s is under the minimum of %s", ttl, wire.MinShareTTL)
		}
		if ttl > s.c.MaxShareTTL {
			return fault.Badf(fmt.Sprintf("ask for at most %s", s.c.MaxShareTTL), "ttl %s is over this server's maximum of %s", ttl, s.c.MaxShareTTL)
		}
	}
	link.Expires = s.shares.Now().Add(ttl)
	link, tok, err := s.shares.Create(ctx, link)
	if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the share link could not be stored", "retry; GET /healthz shows the store's state")
	}
	return writeJSON(w, http.StatusCreated, wire.Share{ID: link.ID, RunID: id.String(), Path: link.Path, Prefix: link.Prefix,
		URL: s.base(r) + "/share/" + tok, Created: link.Created, Expires: link.Expires})
}

// shareRevoke is DELETE /shares/{id}. Another tenant's link is not found.
func (s *Server) shareRevoke(w http.ResponseWriter, r *http.Request) error {
	if err := s.needShares(); err != nil {
		return err
	}
	id := mux.Vars(r)["id"]
	notFound := fault.New(fault.NotFound, fmt.Sprintf("no share link %q", id), "the id is in POST /runs/{id}/share's answer")
	l, err := s.shares.Get(r.Context(), id)
	if errors.Is(err, share.ErrNotFound) {
		return notFound
	}
	if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the share link's record could not be read", "retry; GET /healthz shows the store's state")
	}
	if !auth.From(r.Context()).CanSee(l.Tenant) {
		return notFound
	}
	if err := s.shares.Revoke(r.Context(), id); errors.Is(err, share.ErrNotFound) {
		return notFound
	} else if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the share link could not be revoked", "retry; GET /healthz shows the store's state")
	}
	return writeJSON(w, http.StatusOK, wire.OK{OK: true})
}

// shareGone is the one answer for every link that does not work: never
// made, tampered with, expired, revoked, or asked for a file it does not
// share.
var shareGone = fault.New(fault.NotFound, "no such share link, or it has expired or was revoked, or it does not share this file",
	"ask whoever shared it for a new link")

// shareGet serves a share link, without a key: the shared file, or for a
// prefix link the list of files (at /share/{token}) and each file (at
// /share/{token}/{path}).
func (s *Server) shareGet(w http.ResponseWriter, r *http.Request) error {
	if err := s.needShares(); err != nil {
		return err
	}
	ctx := r.Context()
	tok := mux.Vars(r)["token"]
	l, err := s.shares.Resolve(ctx, tok)
	if errors.Is(err, share.ErrNotFound) {
		return shareGone
	}
	if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the share link's record could not be read", "retry in a few seconds")
	}
	p := l.Path
	if raw, ok := mux.Vars(r)["path"]; ok {
		up, err := url.PathUnescape(raw)
		if err != nil {
			return shareGone
		}
		if p, err = safepath.Clean(up); err != nil || !l.Allows(p) {
			return shareGone
		}
	}
	// A shared journal shows every call that has answered, with its verdict.
	if err := s.orch.Settle(ctx, l.Run); err != nil {
		return err
	}
	if p == "" { // a prefix link itself: what it shares
		files, err := s.orch.Store().List(ctx, l.Run, l.Prefix)
		if err != nil {
			return fault.Wrap(fault.StoreUnavailable, err, "the run's files could not be listed", "retry in a few seconds")
		}
		out := wire.SharedFiles{Prefix: l.Prefix, Expires: l.Expires, Files: []wire.SharedFile{}}
		for _, f := range files {
			out.Files = append(out.Files, wire.SharedFile{FileRef: wire.Ref(f), URL: s.base(r) + "/share/" + tok + "/" + escapePath(f.Path)})
		}
		w.Header().Set("Cache-Control", "no-store")
		return writeJSONAs(w, http.StatusOK, SharedFilesType, out)
	}
	f, rd, err := s.orch.Store().Open(ctx, l.Run, p)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return shareGone
	}
	if errors.Is(err, tmpfs.ErrQuarantined) {
		return blobRead{run: l.Run, path: p}.fail(err)
	}
	if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the shared file could not be read", "retry in a few seconds")
	}
	defer rd.Close()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-SHA256", f.SHA256.String())
	return s.serveBlob(w, r, blobRead{run: l.Run, path: f.Path, d: f.SHA256, modUnix: f.ModifiedAt.Unix()}, rd)
}

// escapePath escapes each segment of a run path for a URL.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}
