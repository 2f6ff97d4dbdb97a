package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/mux"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

// bearer adds Authorization: Bearer to every request of an HTTP client.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// Tenant B gets 404 not_found on every endpoint for tenant A's run: tools,
// journal, run views and events, resuming A's recipe, sharing it, A's
// share link, A's blobs (also by hash in files_in), and MCP tools with A's
// run. The test walks every route the server has, so a route added
// without a probe here fails it; and A's run is unchanged afterwards.
func TestTenantsSeeOnlyTheirRuns(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true})
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	rn := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { rn.Close() })
	m := mcp.New(mcp.Config{Orchestrator: s.Orch, Recipes: rn})
	t.Cleanup(func() { m.Close() })
	a := apiServer(t, api.Config{Orchestrator: s.Orch, Runner: rn, Keys: s.Keys})
	a.h.Mount("/mcp", "MCP", m.Handler())
	b := a.as(a.newKey("globex", auth.Runs))

	// A's run: a recipe run (resumable once it ends), a deliverable, a
	// share link.
	var started wire.RecipeRunStarted
	if ans := a.post("/run", "", map[string]any{"recipe": "market-scan", "params": map[string]any{"top_k": 2}}); ans.status != 202 {
		t.Fatalf("A's recipe run: %d %s", ans.status, ans.body)
	} else {
		ans.json(t, &started)
	}
	runA := started.RunID
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var v wire.RunView
		a.do("GET", "/runs/"+runA, "", nil).json(t, &v)
		if v.Status == "succeeded" || v.Status == "failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's recipe run did not end: %+v", v)
		}
		time.Sleep(200 * time.Millisecond)
	}
	secret := a.write(runA, "artifacts/secret.csv", "account,pin\nacme,4711\n")
	var sh wire.Share
	a.post("/runs/"+runA+"/share", "", map[string]any{"path": "artifacts/secret.csv"}).json(t, &sh)
	var before wire.RunView
	a.do("GET", "/runs/"+runA, "", nil).json(t, &before)
	runB := "r-globex-own"
	b.write(runB, "mine.txt", "b's")

	body := func(v any) *strings.Reader { j, _ := json.Marshal(v); return strings.NewReader(string(j)) }
	sha := secret.SHA256.String()
	// One probe per route: B's request against A's run.
	probes := map[string]func() answer{
		"GET /runs/{id}":        func() answer { return b.do("GET", "/runs/"+runA, "", nil) },
		"GET /runs/{id}/events": func() answer { return b.do("GET", "/runs/"+runA+"/events", "", nil) },
		"GET /runs/{id}/files":  func() answer { return b.do("GET", "/runs/"+runA+"/files", "", nil) },
		"GET /runs/{id}/files/{path:.+}": func() answer {
			return b.do("GET", "/runs/"+runA+"/files/artifacts/secret.csv", "", nil)
		},
		"HEAD /runs/{id}/files/{path:.+}": func() answer {
			return b.do("HEAD", "/runs/"+runA+"/files/artifacts/secret.csv", "", nil)
		},
		"POST /runs/{id}/replay": func() answer { return b.do("POST", "/runs/"+runA+"/replay", "", nil) },
		"POST /runs/{id}/snapshots": func() answer {
			return b.do("POST", "/runs/"+runA+"/snapshots", "", body(map[string]any{"name": "b-was-here"}))
		},
		"POST /runs/{id}/fork": func() answer { return b.do("POST", "/runs/"+runA+"/fork", "", nil) },
		"POST /runs/{id}/share": func() answer {
			return b.do("POST", "/runs/"+runA+"/share", "", body(map[string]any{"path": "artifacts/secret.csv"}))
		},
		"PATCH /runs/{id}":      func() answer { return b.do("PATCH", "/runs/"+runA, "", body(map[string]any{"name": "b was here"})) },
		"DELETE /runs/{id}":     func() answer { return b.do("DELETE", "/runs/"+runA, "", nil) },
		"GET /runs/{id}/shares": func() answer { return b.do("GET", "/runs/"+runA+"/shares", "", nil) },
		"DELETE /shares/{id}":   func() answer { return b.do("DELETE", "/shares/"+sh.ID, "", nil) },
		"POST /run":             func() answer { return b.do("POST", "/run", "", body(map[string]any{"run_id": runA})) },
		"GET /cel":              func() answer { return b.do("GET", "/cel", runA, nil) },
		"POST /cel/note":        func() answer { return b.do("POST", "/cel/note", runA, body(map[string]any{"text": "b was here"})) },
		"POST /cel/finalize":    func() answer { return b.do("POST", "/cel/finalize", runA, nil) },
		"POST /tmp/write": func() answer {
			return b.do("POST", "/tmp/write", runA, body(map[string]any{"path": "x.txt", "text": "b"}))
		},
		"GET /tmp/read": func() answer { return b.do("GET", "/tmp/read?path=artifacts/secret.csv", runA, nil) },
		"GET /tmp/list": func() answer { return b.do("GET", "/tmp/list", runA, nil) },
		"POST /tmp/delete": func() answer {
			return b.do("POST", "/tmp/delete", runA, body(map[string]any{"path": "artifacts/secret.csv"}))
		},
		"PUT /tmp/files/{path:.+}":  func() answer { return b.do("PUT", "/tmp/files/x.bin", runA, strings.NewReader("b")) },
		"GET /tmp/files/{path:.+}":  func() answer { return b.do("GET", "/tmp/files/artifacts/secret.csv", runA, nil) },
		"HEAD /tmp/files/{path:.+}": func() answer { return b.do("HEAD", "/tmp/files/artifacts/secret.csv", runA, nil) },
		"GET /blobs/{sha256}":       func() answer { return b.do("GET", "/blobs/"+sha, runA, nil) },
		"HEAD /blobs/{sha256}":      func() answer { return b.do("HEAD", "/blobs/"+sha, runA, nil) },
		"POST /browser/search":      func() answer { return b.do("POST", "/browser/search", runA, body(map[string]any{"query": "acme"})) },
		"POST /sandbox/exec": func() answer {
			return b.do("POST", "/sandbox/exec", runA, body(map[string]any{"code": "open('artifacts/secret.csv').read()"}))
		},
		"POST /sandbox/restart":        func() answer { return b.do("POST", "/sandbox/restart", runA, nil) },
		"POST /kernels/{id}/interrupt": func() answer { return b.do("POST", "/kernels/"+runA+"/interrupt", "", nil) },
		"POST /kernels/{id}/restart":   func() answer { return b.do("POST", "/kernels/"+runA+"/restart", "", nil) },
		"DELETE /kernels/{id}":         func() answer { return b.do("DELETE", "/kernels/"+runA, "", nil) },
	}
	// Routes that name no run, with the reason they need no probe.
	exempt := map[string]string{
		"GET /healthz": "public", "HEAD /healthz": "public", "GET /version": "public", "GET /openapi.json": "public",
		"GET /recipes": "the catalog", "GET /recipes/{name}": "the catalog", "GET /templates": "the server's templates, the same for every tenant",
		"POST /runs":                    "mints a fresh run for the caller (and GET /runs is checked below)",
		"GET /runs":                     "checked below: B's list lacks A's run",
		"GET /kernels":                  "checked below: B's list lacks A's kernel",
		"GET /usage":                    "checked below: B's usage is its own, and A's is forbidden to B",
		"GET /share/{token}":            "the link is the credential (TestShareLinks)",
		"HEAD /share/{token}":           "the link is the credential (TestShareLinks)",
		"GET /share/{token}/{path:.+}":  "the link is the credential (TestShareLinks)",
		"HEAD /share/{token}/{path:.+}": "the link is the credential (TestShareLinks)",
		"GET /keys":                     "admin only (TestKeys)",
		"POST /keys":                    "admin only (TestKeys)",
		"DELETE /keys/{id}":             "admin only (TestKeys)",
		"GET /mcp":                      "the MCP session stream; tools are probed under POST /mcp",
		"DELETE /mcp":                   "ends the caller's own MCP session",
		"POST /mcp":                     "probed below, tool by tool",
	}
	seen := 0
	a.h.Router().Walk(func(r *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tmpl, err := r.GetPathTemplate()
		if err != nil {
			return nil
		}
		methods, _ := r.GetMethods()
		for _, m := range methods {
			key := m + " " + tmpl
			if _, ok := exempt[key]; ok {
				continue
			}
			probe, ok := probes[key]
			if !ok {
				t.Errorf("route %s has no tenant-isolation probe: add one to this test (or an exemption with its reason)", key)
				continue
			}
			seen++
			ans := probe()
			if ans.status != 404 {
				t.Errorf("%s as tenant B on A's run: got %d %s, want 404", key, ans.status, ans.body)
				continue
			}
			if m == "HEAD" {
				continue
			}
			if e := errBody(t, ans); e.Kind != "not_found" {
				t.Errorf("%s: kind %s, want not_found", key, e.Kind)
			}
			if strings.Contains(string(ans.body), "acme") || strings.Contains(string(ans.body), "4711") {
				t.Errorf("%s: the answer leaks A's tenant or data: %s", key, ans.body)
			}
		}
		return nil
	})
	if seen < len(probes) {
		t.Errorf("walked %d probed routes, but there are %d probes: a route went missing", seen, len(probes))
	}

	// B's own run cannot reach A's blob by hash either.
	wantErr(t, b.do("GET", "/blobs/"+sha, runB, nil), 404, "not_found")
	ans := b.post("/sandbox/exec", runB, map[string]any{"code": "print(open('s.csv').read())",
		"files_in": []map[string]string{{"name": "s.csv", "path": "sha256:" + sha}}})
	wantErr(t, ans, 404, "not_found")
	// A itself may, from another of its runs.
	if ans := a.post("/sandbox/exec", "r-acme-second", map[string]any{"code": "print(open('s.csv').read())",
		"files_in": []map[string]string{{"name": "s.csv", "path": "sha256:" + sha}}}); ans.status != 200 || !strings.Contains(string(ans.body), "4711") {
		t.Errorf("A's own files_in by hash: %d %s", ans.status, ans.body)
	}

	var list wire.RunList
	b.do("GET", "/runs", "", nil).json(t, &list)
	for _, r := range list.Runs {
		if r.RunID == runA {
			t.Error("GET /runs as B lists A's run")
		}
	}
	var kl wire.KernelList
	b.do("GET", "/kernels", "", nil).json(t, &kl)
	for _, k := range kl.Kernels {
		if k.RunID == runA || k.Tenant == "acme" {
			t.Errorf("GET /kernels as B lists A's kernel: %+v", k)
		}
	}
	var bu wire.TenantUsage
	b.do("GET", "/usage", "", nil).json(t, &bu)
	if bu.Tenant != "globex" {
		t.Errorf("GET /usage as B: got tenant %q's, want its own", bu.Tenant)
	}
	wantErr(t, b.do("GET", "/usage?tenant=acme", "", nil), 403, "forbidden")

	// MCP over HTTP with B's key: every tool that takes a run.
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "tenant-b", Version: "0"}, nil).Connect(t.Context(),
		&sdk.StreamableClientTransport{Endpoint: a.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{b.key}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for tool, args := range map[string]map[string]any{
		mcp.ToolExec:      {"code": "1"},
		mcp.ToolRestart:   {},
		mcp.ToolSearch:    {"query": "acme"},
		mcp.ToolWrite:     {"path": "x.txt", "text": "b"},
		mcp.ToolRead:      {"path": "artifacts/secret.csv"},
		mcp.ToolList:      {},
		mcp.ToolDelete:    {"path": "artifacts/secret.csv"},
		mcp.ToolJournal:   {},
		mcp.ToolNote:      {"text": "b was here"},
		mcp.ToolRecipe:    {"recipe": "market-scan"},
		mcp.ToolRunStatus: {},
	} {
		args["run_id"] = runA
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		txt := ""
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*sdk.TextContent); ok {
				txt = tc.Text
			}
		}
		var e wire.ErrorBody
		if !res.IsError || json.Unmarshal([]byte(txt), &e) != nil || e.Error.Kind != "not_found" {
			t.Errorf("MCP %s as B with A's run: got %s, want a not_found error", tool, txt)
		}
	}

	// A's run is as it was: B's attempts wrote nothing into it.
	var after wire.RunView
	a.do("GET", "/runs/"+runA, "", nil).json(t, &after)
	if len(after.Steps) != len(before.Steps) {
		t.Errorf("A's run went from %d to %d steps while B probed it", len(before.Steps), len(after.Steps))
	}
	if ans := a.do("GET", "/tmp/read?path=artifacts/secret.csv", runA, nil); ans.status != 200 {
		t.Errorf("A lost its file: %d", ans.status)
	}
	cel, err := s.Orch.Journal(context.Background(), runid.Must(runA))
	if err != nil || strings.Contains(string(cel), "b was here") {
		t.Errorf("A's journal holds B's note (%v)", err)
	}
}

