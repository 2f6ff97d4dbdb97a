package api

import (
	"context"
	"net/http"
	"reflect"
	"slices"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/crashpoint"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
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
	// PathParams describe the path's parameters (a plain string when not
	// listed); Query the query's.
	PathParams []param
	Query      []param
	// Body is the JSON request body's type (a zero value); BodyType, a
	// raw body's media type instead. OptionalBody makes the JSON body
	// optional: an empty one is no body.
	Body         any
	BodyType     string
	OptionalBody bool
	// Form marks a route that also takes Body as multipart/form-data: Body
	// as JSON in a part named request, and files in parts named
	// input:<name>.
	Form bool
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
	// Links name the calls a client can chain from the answer, by name.
	Links map[string]link

	h   handlerFunc
	raw http.Handler
}

// Public marks a route that needs no key.
const Public auth.Scope = ""

// param is a documented parameter: its schema and description are in
// Tag, as for a wire field (wire.FieldOf), and requests are validated
// against it.
type param struct {
	Name     string
	Required bool
	Integer  bool
	// Opaque marks a value only the server makes (a page cursor): the
	// document says so (x-opaque), and generators take it from answers.
	Opaque bool
	Tag    reflect.StructTag
}

// fieldTag is the tags of v's JSON field name: a parameter that carries
// a wire field takes its contract from there.
func fieldTag(v any, name string) reflect.StructTag {
	for _, f := range wire.Fields(reflect.TypeOf(v)) {
		if f.Name == name {
			return f.Tag
		}
	}
	panic("api: " + reflect.TypeOf(v).Name() + " has no field " + name)
}

// link is an OpenAPI link: the operation a client can call next with
// values from this answer (or this request).
type link struct {
	Op          string
	Params      map[string]any
	Body        any
	Description string
}

// runLink passes the answer's run_id on as the next call's X-Run-Id.
func runLink(op, what string) link {
	return link{Op: op, Params: map[string]any{"header." + RunHeader: "$response.body#/run_id"}, Description: what}
}

// sameRun passes this request's X-Run-Id on, and the answer's path as
// the next call's path (in loc: query, path or body).
func sameRun(op, loc, what string) link {
	l := link{Op: op, Params: map[string]any{"header." + RunHeader: "$request.header." + RunHeader}, Description: what}
	if loc == "body" {
		l.Body = map[string]any{"path": "$response.body#/path"}
	} else {
		l.Params[loc+".path"] = "$response.body#/path"
	}
	return l
}

