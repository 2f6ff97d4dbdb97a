package api

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/crashpoint"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// route is one endpoint: how it is served and how GET /openapi.json
// describes it. The router and the document are both built from the same
// routes, with the same request and answer types the handlers use, so
// neither can drift from the other.
type route struct {
	Methods []string
	// Path is the gorilla/mux template, e.g. /tmp/files/{path:.+}.
	Path string
	// Scope is the least scope a key needs; Public routes need no key.
	Scope   auth.Scope
	Summary string
	// RunHeader marks calls that work in the run named by X-Run-Id.
	RunHeader bool
	Query     []param
	// Body is the JSON request body's type (a zero value); BodyType, a
	// raw body's media type instead.
	Body     any
	BodyType string
	// OK is the success status (200 when zero); Answer its JSON type, or
	// AnswerType a raw answer's media type.
	OK         int
	Answer     any
	AnswerType string
	// Alt is another JSON answer the route may give, under its own media
	// type (a prefix share link's list of files).
	Alt     any
	AltType string
	// Mounted routes are another surface's (MCP), served by raw.
	Mounted bool

	h   handlerFunc
	raw http.Handler
}

// Public marks a route that needs no key.
const Public auth.Scope = ""

// param is a documented query parameter.
type param struct {
	Name, Description string
	Required          bool
	Integer           bool
}

// add registers rt on the router.
func (s *Server) add(rt *route) {
	h := rt.raw
	if h == nil {
		h = s.handle(rt.h)
	}
	if rt.RunHeader && crashpoint.Armed() {
		inner := h // a test's crash point: see internal/crashpoint
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(w, r)
			crashpoint.Answered(w)
		})
	}
	mr := s.router.Handle(rt.Path, h).Methods(rt.Methods...)
	s.routes = append(s.routes, rt)
	s.byRoute[mr] = rt
	s.doc.mu.Lock()
	s.doc.json = nil
	s.doc.mu.Unlock()
}

// routeOf returns the route a request matched, if any.
func (s *Server) routeOf(r *http.Request) *route {
	if mr := mux.CurrentRoute(r); mr != nil {
		return s.byRoute[mr]
	}
	return nil
}

var (
	get   = []string{http.MethodGet}
	getHd = []string{http.MethodGet, http.MethodHead}
	post  = []string{http.MethodPost}
	put   = []string{http.MethodPut}
	del   = []string{http.MethodDelete}
)