// At its kernel quota, a tenant's new kernel reclaims the least recently
// used idle one (its files stay, its journal says so); GET /kernels lists
// the tenant's kernels and quota use, and only its own; when every kernel
// is busy the new one is refused with 429 quota and a suggestion the
// caller can act on, and the kernels' interrupt and stop free one.
// Another tenant has a quota of its own.
func TestKernelQuota(t *testing.T) {
	const n = 2
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Quotas: orchestrator.Quotas{Kernels: n}, InterruptGrace: 30 * time.Second})
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Keys: s.Keys})
	for i := range n {
		if out, ans := c.exec(fmt.Sprintf("r-k%d", i), map[string]any{"code": fmt.Sprintf("x = %d\nopen('mine.txt', 'w').write('%d')", i, i)}); !out.OK {
			t.Fatalf("kernel %d: %d %s", i, ans.status, ans.body)
		}
	}
	if out, ans := c.exec("r-k-extra", map[string]any{"code": "x = 99"}); !out.OK {
		t.Fatalf("a third kernel at a quota of 2: %d %s, want r-k0's idle kernel reclaimed", ans.status, ans.body)
	}
	kernels := func(c *client) wire.KernelList {
		t.Helper()
		ans := c.do(http.MethodGet, "/kernels", "", nil)
		if ans.status != 200 {
			t.Fatalf("GET /kernels: %d %s", ans.status, ans.body)
		}
		var kl wire.KernelList
		ans.json(t, &kl)
		return kl
	}
	kl := kernels(c)
	var runs []string
	for _, k := range kl.Kernels {
		runs = append(runs, k.RunID)
		if k.Busy || k.CPUSeconds == nil || *k.CPUSeconds <= 0 || k.MemoryBytes == nil || *k.MemoryBytes <= 0 {
			t.Errorf("kernel %+v: want idle, with the container's CPU time and memory", k)
		}
	}
	if want := (wire.KernelQuota{Limit: n, Live: n}); kl.Quota != want || kl.Backend != "docker" || strings.Join(runs, ",") != "r-k1,r-k-extra" {
		t.Errorf("GET /kernels: quota %+v on %s, kernels of %v; want %+v on docker, r-k1 and r-k-extra", kl.Quota, kl.Backend, runs, want)
	}
	out, ans := c.exec("r-k0", map[string]any{"code": "print(open('mine.txt').read())\nx"})
	if out.Stdout != "0\n" || out.Error == nil || out.Error.Ename != "NameError" {
		t.Errorf("the reclaimed run's next cell: %d %s; want its file read and x gone", ans.status, ans.body)
	}
	cel := string(c.do(http.MethodGet, "/cel", "r-k0", nil).body)
	if sec := strings.Index(cel, "### Kernel state reclaimed"); sec < 0 || sec > strings.Index(cel, "## Step 2: ") || !strings.Contains(cel[sec:], "r-k-extra") {
		t.Errorf("the reclaimed run's journal does not say, before step 2, that its kernel went to r-k-extra:\n%s", cel)
	}

	// Both kernels busy: the next is refused, with what to do.
	type streamed struct {
		status int
		body   string
	}
	ended := map[string]chan streamed{}
	for _, run := range []string{"r-k0", "r-k-extra"} {
		ended[run] = make(chan streamed, 1)
		running := make(chan struct{})
		go func() {
			b, _ := json.Marshal(map[string]any{"code": "import time\nprint('running', flush=True)\ntime.sleep(3600)", "timeout_s": 7200})
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, c.url+"/sandbox/exec", strings.NewReader(string(b)))
			req.Header.Set(api.RunHeader, run)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Authorization", "Bearer "+c.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				close(running)
				ended[run] <- streamed{body: err.Error()}
				return
			}
			defer resp.Body.Close()
			var all strings.Builder
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			once := sync.Once{}
			for sc.Scan() {
				all.WriteString(sc.Text() + "\n")
				if sc.Text() == "event: stdout" {
					once.Do(func() { close(running) })
				}
			}
			once.Do(func() { close(running) })
			ended[run] <- streamed{status: resp.StatusCode, body: all.String()}
		}()
		<-running
	}
	if kl := kernels(c); kl.Quota.Busy != n {
		t.Fatalf("GET /kernels while both cells run: %+v, want %d busy", kl.Quota, n)
	}
	_, ans = c.exec("r-k-new", map[string]any{"code": "1"})
	e := wantErr(t, ans, 429, "quota")
	if !strings.Contains(e.Message, "in use") || !strings.Contains(e.Suggestion, "/kernels") || !strings.Contains(e.Suggestion, "--quota-kernels") {
		t.Errorf("quota answer %+v does not say the kernels are in use and how to free one", e)
	}
	// Another tenant sees none of them, cannot act on them, and has its
	// own quota.
	other := c.as(c.newKey("globex", auth.Runs))
	if kl := kernels(other); len(kl.Kernels) != 0 || kl.Quota.Live != 0 {
		t.Errorf("another tenant's GET /kernels: %+v, want none", kl)
	}
	wantErr(t, other.do(http.MethodDelete, "/kernels/r-k0", "", nil), 404, "not_found")
	if out, ans := other.exec("r-globex", map[string]any{"code": "1+1"}); !out.OK {
		t.Errorf("another tenant's first kernel: %d %s", ans.status, ans.body)
	}
	// A read-only key lists but does not act.
	reader := c.as(c.newKey(kl.Kernels[0].Tenant, auth.Read))
	if kl := kernels(reader); len(kl.Kernels) != n {
		t.Errorf("a read key's GET /kernels: %+v, want the tenant's %d kernels", kl, n)
	}
	wantErr(t, reader.do(http.MethodPost, "/kernels/r-k0/interrupt", "", nil), 403, "forbidden")

	// Interrupt one cell, stop the other kernel: both cells end.
	var act wire.KernelAction
	a := c.do(http.MethodPost, "/kernels/r-k0/interrupt", "", nil)
	a.json(t, &act)
	if a.status != 200 || !act.OK || act.Interrupted != 1 {
		t.Errorf("interrupt: %d %s, want one cell interrupted", a.status, a.body)
	}
	a = c.do(http.MethodDelete, "/kernels/r-k-extra", "", nil)
	if a.status != 200 {
		t.Errorf("stop: %d %s", a.status, a.body)
	}
	for run, ch := range ended {
		if got := <-ch; got.status != 200 || !strings.Contains(got.body, `"kind":"interrupted"`) {
			t.Errorf("%s's long cell: %d %s, want it interrupted", run, got.status, got.body)
		}
	}
	if out, ans := c.exec("r-k0", map[string]any{"code": "x = 5\nx"}); !out.OK {
		t.Errorf("r-k0 after its interrupt: %d %s", ans.status, ans.body)
	}
	if kl := kernels(c); kl.Quota.Live != 1 || kl.Kernels[0].RunID != "r-k0" {
		t.Errorf("after stopping r-k-extra's kernel: %+v, want only r-k0's", kl)
	}
	wantErr(t, c.do(http.MethodDelete, "/kernels/r-k-extra", "", nil), 404, "not_found")
	wantErr(t, c.do(http.MethodPost, "/kernels/not%20a%20run/restart", "", nil), 400, "invalid_run_id")
}