// add registers rt on the router.
func (s *Server) add(rt *route) {
	h := rt.raw
	if h == nil {
		inner := rt.h
		h = s.handle(func(w http.ResponseWriter, r *http.Request) error {
			if err := s.checkParams(r, rt); err != nil {
				return err
			}
			return inner(w, r)
		})
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
	s.doc.doc, s.doc.json = nil, nil
	s.doc.mu.Unlock()
}

// allowed lists the methods the request's path is served with.
func (s *Server) allowed(r *http.Request) []string {
	var out []string
	for mr, rt := range s.byRoute {
		var m mux.RouteMatch
		probe := r.Clone(r.Context())
		for _, method := range rt.Methods {
			probe.Method = method
			if mr.Match(probe, &m) && !slices.Contains(out, method) {
				out = append(out, method)
			}
		}
	}
	slices.Sort(out)
	return out
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
	patch = []string{http.MethodPatch}
)

// Parameters shared by several routes.
var (
	runIDParam = param{Name: "id", Tag: `format:"run-id" doc:"The run."`}
	pathParam  = param{Name: "path", Tag: `format:"run-path" doc:"The run path (slashes included: the rest of the URL path, each segment percent-encoded)."`}
	// sharedPathParam is not checked for shape: every link that does not
	// work, for any path, gets the one not_found (shareGone).
	sharedPathParam = param{Name: "path", Tag: `doc:"A file's run path under the link's prefix (slashes included); any other path is not found."`}
)

// table lists every endpoint of the API.
func (s *Server) table() []*route {
	rs := []*route{
		{Methods: getHd, Path: "/healthz", Scope: Public, Summary: "Health: the file store answers", Answer: wire.Health{}, h: s.healthz},
		{Methods: get, Path: "/version", Scope: Public, Summary: "The server's version", Answer: wire.Version{}, h: s.version},
		{Methods: get, Path: "/openapi.json", Scope: Public, Summary: "This document", AnswerType: "application/json", h: s.openapi},

		{Methods: post, Path: "/runs", Scope: auth.Runs, Summary: "Mint a fresh run id (the run becomes the caller's)", Body: wire.NewRunRequest{}, OptionalBody: true, OK: http.StatusCreated, Answer: wire.NewRunResponse{}, h: s.newRun,
			Links: map[string]link{
				"exec":    runLink("post_sandbox_exec", "Run a cell in the new run"),
				"write":   runLink("post_tmp_write", "Write a file into the new run"),
				"list":    runLink("get_tmp_list", "List the new run's files"),
				"search":  runLink("post_browser_search", "Search the web in the new run"),
				"note":    runLink("post_cel_note", "Add a note to the new run's journal"),
				"journal": runLink("get_cel", "Read the new run's journal"),
				"run":     {Op: "get_runs_id", Params: map[string]any{"path.id": "$response.body#/run_id"}, Description: "The new run's status"},
			}},
		{Methods: get, Path: "/runs", Scope: auth.Read, Summary: "The caller's runs, newest first, a page at a time", Query: []param{
			{Name: "cursor", Opaque: true, Tag: `pattern:"^(?:@[0-9]+|(?:[A-Za-z0-9_-]|\\.[A-Za-z0-9_-]|\\.\\.[A-Za-z0-9._-])[A-Za-z0-9._-]*)$" maxLength:"200" doc:"next_cursor from the previous page, unchanged (with the same sort): an opaque value only the server makes."`},
			{Name: "limit", Integer: true, Tag: `minimum:"1" maximum:"200" doc:"Runs per page, 1-200 (default 50)."`},
			{Name: "tenant", Tag: `pattern:"^[a-z0-9][a-z0-9-]{0,62}$" doc:"Another tenant's runs (admin keys only)."`},
			{Name: "status", Tag: `enum:"open|queued|running|succeeded|failed" doc:"Only runs with this status."`},
			{Name: "recipe", Tag: `minLength:"1" maxLength:"200" doc:"Only runs of this recipe; manual for the runs of no recipe."`},
			{Name: "q", Tag: `maxLength:"500" doc:"Only runs that match every word in their id, name, objective, recipe or tags (tag:x needs the tag x), ignoring case."`},
			{Name: "sort", Tag: `enum:"created|oldest|updated|name" doc:"created (newest first, the default), oldest, updated (latest activity first) or name."`},
		}, Answer: wire.RunList{}, h: s.runsList},
		{Methods: get, Path: "/usage", Scope: auth.Read, Summary: "What the caller's tenant's runs used (CPU, memory over time, egress), summed, runs since deleted included, and the bytes they store now; each run's own is its usage in GET /runs/{id}", Query: []param{
			{Name: "tenant", Tag: `pattern:"^[a-z0-9][a-z0-9-]{0,62}$" doc:"Another tenant's usage (admin keys only)."`},
		}, Answer: wire.TenantUsage{}, h: s.usageGet},
		{Methods: patch, Path: "/runs/{id}", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Name or tag a run (absent fields are left as they are); the answer is the run as GET /runs lists it", Body: wire.RunLabels{}, Answer: wire.RunSummary{}, h: s.runLabels},
		{Methods: del, Path: "/runs/{id}", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Delete a run: its kernel is stopped, its files, journal, share links and records are removed, and from then on it is not found anywhere (its id is never a run again); " +
			"its blobs are removed by the next collection once no other run holds them", Answer: wire.OK{}, h: s.runDelete},
		{Methods: get, Path: "/runs/{id}", Scope: auth.Read, PathParams: []param{runIDParam}, Summary: "A run: its steps, verdicts, artifacts, recipe state and who started it", Answer: wire.RunView{}, h: s.runGet},
		{Methods: get, Path: "/runs/{id}/events", Scope: auth.Read, PathParams: []param{runIDParam}, Summary: "A run's progress as Server-Sent Events: a call event (wire.CallEvent, id = step) for every journaled call so far and each one after, " +
			"a verdict event (the call again) when an UNGRADED call gets its late verdict, a journal event for each note and summary; a recipe run's stream also has state (first), step and run events, and ends with end", AnswerType: "text/event-stream", h: s.runEvents},
		{Methods: get, Path: "/runs/{id}/files", Scope: auth.Read, PathParams: []param{runIDParam}, Summary: "Every file of a run with the call that produced it, for people (not a tool call: not journaled)", Answer: wire.RunFiles{}, h: s.runFiles},
		{Methods: getHd, Path: "/runs/{id}/files/{path:.+}", Scope: auth.Read, PathParams: []param{runIDParam, pathParam}, Summary: "A run file's bytes for a person to preview or download (not a tool call: not journaled); " +
			"served with nosniff and, every type but PDF, Content-Security-Policy: sandbox", Query: []param{
			{Name: "download", Tag: `enum:"0|1|false|true" doc:"1 (or true) to download it (Content-Disposition: attachment) rather than show it."`},
		}, AnswerType: "application/octet-stream", h: s.runFile},
		{Methods: post, Path: "/runs/{id}/replay", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Replay a run from its trace as a new run, and report per file whether it came out the same", Body: wire.ReplayRequest{}, OptionalBody: true, OK: http.StatusCreated, Answer: wire.ReplayReport{}, h: s.runReplay},
		{Methods: post, Path: "/runs/{id}/snapshots", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Snapshot a run's files, by reference (no bytes copied), as a read-only run of the caller's; kernel memory is not kept. A step of the run's journal", Body: wire.SnapshotRequest{}, OptionalBody: true, OK: http.StatusCreated, Answer: wire.Snapshot{}, h: s.runSnapshot,
			Links: map[string]link{"fork": {Op: "post_runs_id_fork", Params: map[string]any{"path.id": "$response.body#/id"}, Description: "Make a run from the snapshot"}}},
		{Methods: post, Path: "/runs/{id}/fork", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "A new run of the caller's from a run or a snapshot: its files by reference (no bytes copied), its setup; kernel memory is not kept. The new run's first step says so", Body: wire.ForkRequest{}, OptionalBody: true, OK: http.StatusCreated, Answer: wire.Fork{}, h: s.runFork,
			Links: map[string]link{
				"journal": runLink("get_cel", "The new run's journal"),
				"exec":    runLink("post_sandbox_exec", "Run a cell in the new run"),
			}},
		{Methods: post, Path: "/runs/{id}/share", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "A link that downloads a run's file (or files under a prefix) without a key", Body: wire.ShareRequest{}, OK: http.StatusCreated, Answer: wire.Share{}, h: s.shareCreate,
			Links: map[string]link{"revoke": {Op: "delete_shares_id", Params: map[string]any{"path.id": "$response.body#/id"}, Description: "Revoke the link"}}},
		{Methods: get, Path: "/runs/{id}/shares", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "The run's live share links, newest first, each with its URL", Answer: wire.ShareList{}, h: s.shareList},
		{Methods: del, Path: "/shares/{id}", Scope: auth.Runs, Summary: "Revoke a share link", Answer: wire.OK{}, h: s.shareRevoke},
		{Methods: getHd, Path: "/share/{token}", Scope: Public, Summary: "A share link: the shared file, or a prefix link's list of files", AnswerType: "application/octet-stream",
			Alt: wire.SharedFiles{}, AltType: SharedFilesType, h: s.shareGet},
		{Methods: getHd, Path: "/share/{token}/{path:.+}", Scope: Public, PathParams: []param{sharedPathParam}, Summary: "One file of a prefix share link", AnswerType: "application/octet-stream", h: s.shareGet},

		{Methods: post, Path: "/run", Scope: auth.Runs, Summary: "Start a recipe run, or resume one by run_id; as multipart/form-data, with the recipe's input files (parts input:<name>) beside the request (part request)", Body: wire.RecipeRunRequest{}, Form: true, OK: http.StatusAccepted, Answer: wire.RecipeRunStarted{}, h: s.postRun,
			Links: map[string]link{
				"status":  {Op: "get_runs_id", Params: map[string]any{"path.id": "$response.body#/run_id"}, Description: "The recipe run's status"},
				"journal": runLink("get_cel", "The recipe run's journal"),
				"files":   runLink("get_tmp_list", "The recipe run's files"),
			}},
		{Methods: get, Path: "/recipes", Scope: auth.Read, Summary: "The recipes", Answer: wire.RecipeList{}, h: s.recipesList},
		{Methods: get, Path: "/templates", Scope: auth.Read, Summary: "The sandbox templates a run may start from (POST /runs template): what each adds to the sandbox image, and its egress policy", Answer: wire.TemplateList{}, h: s.templatesList},
		{Methods: get, Path: "/recipes/{name}", Scope: auth.Read, Summary: "One recipe in full", Answer: wire.RecipeInfo{}, h: s.recipeGet},

		{Methods: get, Path: "/cel", Scope: auth.Read, RunHeader: true, Summary: "The run's journal, CEL.md", AnswerType: "text/markdown", h: s.celGet},
		{Methods: post, Path: "/cel/note", Scope: auth.Runs, RunHeader: true, Summary: "Add an operator note to the journal", Body: wire.NoteRequest{}, Answer: wire.OK{}, h: s.celNote},
		{Methods: post, Path: "/cel/finalize", Scope: auth.Runs, RunHeader: true, Summary: "Append the journal's summary", Answer: wire.OK{}, h: s.celFinalize},

		{Methods: post, Path: "/tmp/write", Scope: auth.Runs, RunHeader: true, Summary: "tmp.write: write a run file", Body: wire.WriteRequest{}, Answer: wire.FileRef{}, h: jsonTool(s, func(ctx context.Context, id runid.ID, in wire.WriteRequest) (wire.FileRef, error) {
			return s.orch.Write(ctx, id, in)
		}),
			Links: map[string]link{
				"read":     sameRun("get_tmp_read", "query", "Read the file back"),
				"download": sameRun("get_tmp_files_path", "path", "Download the file"),
				"delete":   sameRun("post_tmp_delete", "body", "Delete the file"),
			}},
		{Methods: get, Path: "/tmp/read", Scope: auth.Read, RunHeader: true, Summary: "tmp.read: read a run file inline",
			Query: []param{{Name: "path", Required: true, Tag: fieldTag(wire.PathRequest{}, "path")}}, Answer: wire.ReadResponse{}, h: queryTool(s, "path", true, func(ctx context.Context, id runid.ID, p string) (wire.ReadResponse, error) {
				return s.orch.Read(ctx, id, p)
			})},
		{Methods: get, Path: "/tmp/list", Scope: auth.Read, RunHeader: true, Summary: "tmp.list: the run's files under a prefix",
			Query: []param{{Name: "prefix", Tag: fieldTag(wire.ListRequest{}, "prefix")}}, Answer: wire.ListResponse{}, h: queryTool(s, "prefix", false, func(ctx context.Context, id runid.ID, p string) (wire.ListResponse, error) {
				return s.orch.List(ctx, id, p)
			})},
		{Methods: post, Path: "/tmp/delete", Scope: auth.Runs, RunHeader: true, Summary: "tmp.delete: delete a run file", Body: wire.PathRequest{}, Answer: wire.OK{},
			h: jsonTool(s, func(ctx context.Context, id runid.ID, in wire.PathRequest) (wire.OK, error) {
				return s.orch.Delete(ctx, id, in.Path)
			})},
		{Methods: put, Path: "/tmp/files/{path:.+}", Scope: auth.Runs, RunHeader: true, PathParams: []param{pathParam}, Summary: "tmp.write, streamed: the raw body becomes the run file", BodyType: "application/octet-stream", Answer: wire.FileRef{}, h: s.filePut,
			Links: map[string]link{"read": sameRun("get_tmp_read", "query", "Read the file back")}},
		{Methods: getHd, Path: "/tmp/files/{path:.+}", Scope: auth.Read, RunHeader: true, PathParams: []param{pathParam}, Summary: "tmp.read, streamed: the run file's raw bytes (Range supported)", AnswerType: "application/octet-stream", h: s.fileGet},
		{Methods: getHd, Path: "/blobs/{sha256}", Scope: auth.Read, RunHeader: true, PathParams: []param{{Name: "sha256", Tag: `pattern:"^[0-9a-f]{64}$" doc:"The blob's sha256, as 64 lower-case hex digits."`}},
			Summary: "A blob by sha256, for a caller naming a run that holds it (X-Run-Id, or ?run= in a link)", Query: []param{
				{Name: "run", Tag: `format:"run-id" doc:"The run that holds the blob, for a link that cannot send X-Run-Id."`},
				{Name: "name", Tag: `doc:"A file name: the blob downloads as an attachment with this name."`},
			}, AnswerType: "application/octet-stream", h: s.blobGet},

		{Methods: post, Path: "/browser/search", Scope: auth.Runs, RunHeader: true, Summary: "browser.search: search the web", Body: wire.SearchRequest{}, Answer: wire.SearchResponse{}, h: s.browserSearch},
		{Methods: post, Path: "/sandbox/exec", Scope: auth.Runs, RunHeader: true, Summary: "sandbox.exec: run a Python cell in the run's kernel; with Accept: text/event-stream, its output streams as events and the last (done) is the answer",
			Body: wire.ExecRequest{}, Answer: wire.ExecResponse{}, Alt: wire.ExecEvent{}, AltType: "text/event-stream", h: s.sandboxExec,
			Links: map[string]link{
				"read_output": {Op: "get_tmp_read", Params: map[string]any{"header." + RunHeader: "$request.header." + RunHeader, "query.path": "$response.body#/files_out/0/path"},
					Description: "Read the first file the cell wrote"},
				"journal": {Op: "get_cel", Params: map[string]any{"header." + RunHeader: "$request.header." + RunHeader}, Description: "The run's journal, with this call's Step Block"},
			}},
		{Methods: post, Path: "/sandbox/restart", Scope: auth.Runs, RunHeader: true, Summary: "Restart the run's kernel (its files stay)", Answer: wire.RestartResponse{}, h: s.sandboxRestart},

		{Methods: get, Path: "/kernels", Scope: auth.Read, Summary: "The caller's live kernels (run, age, last use, busy or idle, CPU and memory as the backend reports them) and its kernel quota's use: " +
			"only busy kernels are in use, and a new kernel at the limit reclaims the least recently used idle one", Answer: wire.KernelList{}, h: s.kernelsList},
		{Methods: post, Path: "/kernels/{id}/interrupt", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Interrupt the cells running in the run's kernel (it keeps its state if they stop in time)", Answer: wire.KernelAction{}, h: s.kernelAction(orchestrator.KernelInterrupt)},
		{Methods: post, Path: "/kernels/{id}/restart", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Restart the run's kernel, interrupting its cells first (its files stay)", Answer: wire.KernelAction{}, h: s.kernelAction(orchestrator.KernelRestart)},
		{Methods: del, Path: "/kernels/{id}", Scope: auth.Runs, PathParams: []param{runIDParam}, Summary: "Stop the run's kernel, interrupting its cells first: its files stay, and its next cell starts a fresh kernel", Answer: wire.KernelAction{}, h: s.kernelAction(orchestrator.KernelStop)},

		{Methods: get, Path: "/keys", Scope: auth.Admin, Summary: "Every API key (never its secret), with its last use", Answer: wire.KeyList{}, h: s.keysList},
		{Methods: post, Path: "/keys", Scope: auth.Admin, Summary: "Create an API key; the answer is the only time it is shown", Body: wire.NewKeyRequest{}, OK: http.StatusCreated, Answer: wire.NewKey{}, h: s.keysCreate,
			Links: map[string]link{"revoke": {Op: "delete_keys_id", Params: map[string]any{"path.id": "$response.body#/key/id"}, Description: "Revoke the new key"}}},
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