// table lists every endpoint of the API.
func (s *Server) table() []*route {
	rs := []*route{
		{Methods: getHd, Path: "/healthz", Scope: Public, Summary: "Health: the file store answers", Answer: wire.Health{}, h: s.healthz},
		{Methods: get, Path: "/version", Scope: Public, Summary: "The server's version", Answer: wire.Version{}, h: s.version},
		{Methods: get, Path: "/openapi.json", Scope: Public, Summary: "This document", AnswerType: "application/json", h: s.openapi},

		{Methods: post, Path: "/runs", Scope: auth.Runs, Summary: "Mint a fresh run id (the run becomes the caller's)", Body: wire.NewRunRequest{}, OK: http.StatusCreated, Answer: wire.NewRunResponse{}, h: s.newRun},
		{Methods: get, Path: "/runs", Scope: auth.Read, Summary: "The caller's runs, newest first, a page at a time", Query: []param{
			{Name: "cursor", Description: "next_cursor from the previous page"},
			{Name: "limit", Description: "runs per page, 1-200 (default 50)", Integer: true},
			{Name: "tenant", Description: "another tenant's runs (admin keys only)"},
			{Name: "status", Description: "only runs with this status: open, queued, running, succeeded, failed"},
			{Name: "recipe", Description: "only runs of this recipe; manual for the runs of no recipe"},
		}, Answer: wire.RunList{}, h: s.runsList},
		{Methods: get, Path: "/runs/{id}", Scope: auth.Read, Summary: "A run: its steps, verdicts, artifacts, recipe state and who started it", Answer: wire.RunView{}, h: s.runGet},
		{Methods: get, Path: "/runs/{id}/events", Scope: auth.Read, Summary: "A run's progress as Server-Sent Events: a call event (wire.CallEvent, id = step) for every journaled call so far and each one after, " +
			"a journal event for each note and summary; a recipe run's stream also has state (first), step and run events, and ends with end", AnswerType: "text/event-stream", h: s.runEvents},
		{Methods: get, Path: "/runs/{id}/files", Scope: auth.Read, Summary: "Every file of a run with the call that produced it, for people (not a tool call: not journaled)", Answer: wire.RunFiles{}, h: s.runFiles},
		{Methods: getHd, Path: "/runs/{id}/files/{path:.+}", Scope: auth.Read, Summary: "A run file's bytes for a person to preview or download (not a tool call: not journaled); " +
			"served with nosniff and, every type but PDF, Content-Security-Policy: sandbox", Query: []param{
			{Name: "download", Description: "1 to download it (Content-Disposition: attachment) rather than show it"},
		}, AnswerType: "application/octet-stream", h: s.runFile},
		{Methods: post, Path: "/runs/{id}/replay", Scope: auth.Runs, Summary: "Replay a run from its trace as a new run, and report per file whether it came out the same", Body: wire.ReplayRequest{}, OK: http.StatusCreated, Answer: wire.ReplayReport{}, h: s.runReplay},
		{Methods: post, Path: "/runs/{id}/share", Scope: auth.Runs, Summary: "A link that downloads a run's file (or files under a prefix) without a key", Body: wire.ShareRequest{}, OK: http.StatusCreated, Answer: wire.Share{}, h: s.shareCreate},
		{Methods: del, Path: "/shares/{id}", Scope: auth.Runs, Summary: "Revoke a share link", Answer: wire.OK{}, h: s.shareRevoke},
		{Methods: getHd, Path: "/share/{token}", Scope: Public, Summary: "A share link: the shared file, or a prefix link's list of files", AnswerType: "application/octet-stream",
			Alt: wire.SharedFiles{}, AltType: SharedFilesType, h: s.shareGet},
		{Methods: getHd, Path: "/share/{token}/{path:.+}", Scope: Public, Summary: "One file of a prefix share link", AnswerType: "application/octet-stream", h: s.shareGet},

		{Methods: post, Path: "/run", Scope: auth.Runs, Summary: "Start a recipe run, or resume one by run_id", Body: wire.RecipeRunRequest{}, OK: http.StatusAccepted, Answer: wire.RecipeRunStarted{}, h: s.postRun},
		{Methods: get, Path: "/recipes", Scope: auth.Read, Summary: "The recipes", Answer: wire.RecipeList{}, h: s.recipesList},
		{Methods: get, Path: "/recipes/{name}", Scope: auth.Read, Summary: "One recipe in full", Answer: wire.RecipeInfo{}, h: s.recipeGet},

		{Methods: get, Path: "/cel", Scope: auth.Read, RunHeader: true, Summary: "The run's journal, CEL.md", AnswerType: "text/markdown", h: s.celGet},
		{Methods: post, Path: "/cel/note", Scope: auth.Runs, RunHeader: true, Summary: "Add an operator note to the journal", Body: wire.NoteRequest{}, Answer: wire.OK{}, h: s.celNote},
		{Methods: post, Path: "/cel/finalize", Scope: auth.Runs, RunHeader: true, Summary: "Append the journal's summary", Answer: wire.OK{}, h: s.celFinalize},

		{Methods: post, Path: "/tmp/write", Scope: auth.Runs, RunHeader: true, Summary: "tmp.write: write a run file", Body: wire.WriteRequest{}, Answer: wire.FileRef{}, h: jsonTool(s, func(ctx context.Context, id runid.ID, in wire.WriteRequest) (wire.FileRef, error) {
			return s.orch.Write(ctx, id, in)
		})},
		{Methods: get, Path: "/tmp/read", Scope: auth.Read, RunHeader: true, Summary: "tmp.read: read a run file inline",
			Query: []param{{Name: "path", Description: "the run path", Required: true}}, Answer: wire.ReadResponse{}, h: queryTool(s, "path", true, func(ctx context.Context, id runid.ID, p string) (wire.ReadResponse, error) {
				return s.orch.Read(ctx, id, p)
			})},
		{Methods: get, Path: "/tmp/list", Scope: auth.Read, RunHeader: true, Summary: "tmp.list: the run's files under a prefix",
			Query: []param{{Name: "prefix", Description: "a directory prefix such as artifacts/"}}, Answer: wire.ListResponse{}, h: queryTool(s, "prefix", false, func(ctx context.Context, id runid.ID, p string) (wire.ListResponse, error) {
				return s.orch.List(ctx, id, p)
			})},
		{Methods: post, Path: "/tmp/delete", Scope: auth.Runs, RunHeader: true, Summary: "tmp.delete: delete a run file", Body: wire.PathRequest{}, Answer: wire.OK{},
			h: jsonTool(s, func(ctx context.Context, id runid.ID, in wire.PathRequest) (wire.OK, error) {
				return s.orch.Delete(ctx, id, in.Path)
			})},
		{Methods: put, Path: "/tmp/files/{path:.+}", Scope: auth.Runs, RunHeader: true, Summary: "tmp.write, streamed: the raw body becomes the run file", BodyType: "application/octet-stream", Answer: wire.FileRef{}, h: s.filePut},
		{Methods: getHd, Path: "/tmp/files/{path:.+}", Scope: auth.Read, RunHeader: true, Summary: "tmp.read, streamed: the run file's raw bytes (Range supported)", AnswerType: "application/octet-stream", h: s.fileGet},
		{Methods: getHd, Path: "/blobs/{sha256}", Scope: auth.Read, RunHeader: true, Summary: "A blob by sha256, for a caller naming a run that holds it (X-Run-Id, or ?run= in a link)", Query: []param{
			{Name: "run", Description: "the run that holds the blob, for a link that cannot send X-Run-Id"},
			{Name: "name", Description: "a file name: the blob downloads as an attachment with this name"},
		}, AnswerType: "application/octet-stream", h: s.blobGet},

		{Methods: post, Path: "/browser/search", Scope: auth.Runs, RunHeader: true, Summary: "browser.search: search the web", Body: wire.SearchRequest{}, Answer: wire.SearchResponse{}, h: s.browserSearch},
		{Methods: post, Path: "/sandbox/exec", Scope: auth.Runs, RunHeader: true, Summary: "sandbox.exec: run a Python cell in the run's kernel; with Accept: text/event-stream, its output streams as events and the last (done) is the answer",
			Body: wire.ExecRequest{}, Answer: wire.ExecResponse{}, Alt: wire.ExecEvent{}, AltType: "text/event-stream", h: s.sandboxExec},
		{Methods: post, Path: "/sandbox/restart", Scope: auth.Runs, RunHeader: true, Summary: "Restart the run's kernel (its files stay)", Answer: wire.RestartResponse{}, h: s.sandboxRestart},

		{Methods: get, Path: "/keys", Scope: auth.Admin, Summary: "Every API key (never its secret), with its last use", Answer: wire.KeyList{}, h: s.keysList},
		{Methods: post, Path: "/keys", Scope: auth.Admin, Summary: "Create an API key; the answer is the only time it is shown", Body: wire.NewKeyRequest{}, OK: http.StatusCreated, Answer: wire.NewKey{}, h: s.keysCreate},
		{Methods: del, Path: "/keys/{id}", Scope: auth.Admin, Summary: "Revoke an API key", Answer: wire.Key{}, h: s.keysRevoke},
	}
	if s.c.MetricsHandler != nil {
		scope := Public
		if s.c.MetricsNeedKey {
			scope = auth.Admin
		}
		rs = append(rs, &route{Methods: get, Path: "/metrics", Scope: scope, Summary: "Prometheus metrics", AnswerType: "text/plain", raw: s.c.MetricsHandler})
	}
	return rs
}
