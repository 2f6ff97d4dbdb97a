package e2b_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// mainSandbox is a sandbox record exactly as Triad wrote it before issue
// 23 (e2b.Sandbox of that time, marshalled whole): the owner beside the
// envs, in plain text.
type mainSandbox struct {
	ID          runid.ID          `json:"id"`
	Template    string            `json:"template"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Envs        map[string]string `json:"envs,omitempty"`
	TimeoutS    int64             `json:"timeout_s"`
	StartedAt   time.Time         `json:"started_at"`
	EndAt       time.Time         `json:"end_at"`
	State       string            `json:"state"`
	TokenSHA256 []string          `json:"token_sha256"`
	Owner       *auth.Principal   `json:"owner,omitempty"`
}

// TestMigrateRecords writes sandbox records the way Triad did before issue
// 23 (files of the reserved run, which a default-tenant key had adopted
// through the tools, with owners and envs in plain text) and starts the
// surface over them: every record moves into the store's records, its
// envs sealed; each sandbox's run is its recorded creator's in the core; a
// sandbox whose run another tenant had claimed is dropped; and the old run
// is gone: no files, no owner, no index entry, and every tool refuses it.
func TestMigrateRecords(t *testing.T) {
	st := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	acme := auth.Principal{KeyID: "k-acme", Name: "acme's key", Tenant: "acme", Scopes: []auth.Scope{auth.Runs}}
	globex := auth.Principal{KeyID: "k-globex", Name: "globex's key", Tenant: "globex", Scopes: []auth.Scope{auth.Runs}}
	legacy := tmpfsrecords.New(st.Store)
	now := time.Now().UTC().Truncate(time.Second)
	token := func(id runid.ID) string { return "e2b_at_token_of_" + id.String() }
	put := func(owner *auth.Principal, envs map[string]string) runid.ID {
		id := runid.New()
		sum := sha256.Sum256([]byte(token(id)))
		b, err := json.Marshal(mainSandbox{ID: id, Template: "code-interpreter-v1", Envs: envs, TimeoutS: 3600, StartedAt: now,
			EndAt: now.Add(time.Hour), State: e2b.StateRunning, TokenSHA256: []string{hex.EncodeToString(sum[:])}, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		if err := legacy.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
		return id
	}
	called := put(&acme, map[string]string{"DB_PASSWORD": "hunter2-secret"}) // acme made calls: the core knows the run
	if err := st.Orch.Create(auth.With(ctx, acme), called); err != nil {
		t.Fatal(err)
	}
	fresh := put(&acme, nil)  // never called: only the surface knew its owner
	operator := put(nil, nil) // made before owners: the operator's
	taken := put(&acme, nil)  // claimed by globex through the hole
	if err := st.Orch.Create(auth.With(ctx, globex), taken); err != nil {
		t.Fatal(err)
	}
	// A key of the default tenant had touched the reserved run, which
	// adopted it: an owner record and an entry in the tenant's run index.
	old := legacy.Run()
	created := now.Add(-time.Hour)
	meta := st.Store.Meta()
	ow, _ := json.Marshal(map[string]any{"run": old.String(), "tenant": auth.DefaultTenant, "name": "before tenants", "created": created})
	if _, err := meta.PutMeta(ctx, "owners/"+old.String(), ow, tmpfs.Cond{}); err != nil {
		t.Fatal(err)
	}
	idx := fmt.Sprintf("tenants/%s/runs/%019d-%s", auth.DefaultTenant, math.MaxInt64-created.UnixNano(), old)
	sum, _ := json.Marshal(wire.RunSummary{RunID: old.String(), Status: "open", Created: created, Updated: created})
	if _, err := meta.PutMeta(ctx, idx, sum, tmpfs.Cond{}); err != nil {
		t.Fatal(err)
	}

	start := func() *harness {
		t.Helper()
		e, err := e2b.New(ctx, e2b.Config{Core: st.Orch, Records: metarecords.New(meta), Sealer: sealer(t, st), Legacy: legacy,
			Authorize: func(r *http.Request) (auth.Principal, bool) {
				switch r.Header.Get(e2b.HeaderAPIKey) {
				case "acme":
					return acme, true
				case "globex":
					return globex, true
				}
				return auth.Operator, true
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		srv := httptest.NewServer(e.Handler(api.New(api.Config{Orchestrator: st.Orch})))
		t.Cleanup(srv.Close)
		return &harness{url: srv.URL, stack: st, e2b: e}
	}
	h := start()

	// The records moved, sealed; the claimed sandbox's did not.
	recs, err := metarecords.New(meta).All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("migrated records: got %d, want 3", len(recs))
	}
	for _, r := range recs {
		if strings.Contains(string(r), "hunter2") || strings.Contains(string(r), "DB_PASSWORD") || strings.Contains(string(r), "owner") {
			t.Errorf("a migrated record shows an env or an owner: %s", r)
		}
	}
	if b, err := legacy.All(ctx); err != nil || len(b) != 0 {
		t.Errorf("legacy records left: %d, %v", len(b), err)
	}

	// The old run is gone: no files, no owner, not in the tenant's runs.
	if files, err := st.Store.List(ctx, old, ""); err != nil || len(files) != 0 {
		t.Errorf("the old run's files: %d, %v", len(files), err)
	}
	for _, k := range []string{"owners/" + old.String(), idx} {
		if _, _, err := meta.GetMeta(ctx, k); err == nil {
			t.Errorf("%s is still in the store", k)
		}
	}
	list, err := st.Orch.Runs(ctx, orchestrator.RunsQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Runs {
		if r.RunID == old.String() {
			t.Error("the default tenant still lists the old run")
		}
	}

	// Each sandbox's run is its creator's, as the core decides.
	for _, c := range []struct {
		run  runid.ID
		who  auth.Principal
		sees bool
	}{{called, acme, true}, {called, globex, false}, {fresh, acme, true}, {fresh, globex, false},
		{operator, auth.Operator, true}, {operator, acme, false}, {taken, globex, true}, {taken, acme, false}} {
		if err := st.Orch.Visible(auth.With(ctx, c.who), c.run); (err == nil) != c.sees {
			t.Errorf("run %s as %s: visible=%v, want %v", c.run, c.who.Tenant, err == nil, c.sees)
		}
	}
	// The surface serves the moved sandboxes to their tenant, and runs
	// their cells with their envs, opened from the sealed record.
	for key, want := range map[string]int{"acme": 200, "globex": 404} {
		if code, _, b := h.do(t, http.MethodGet, "/sandboxes/"+called.String(), map[string]string{"X-API-Key": key}, nil); code != want {
			t.Errorf("getInfo of a moved sandbox as %s: got %d %s, want %d", key, code, b, want)
		}
	}
	if code, _, b := h.do(t, http.MethodGet, "/sandboxes/"+taken.String(), map[string]string{"X-API-Key": "acme"}, nil); code != 404 {
		t.Errorf("getInfo of the dropped sandbox: got %d %s, want 404", code, b)
	}
	sb := sandbox{SandboxID: called.String(), EnvdAccessToken: token(called)}
	_, lines := h.execute(t, sb, map[string]any{"code": "import os\nos.environ.get('DB_PASSWORD')"})
	if r := find(lines, "result"); len(r) != 1 || r[0]["text"] != "hunter2-secret" {
		t.Errorf("a cell of a moved sandbox: got %v, want its env", lines)
	}

	// No tool reaches the old run, for any key: Triad's own ids are
	// refused to every caller, whether or not such a run exists.
	for _, p := range []auth.Principal{auth.Operator, {KeyID: "k-default", Tenant: auth.DefaultTenant, Scopes: []auth.Scope{auth.Runs}}} {
		pctx := auth.With(ctx, p)
		text := "{}"
		var errs []error
		_, err := st.Orch.List(pctx, old, "")
		errs = append(errs, err)
		_, err = st.Orch.Read(pctx, old, "sandboxes/"+called.String()+".json")
		errs = append(errs, err)
		_, err = st.Orch.Write(pctx, old, wire.WriteRequest{Path: "sandboxes/x.json", Text: &text})
		errs = append(errs, err)
		_, err = st.Orch.Delete(pctx, old, "sandboxes/"+called.String()+".json")
		errs = append(errs, err)
		for i, err := range errs {
			if fe := fault.As(err); fe == nil || fe.Kind != fault.InvalidRun {
				t.Errorf("tool %d on the old run as %s: got %v, want invalid_run_id", i, p.Name, err)
			}
		}
	}
	if files, _ := st.Store.List(ctx, old, ""); len(files) != 0 {
		t.Errorf("a tool wrote into the old run: %v", files)
	}

	// A second start finds nothing to move and keeps the records.
	h.e2b.Close()
	h2 := start()
	if recs, err := metarecords.New(meta).All(ctx); err != nil || len(recs) != 3 {
		t.Fatalf("records after a second start: %d, %v", len(recs), err)
	}
	if code, _, b := h2.do(t, http.MethodGet, "/sandboxes/"+fresh.String(), map[string]string{"X-API-Key": "acme"}, nil); code != 200 {
		t.Errorf("getInfo after a second start: got %d %s", code, b)
	}
}
