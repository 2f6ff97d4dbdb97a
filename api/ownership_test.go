package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/seal"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/console"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

// world is every surface of one Triad on one listener, as triad serve
// wires them: the E2B surface in front of the console in front of the
// HTTP API, with MCP mounted in it, all over one core with keys on.
type world struct {
	t        *testing.T
	url      string
	st       *orchestratortest.Stack
	api      *api.Server
	sessions *session.Store
	// unknown caches the data plane's answers for a sandbox that does
	// not exist, by route.
	unknown map[string]answer
}

// tenant is a caller of the world: its key, its console session, its
// own E2B sandbox (whose token it would send to reach another's).
type tenant struct {
	name    string
	key     string
	p       auth.Principal
	sess    session.Session
	sandbox string
	token   string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	st := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true})
	ctx := t.Context()
	meta := st.Store.Meta()
	shares, err := share.Open(ctx, meta, share.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sessions := session.New(meta, st.Keys, session.Config{})
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	rn := runner.New(runner.Config{Orchestrator: st.Orch, Catalog: cat, Backend: st.Backend})
	t.Cleanup(func() { rn.Close() })
	m := mcp.New(mcp.Config{Orchestrator: st.Orch, Recipes: rn})
	t.Cleanup(func() { m.Close() })
	h := api.New(api.Config{Orchestrator: st.Orch, Runner: rn, Keys: st.Keys, Shares: shares, Sessions: sessions})
	h.Mount("/mcp", "MCP", m.Handler())
	con, err := console.New(console.Config{Orchestrator: st.Orch, Keys: st.Keys, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := seal.Open(ctx, meta, seal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := e2b.New(ctx, e2b.Config{Core: st.Orch, Records: metarecords.New(meta), Sealer: sealer,
		// As triad serve takes E2B's X-API-Key: a Triad key with the runs
		// scope acts as its principal.
		Authorize: func(r *http.Request) (auth.Principal, bool) {
			p, err := st.Keys.Authenticate(r.Context(), r.Header.Get(e2b.HeaderAPIKey))
			return p, err == nil && p.Has(auth.Runs)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	srv := httptest.NewServer(e.Handler(con.Handler(h)))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { h.Close(); st.Orch.Close() })
	return &world{t: t, url: srv.URL, st: st, api: h, sessions: sessions, unknown: map[string]answer{}}
}

// tenant makes a key of a new tenant, signs it into the console, and
// gives it a sandbox of its own.
func (w *world) tenant(name string) *tenant {
	w.t.Helper()
	ctx := w.t.Context()
	key, _, err := w.st.Keys.Create(ctx, "key of "+name, name, []auth.Scope{auth.Runs})
	if err != nil {
		w.t.Fatal(err)
	}
	p, err := w.st.Keys.Authenticate(ctx, key)
	if err != nil {
		w.t.Fatal(err)
	}
	sess, err := w.sessions.Create(ctx, p)
	if err != nil {
		w.t.Fatal(err)
	}
	tn := &tenant{name: name, key: key, p: p, sess: sess}
	tn.sandbox, tn.token = w.createSandbox(tn)
	return tn
}

// req is one request of a probe.
type req struct {
	method, path string
	hdr          map[string]string
	body         string
}

func (w *world) send(r req) answer {
	w.t.Helper()
	hr, err := http.NewRequestWithContext(w.t.Context(), r.method, w.url+r.path, strings.NewReader(r.body))
	if err != nil {
		w.t.Fatal(err)
	}
	for k, v := range r.hdr {
		hr.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, header: resp.Header}
}

// bearer authenticates a request with the tenant's key; cookie with its
// console session, as the console's pages call the API.
func (tn *tenant) bearer() map[string]string {
	return map[string]string{"Authorization": "Bearer " + tn.key}
}

func (tn *tenant) cookie() map[string]string {
	return map[string]string{"Cookie": session.CookieName + "=" + tn.sess.ID, session.CSRFHeader: tn.sess.CSRF}
}

func with(h map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func (w *world) createSandbox(tn *tenant) (id, token string) {
	w.t.Helper()
	a := w.send(req{"POST", "/sandboxes", map[string]string{e2b.HeaderAPIKey: tn.key, "Content-Type": "application/json"},
		`{"templateID": "code-interpreter-v1", "envVars": {"SECRET_OF": "` + tn.name + `"}}`})
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if a.status != 201 || json.Unmarshal(a.body, &sb) != nil {
		w.t.Fatalf("create a sandbox as %s: %d %s", tn.name, a.status, a.body)
	}
	return sb.SandboxID, sb.EnvdAccessToken
}

// apiProbes are B's requests on run id through Triad's HTTP API, one per
// run-scoped route, by route template; apiExempt are the routes that name
// no run, with the reason. A route in neither fails the probe.
func apiProbes(run string) map[string]req {
	rh := func(m, p, body string) req { return req{m, p, map[string]string{api.RunHeader: run}, body} }
	id := func(m, p, body string) req { return req{m, strings.Replace(p, "{id}", run, 1), nil, body} }
	return map[string]req{
		"GET /runs/{id}":                  id("GET", "/runs/{id}", ""),
		"GET /runs/{id}/events":           id("GET", "/runs/{id}/events", ""),
		"GET /runs/{id}/files":            id("GET", "/runs/{id}/files", ""),
		"GET /runs/{id}/files/{path:.+}":  id("GET", "/runs/{id}/files/secret.csv", ""),
		"HEAD /runs/{id}/files/{path:.+}": id("HEAD", "/runs/{id}/files/secret.csv", ""),
		"POST /runs/{id}/replay":          id("POST", "/runs/{id}/replay", ""),
		"POST /runs/{id}/snapshots":       id("POST", "/runs/{id}/snapshots", `{"name": "b-was-here"}`),
		"POST /runs/{id}/fork":            id("POST", "/runs/{id}/fork", ""),
		"POST /runs/{id}/share":           id("POST", "/runs/{id}/share", `{"path": "secret.csv"}`),
		"GET /runs/{id}/shares":           id("GET", "/runs/{id}/shares", ""),
		"PATCH /runs/{id}":                id("PATCH", "/runs/{id}", `{"name": "b was here"}`),
		"DELETE /runs/{id}":               id("DELETE", "/runs/{id}", ""),
		"POST /run":                       {"POST", "/run", nil, `{"run_id": "` + run + `", "recipe": "market-scan"}`},
		"GET /cel":                        rh("GET", "/cel", ""),
		"POST /cel/note":                  rh("POST", "/cel/note", `{"text": "b was here"}`),
		"POST /cel/finalize":              rh("POST", "/cel/finalize", ""),
		"POST /tmp/write":                 rh("POST", "/tmp/write", `{"path": "planted.py", "text": "import os"}`),
		"GET /tmp/read":                   rh("GET", "/tmp/read?path=secret.csv", ""),
		"GET /tmp/list":                   rh("GET", "/tmp/list", ""),
		"POST /tmp/delete":                rh("POST", "/tmp/delete", `{"path": "secret.csv"}`),
		"PUT /tmp/files/{path:.+}":        rh("PUT", "/tmp/files/planted.py", "import os"),
		"GET /tmp/files/{path:.+}":        rh("GET", "/tmp/files/secret.csv", ""),
		"HEAD /tmp/files/{path:.+}":       rh("HEAD", "/tmp/files/secret.csv", ""),
		"GET /blobs/{sha256}":             rh("GET", "/blobs/"+strings.Repeat("ab", 32), ""),
		"HEAD /blobs/{sha256}":            rh("HEAD", "/blobs/"+strings.Repeat("ab", 32), ""),
		"POST /browser/search":            rh("POST", "/browser/search", `{"query": "acme"}`),
		"POST /sandbox/exec":              rh("POST", "/sandbox/exec", `{"code": "open('secret.csv').read()"}`),
		"POST /sandbox/restart":           rh("POST", "/sandbox/restart", ""),
		"POST /kernels/{id}/interrupt":    id("POST", "/kernels/{id}/interrupt", ""),
		"POST /kernels/{id}/restart":      id("POST", "/kernels/{id}/restart", ""),
		"DELETE /kernels/{id}":            id("DELETE", "/kernels/{id}", ""),
	}
}

var apiExempt = map[string]string{
	"GET /healthz": "public", "HEAD /healthz": "public", "GET /version": "public", "GET /openapi.json": "public",
	"GET /recipes": "the catalog", "GET /recipes/{name}": "the catalog", "GET /templates": "the server's templates, the same for every tenant",
	"POST /runs":                    "mints a fresh run for the caller",
	"GET /runs":                     "checked by probe: B's list lacks the run",
	"GET /kernels":                  "checked by probe: B's list lacks the run's kernel",
	"GET /usage":                    "the caller's own tenant's sum (TestTenantsSeeOnlyTheirRuns: B reads its own, A's is 403)",
	"DELETE /shares/{id}":           "names a share link, not a run (TestTenantsSeeOnlyTheirRuns)",
	"GET /share/{token}":            "the link is the credential (TestShareLinks)",
	"HEAD /share/{token}":           "the link is the credential (TestShareLinks)",
	"GET /share/{token}/{path:.+}":  "the link is the credential (TestShareLinks)",
	"HEAD /share/{token}/{path:.+}": "the link is the credential (TestShareLinks)",
	"GET /keys":                     "admin only (TestKeys)",
	"POST /keys":                    "admin only (TestKeys)",
	"DELETE /keys/{id}":             "admin only (TestKeys)",
	"GET /mcp":                      "the MCP session stream; tools are probed through an MCP client",
	"DELETE /mcp":                   "ends the caller's own MCP session",
	"POST /mcp":                     "probed through an MCP client, tool by tool",
}

// dataRoutes are the E2B data plane's routes: envd's REST and Connect
// services and the code interpreter's.
var dataRoutes = []struct{ method, path, body string }{
	{"GET", "/health", ""}, {"GET", "/envs", ""}, {"GET", "/files?path=secret.csv", ""}, {"HEAD", "/files?path=secret.csv", ""},
	{"POST", "/files?path=planted.py", "import os"},
	{"POST", filesystemconnect.FilesystemStatProcedure, `{"path": "secret.csv"}`},
	{"POST", filesystemconnect.FilesystemMakeDirProcedure, `{"path": "d"}`},
	{"POST", filesystemconnect.FilesystemMoveProcedure, `{"source": "secret.csv", "destination": "x.csv"}`},
	{"POST", filesystemconnect.FilesystemListDirProcedure, `{"path": "/home/user"}`},
	{"POST", filesystemconnect.FilesystemRemoveProcedure, `{"path": "secret.csv"}`},
	{"POST", filesystemconnect.FilesystemWatchDirProcedure, `{"path": "/home/user"}`},
	{"POST", filesystemconnect.FilesystemCreateWatcherProcedure, `{"path": "/home/user"}`},
	{"POST", filesystemconnect.FilesystemGetWatcherEventsProcedure, `{"watcherId": "w"}`},
	{"POST", filesystemconnect.FilesystemRemoveWatcherProcedure, `{"watcherId": "w"}`},
	{"POST", processconnect.ProcessListProcedure, `{}`},
	{"POST", processconnect.ProcessConnectProcedure, `{"process": {"pid": 1}}`},
	{"POST", processconnect.ProcessStartProcedure, `{"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat secret.csv"]}}`},
	{"POST", processconnect.ProcessUpdateProcedure, `{"process": {"pid": 1}}`},
	{"POST", processconnect.ProcessStreamInputProcedure, `{}`},
	{"POST", processconnect.ProcessSendInputProcedure, `{"process": {"pid": 1}, "input": {"stdin": "eA=="}}`},
	{"POST", processconnect.ProcessSendSignalProcedure, `{"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}`},
	{"POST", processconnect.ProcessCloseStdinProcedure, `{"process": {"pid": 1}}`},
	{"POST", "/execute", `{"code": "open('secret.csv').read()"}`},
	{"GET", "/contexts", ""}, {"POST", "/contexts", `{}`}, {"DELETE", "/contexts/c1", ""}, {"POST", "/contexts/c1/restart", ""},
}

// mcpProbes are B's MCP tool calls on run id, every tool that takes one.
func mcpProbes() map[string]map[string]any {
	return map[string]map[string]any{
		mcp.ToolExec: {"code": "open('secret.csv').read()"}, mcp.ToolRestart: {}, mcp.ToolSearch: {"query": "acme"},
		mcp.ToolWrite: {"path": "planted.py", "text": "import os"}, mcp.ToolRead: {"path": "secret.csv"}, mcp.ToolList: {},
		mcp.ToolDelete: {"path": "secret.csv"}, mcp.ToolJournal: {}, mcp.ToolNote: {"text": "b was here"},
		mcp.ToolRecipe: {"recipe": "market-scan"}, mcp.ToolRunStatus: {}, mcp.ToolRunSetup: {"seed": 7},
	}
}

// probe has b try every run-scoped route of every surface on run (which
// is a's) and fails the test for each that is not the one answer for a
// run b may not see: 404 not_found (the E2B data plane's 502, the same as
// for a sandbox that does not exist), never naming a's tenant or data.
// It returns how many requests it made.
func (w *world) probe(a, b *tenant, run string) int {
	w.t.Helper()
	t := w.t
	n := 0
	leak := func(where string, body []byte) {
		for _, s := range []string{a.name, "4711", "secret of"} {
			if bytes.Contains(body, []byte(s)) {
				t.Errorf("%s: the answer leaks %q: %s", where, s, body)
			}
		}
	}
	// The HTTP API, with b's key and with b's console session.
	probes := apiProbes(run)
	for _, auth := range []struct {
		name string
		hdr  map[string]string
	}{{"key", b.bearer()}, {"console session", b.cookie()}} {
		seen := 0
		w.api.Router().Walk(func(r *mux.Route, _ *mux.Router, _ []*mux.Route) error {
			tmpl, err := r.GetPathTemplate()
			if err != nil {
				return nil
			}
			methods, _ := r.GetMethods()
			for _, m := range methods {
				key := m + " " + tmpl
				if _, ok := apiExempt[key]; ok {
					continue
				}
				p, ok := probes[key]
				if !ok {
					t.Errorf("route %s has no probe here: add one (or an exemption with its reason)", key)
					continue
				}
				seen++
				n++
				h := with(auth.hdr)
				for k, v := range p.hdr {
					h[k] = v
				}
				if p.body != "" {
					h["Content-Type"] = "application/json"
				}
				ans := w.send(req{p.method, p.path, h, p.body})
				if ans.status != 404 {
					t.Errorf("%s by %s's %s on %s's run: got %d %s, want 404", key, b.name, auth.name, a.name, ans.status, ans.body)
					continue
				}
				if m != "HEAD" && !bytes.Contains(ans.body, []byte(`"not_found"`)) {
					t.Errorf("%s: %s, want kind not_found", key, ans.body)
				}
				leak(key, ans.body)
			}
			return nil
		})
		if seen < len(probes) {
			t.Errorf("walked %d probed routes, but there are %d probes: a route went missing", seen, len(probes))
		}
		var list wire.RunList
		if ans := w.send(req{"GET", "/runs", auth.hdr, ""}); ans.status != 200 || json.Unmarshal(ans.body, &list) != nil {
			t.Errorf("GET /runs as %s: %d %s", b.name, ans.status, ans.body)
		}
		for _, r := range list.Runs {
			if r.RunID == run {
				t.Errorf("GET /runs as %s's %s lists %s's run", b.name, auth.name, a.name)
			}
		}
		var kl wire.KernelList
		if ans := w.send(req{"GET", "/kernels", auth.hdr, ""}); ans.status != 200 || json.Unmarshal(ans.body, &kl) != nil {
			t.Errorf("GET /kernels as %s: %d %s", b.name, ans.status, ans.body)
		}
		for _, k := range kl.Kernels {
			if k.RunID == run {
				t.Errorf("GET /kernels as %s's %s lists %s's kernel", b.name, auth.name, a.name)
			}
		}
	}
	// The console's pages of the run.
	for _, p := range []string{"", "/scratch", "/cel", "/render/notes.md"} {
		n++
		if ans := w.send(req{"GET", "/console/runs/" + run + p, b.cookie(), ""}); ans.status != 404 {
			t.Errorf("console page %s of %s's run for %s: got %d, want 404", p, a.name, b.name, ans.status)
		} else {
			leak("console "+p, ans.body)
		}
	}
	// MCP, with b's key: every tool that takes a run.
	cs, err := sdk.NewClient(&sdk.Implementation{Name: b.name, Version: "0"}, nil).Connect(t.Context(),
		&sdk.StreamableClientTransport{Endpoint: w.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{b.key}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mp := mcpProbes()
	for _, tool := range tools.Tools {
		schema, _ := json.Marshal(tool.InputSchema)
		if _, ok := mp[tool.Name]; !ok && bytes.Contains(schema, []byte(`"run_id"`)) {
			t.Errorf("MCP tool %s takes a run_id but has no probe here", tool.Name)
		}
	}
	for tool, args := range mp {
		n++
		args["run_id"] = run
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("MCP %s: %v", tool, err)
		}
		txt := ""
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*sdk.TextContent); ok {
				txt = tc.Text
			}
		}
		var e wire.ErrorBody
		if !res.IsError || json.Unmarshal([]byte(txt), &e) != nil || e.Error.Kind != "not_found" {
			t.Errorf("MCP %s by %s on %s's run: got %s, want a not_found error", tool, b.name, a.name, txt)
		}
		leak("MCP "+tool, []byte(txt))
	}
	// E2B's control plane, with b's key.
	for _, p := range []req{{"GET", "/sandboxes/{id}", nil, ""}, {"DELETE", "/sandboxes/{id}", nil, ""},
		{"POST", "/sandboxes/{id}/timeout", nil, `{"timeout": 60}`}, {"POST", "/sandboxes/{id}/connect", nil, `{"timeout": 60}`},
		{"POST", "/v2/sandboxes/{id}/connect", nil, `{"timeout": 60}`}, {"POST", "/sandboxes/{id}/resume", nil, `{}`},
		{"POST", "/sandboxes/{id}/pause", nil, ""}, {"POST", "/sandboxes/{id}/snapshots", nil, `{"name": "b"}`},
		{"POST", "/sandboxes/{id}/fork", nil, `{"count": 1}`}, {"GET", "/sandboxes/{id}/metrics", nil, ""}} {
		n++
		path := strings.Replace(p.path, "{id}", run, 1)
		ans := w.send(req{p.method, path, map[string]string{e2b.HeaderAPIKey: b.key, "Content-Type": "application/json"}, p.body})
		if ans.status != 404 || !bytes.Contains(ans.body, []byte(`"not_found"`)) {
			t.Errorf("E2B %s %s by %s: got %d %s, want 404 not_found", p.method, p.path, b.name, ans.status, ans.body)
		}
		leak("E2B "+p.path, ans.body)
	}
	if ans := w.send(req{"GET", "/v2/sandboxes", map[string]string{e2b.HeaderAPIKey: b.key}, ""}); ans.status != 200 || bytes.Contains(ans.body, []byte(run)) {
		t.Errorf("E2B list as %s: %d, lists %s's run: %v", b.name, ans.status, a.name, bytes.Contains(ans.body, []byte(run)))
	}
	// E2B's data plane, with b's own sandbox's token: the same answer
	// as for a sandbox that does not exist.
	for _, port := range []string{e2b.EnvdPort, e2b.InterpreterPort} {
		for _, r := range dataRoutes {
			n++
			route := port + " " + r.method + " " + r.path
			hdr := func(id string) map[string]string {
				h := map[string]string{e2b.HeaderSandboxID: id, e2b.HeaderSandboxPort: port, "Content-Type": "application/json",
					e2b.HeaderAccessToken: b.token, e2b.HeaderTrafficToken: b.token}
				if strings.HasPrefix(r.path, "/filesystem.") || strings.HasPrefix(r.path, "/process.") {
					h["Connect-Protocol-Version"] = "1"
				}
				return h
			}
			unknown, ok := w.unknown[route]
			if !ok {
				unknown = w.send(req{r.method, r.path, hdr("r-no-such-sandbox"), r.body})
				w.unknown[route] = unknown
			}
			ans := w.send(req{r.method, r.path, hdr(run), r.body})
			got := bytes.ReplaceAll(ans.body, []byte(run), []byte("r-no-such-sandbox"))
			if ans.status != unknown.status || !bytes.Equal(got, unknown.body) || ans.status != 502 {
				t.Errorf("E2B data plane %s by %s on %s's run: got %d %s; a sandbox that does not exist: %d %s",
					route, b.name, a.name, ans.status, ans.body, unknown.status, unknown.body)
			}
			leak("E2B data "+route, ans.body)
		}
	}
	return n
}

// state is what a's run holds: its steps and its files, by hash.
func (w *world) state(a *tenant, run string) string {
	w.t.Helper()
	ctx := auth.With(w.t.Context(), a.p)
	v, err := w.st.Orch.Status(ctx, runid.Must(run))
	if err != nil {
		w.t.Fatalf("status of %s's run: %v", a.name, err)
	}
	rr, err := w.st.Orch.ReadRun(ctx, runid.Must(run))
	if err != nil {
		w.t.Fatal(err)
	}
	files, err := rr.Files(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range v.Steps {
		b.WriteString(s.Tool + ";")
	}
	for _, f := range files.Files {
		b.WriteString(f.Path + "=" + f.SHA256.String() + ";")
	}
	return b.String()
}

// guarded runs b's probes on run and checks that they changed nothing.
func (w *world) guarded(a, b *tenant, run string) {
	w.t.Helper()
	before := w.state(a, run)
	n := w.probe(a, b, run)
	if after := w.state(a, run); after != before {
		w.t.Errorf("%s's %d probes changed %s's run:\nbefore %s\nafter  %s", b.name, n, a.name, before, after)
	}
	if n < 100 {
		w.t.Errorf("only %d probes ran", n)
	}
}

func (w *world) json(a answer, v any) {
	w.t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		w.t.Fatalf("%d %s: %v", a.status, a.body, err)
	}
}

// ok fails the test unless a is a 2xx answer.
func (w *world) ok(what string, a answer) answer {
	w.t.Helper()
	if a.status < 200 || a.status > 299 {
		w.t.Fatalf("%s: %d %s", what, a.status, a.body)
	}
	return a
}

// A run belongs to the tenant whose call created it, through whichever
// surface: HTTP, the console, MCP, E2B, a recipe or a replay. Before and
// after its creator's first call, the other tenant gets the one answer
// for a run it may not see on every run-scoped route of every surface
// (HTTP with a key and with a console session, the console's pages, MCP,
// E2B's control and data planes), changes nothing, and the creator's
// calls keep working. (Before issue 23, a run created by E2B became the
// first caller's: see TestE2BSandboxIsItsCreators.)
func TestOwnerDecidedAtCreation(t *testing.T) {
	w := newWorld(t)
	a, b := w.tenant("acme"), w.tenant("globex")
	secret := `{"path": "secret.csv", "text": "account,pin\nacme,4711\n"}`
	exec := func(hdr map[string]string, run, code string) wire.ExecResponse {
		t.Helper()
		var out wire.ExecResponse
		w.json(w.ok("exec", w.send(req{"POST", "/sandbox/exec", with(hdr, api.RunHeader, run, "Content-Type", "application/json"),
			`{"code": ` + strings.TrimSpace(mustJSON(code)) + `}`})), &out)
		if !out.OK {
			t.Fatalf("exec %q in %s: %+v", code, run, out)
		}
		return out
	}

	t.Run("HTTP", func(t *testing.T) {
		var nr wire.NewRunResponse
		w.json(w.ok("POST /runs", w.send(req{"POST", "/runs", a.bearer(), ""})), &nr)
		w.guarded(a, b, nr.RunID)
		w.ok("A's first call", w.send(req{"POST", "/tmp/write", with(a.bearer(), api.RunHeader, nr.RunID, "Content-Type", "application/json"), secret}))
		w.guarded(a, b, nr.RunID)
		if out := exec(a.bearer(), nr.RunID, "open('secret.csv').read()"); !strings.Contains(out.Result.Data["text/plain"].(string), "4711") {
			t.Errorf("A's call after B's probes: %+v", out)
		}
	})

	t.Run("console session", func(t *testing.T) {
		// The console's pages start a run with POST /runs from the
		// browser, with the session's cookie and CSRF token.
		var nr wire.NewRunResponse
		w.json(w.ok("POST /runs from the console", w.send(req{"POST", "/runs", a.cookie(), ""})), &nr)
		w.guarded(a, b, nr.RunID)
		w.ok("A's first call", w.send(req{"POST", "/tmp/write", with(a.cookie(), api.RunHeader, nr.RunID, "Content-Type", "application/json"), secret}))
		w.guarded(a, b, nr.RunID)
		exec(a.cookie(), nr.RunID, "open('secret.csv').read()")
		w.ok("A's console page", w.send(req{"GET", "/console/runs/" + nr.RunID + "/cel", a.cookie(), ""}))
	})

	t.Run("MCP", func(t *testing.T) {
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "acme", Version: "0"}, nil).Connect(t.Context(),
			&sdk.StreamableClientTransport{Endpoint: w.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{a.key}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		call := func(tool string, args map[string]any) string {
			t.Helper()
			res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: args})
			if err != nil || res.IsError {
				t.Fatalf("A's MCP %s: %v %+v", tool, err, res)
			}
			return res.Content[0].(*sdk.TextContent).Text
		}
		// The session's run exists from the session's start: reading its
		// status makes no call.
		var v wire.RunView
		json.Unmarshal([]byte(call(mcp.ToolRunStatus, map[string]any{})), &v)
		if v.RunID == "" || len(v.Steps) != 0 {
			t.Fatalf("A's session run before its first call: %+v", v)
		}
		w.guarded(a, b, v.RunID)
		call(mcp.ToolWrite, map[string]any{"path": "secret.csv", "text": "account,pin\nacme,4711\n"})
		w.guarded(a, b, v.RunID)
		if got := call(mcp.ToolRead, map[string]any{"path": "secret.csv"}); !strings.Contains(got, "4711") {
			t.Errorf("A's MCP read after B's probes: %s", got)
		}
	})

	t.Run("E2B", func(t *testing.T) {
		id, tok := w.createSandbox(a)
		w.guarded(a, b, id)
		data := func(method, path, body string) answer {
			return w.send(req{method, path, map[string]string{e2b.HeaderSandboxID: id, e2b.HeaderSandboxPort: e2b.EnvdPort,
				e2b.HeaderAccessToken: tok, "Content-Type": "application/octet-stream"}, body})
		}
		w.ok("A's first call", data("POST", "/files?path=secret.csv", "account,pin\nacme,4711\n"))
		w.guarded(a, b, id)
		if got := w.ok("A's read after B's probes", data("GET", "/files?path=secret.csv", "")); !bytes.Contains(got.body, []byte("4711")) {
			t.Errorf("A's file: %s", got.body)
		}
		// A reaches its sandbox through Triad's own API too.
		w.ok("A's tmp.list", w.send(req{"GET", "/tmp/list", with(a.bearer(), api.RunHeader, id), ""}))
	})

	t.Run("recipe", func(t *testing.T) {
		var started wire.RecipeRunStarted
		w.json(w.ok("POST /run", w.send(req{"POST", "/run", with(a.bearer(), "Content-Type", "application/json"),
			`{"recipe": "market-scan", "params": {"top_k": 2}}`})), &started)
		// The recipe's first calls race these probes: they hold either
		// way, and the run is checked unchanged only once it ends.
		w.probe(a, b, started.RunID)
		deadline := time.Now().Add(5 * time.Minute)
		for {
			var v wire.RunView
			w.json(w.send(req{"GET", "/runs/" + started.RunID, a.bearer(), ""}), &v)
			if v.Status == "succeeded" || v.Status == "failed" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("A's recipe run did not end: %+v", v)
			}
			time.Sleep(100 * time.Millisecond)
		}
		w.guarded(a, b, started.RunID)
		w.ok("A's call on its recipe run", w.send(req{"POST", "/tmp/write", with(a.bearer(), api.RunHeader, started.RunID, "Content-Type", "application/json"), secret}))
	})

	t.Run("replay", func(t *testing.T) {
		var nr wire.NewRunResponse
		w.json(w.ok("POST /runs", w.send(req{"POST", "/runs", a.bearer(), ""})), &nr)
		w.ok("A's write", w.send(req{"POST", "/tmp/write", with(a.bearer(), api.RunHeader, nr.RunID, "Content-Type", "application/json"), secret}))
		exec(a.bearer(), nr.RunID, "open('out.txt', 'w').write(open('secret.csv').read())")
		var rep wire.ReplayReport
		w.json(w.ok("A's replay", w.send(req{"POST", "/runs/" + nr.RunID + "/replay", a.bearer(), ""})), &rep)
		if !rep.Identical {
			t.Errorf("the replay diverged: %+v", rep)
		}
		w.guarded(a, b, rep.RunID)
		exec(a.bearer(), rep.RunID, "open('out.txt').read()")
	})
}

// TestE2BSandboxIsItsCreators is the flow issue 23 reported: tenant A
// creates an E2B sandbox, and before A's first call tenant B names the
// sandbox's id on Triad's API. B gets 404 and plants nothing; A's sandbox
// stays A's (its calls work, GET /runs lists it under A alone). Before
// issue 23, B got 200, owned the run from then on, and A got 404.
func TestE2BSandboxIsItsCreators(t *testing.T) {
	w := newWorld(t)
	a, b := w.tenant("acme"), w.tenant("globex")
	id, tok := w.createSandbox(a)
	if ans := w.send(req{"GET", "/tmp/list", with(b.bearer(), api.RunHeader, id), ""}); ans.status != 404 {
		t.Errorf("B's GET /tmp/list on A's sandbox: got %d %s, want 404", ans.status, ans.body)
	}
	if ans := w.send(req{"POST", "/tmp/write", with(b.bearer(), api.RunHeader, id, "Content-Type", "application/json"),
		`{"path": "planted.py", "text": "print('b was here')"}`}); ans.status != 404 {
		t.Errorf("B's tmp.write of planted.py into A's sandbox: got %d %s, want 404", ans.status, ans.body)
	}
	ans := w.send(req{"POST", "/execute", map[string]string{e2b.HeaderSandboxID: id, e2b.HeaderSandboxPort: e2b.InterpreterPort,
		e2b.HeaderAccessToken: tok, "Content-Type": "application/json"}, `{"code": "import os\nos.path.exists('planted.py')"}`})
	if ans.status != 200 || !bytes.Contains(ans.body, []byte(`"text":"False"`)) {
		t.Errorf("A's first cell: got %d %s, want it to run, with no planted.py", ans.status, ans.body)
	}
	if ans := w.send(req{"GET", "/tmp/list", with(a.bearer(), api.RunHeader, id), ""}); ans.status != 200 {
		t.Errorf("A's GET /tmp/list on its sandbox: got %d %s, want 200", ans.status, ans.body)
	}
	for _, tn := range []*tenant{a, b} {
		ans := w.send(req{"GET", "/runs", tn.bearer(), ""})
		if listed := regexp.MustCompile(`"run_id":"` + regexp.QuoteMeta(id) + `"`).Match(ans.body); listed != (tn == a) {
			t.Errorf("GET /runs as %s lists A's sandbox: %v", tn.name, listed)
		}
	}
}

// TestSurfaceStateOutOfToolsReach: the E2B surface's records (and every
// other surface's state: keys, share links, sessions, secrets) live in the
// store's records outside runs, which no tool addresses, and the run that
// once held the E2B records is one of Triad's own ids, which every caller
// is refused. No key of any tenant, admin included, can list, read, write
// or delete them through any tool, on any surface; the records are
// unchanged after all the tries.
func TestSurfaceStateOutOfToolsReach(t *testing.T) {
	w := newWorld(t)
	a := w.tenant("acme")
	ctx := t.Context()
	recs := metarecords.New(w.st.Store.Meta())
	before, err := recs.All(ctx)
	if err != nil || len(before) != 1 {
		t.Fatalf("records: %d, %v", len(before), err)
	}
	admin, _, err := w.st.Keys.Create(ctx, "admin", "acme", []auth.Scope{auth.Admin})
	if err != nil {
		t.Fatal(err)
	}
	def, _, err := w.st.Keys.Create(ctx, "default", auth.DefaultTenant, []auth.Scope{auth.Runs})
	if err != nil {
		t.Fatal(err)
	}
	record := "sandboxes/" + a.sandbox + ".json"
	for _, key := range []string{a.key, admin, def} {
		hdr := map[string]string{"Authorization": "Bearer " + key}
		for _, run := range []string{"triad-e2b-sandboxes", "TRIAD-e2b-sandboxes", "triad-anything"} {
			for _, p := range []req{
				{"GET", "/tmp/list", nil, ""}, {"GET", "/tmp/list?prefix=sandboxes/", nil, ""},
				{"GET", "/tmp/read?path=" + record, nil, ""}, {"GET", "/tmp/files/" + record, nil, ""},
				{"POST", "/tmp/write", nil, `{"path": "` + record + `", "text": "{}"}`},
				{"PUT", "/tmp/files/" + record, nil, "{}"},
				{"POST", "/tmp/delete", nil, `{"path": "` + record + `"}`},
				{"POST", "/sandbox/exec", nil, `{"code": "import os; os.listdir('.')"}`},
				{"GET", "/cel", nil, ""},
			} {
				ans := w.send(req{p.method, p.path, with(hdr, api.RunHeader, run, "Content-Type", "application/json"), p.body})
				if ans.status != 400 || !bytes.Contains(ans.body, []byte(`"invalid_run_id"`)) {
					t.Errorf("%s %s in run %s: got %d %s, want 400 invalid_run_id", p.method, p.path, run, ans.status, ans.body)
				}
			}
			for _, p := range []string{"/runs/" + run, "/runs/" + run + "/files", "/runs/" + run + "/files/" + record} {
				if ans := w.send(req{"GET", p, hdr, ""}); ans.status != 400 {
					t.Errorf("GET %s: got %d %s, want 400 invalid_run_id", p, ans.status, ans.body)
				}
			}
		}
		// The key's own run holds none of it: the records are in no run.
		var nr wire.NewRunResponse
		w.json(w.ok("POST /runs", w.send(req{"POST", "/runs", hdr, ""})), &nr)
		for _, p := range []string{"/tmp/read?path=" + record, "/tmp/read?path=../meta/e2b/sandboxes/" + a.sandbox} {
			if ans := w.send(req{"GET", p, with(hdr, api.RunHeader, nr.RunID), ""}); ans.status != 404 && ans.status != 400 {
				t.Errorf("GET %s in the key's own run: got %d %s", p, ans.status, ans.body)
			}
		}
	}
	// MCP, with the admin's key.
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "admin", Version: "0"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: w.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{admin}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for tool, args := range map[string]map[string]any{mcp.ToolList: {}, mcp.ToolRead: {"path": record},
		mcp.ToolWrite: {"path": record, "text": "{}"}, mcp.ToolDelete: {"path": record}, mcp.ToolJournal: {}} {
		args["run_id"] = "triad-e2b-sandboxes"
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		var e wire.ErrorBody
		if txt := res.Content[0].(*sdk.TextContent).Text; !res.IsError || json.Unmarshal([]byte(txt), &e) != nil || e.Error.Kind != "invalid_run_id" {
			t.Errorf("MCP %s on the reserved run: %s, want invalid_run_id", tool, txt)
		}
	}
	// The admin's listing of every tenant shows no run of Triad's own.
	for _, tenant := range []string{"acme", auth.DefaultTenant} {
		ans := w.send(req{"GET", "/runs?tenant=" + tenant, map[string]string{"Authorization": "Bearer " + admin}, ""})
		if ans.status != 200 || bytes.Contains(ans.body, []byte(`"run_id":"triad-`)) {
			t.Errorf("GET /runs?tenant=%s: %d %s", tenant, ans.status, ans.body)
		}
	}
	after, err := recs.All(ctx)
	if err != nil || len(after) != 1 || !bytes.Equal(after[0], before[0]) {
		t.Errorf("the records changed: %d, %v", len(after), err)
	}
	if bytes.Contains(after[0], []byte("secret of")) {
		t.Errorf("the record shows the sandbox's env in plain text: %s", after[0])
	}
}
