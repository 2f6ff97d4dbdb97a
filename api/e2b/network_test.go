package e2b_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/wire"
)

// TestNetworkOptions: create maps templateID onto Triad's templates (base
// and code-interpreter-v1 are the default; an unknown one is a 400 naming
// the server's) and allow_internet_access and network.allowOut/denyOut
// onto the template's egress policy (beyond it, a clear 4xx); getInfo's
// allowInternetAccess says whether the sandbox reaches anything.
func TestNetworkOptions(t *testing.T) {
	pol, err := egress.Compile(wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "pypi.org"}, {Host: "*.pythonhosted.org"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := orchestratortest.New(t, orchestratortest.Options{Templates: template.NewSet(&template.Template{Name: "net", Egress: pol}), Egress: egress.New(egress.Config{})})
	// A key with the runs scope: an admin could widen a template's policy.
	e, err := e2b.New(t.Context(), e2b.Config{Core: st.Orch, Records: tmpfsrecords.New(st.Store),
		Authorize: func(r *http.Request) (auth.Principal, bool) {
			return auth.Principal{KeyID: "k", Tenant: auth.DefaultTenant, Scopes: []auth.Scope{auth.Runs}}, r.Header.Get(e2b.HeaderAPIKey) == apiKey
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	srv := httptest.NewServer(e.Handler(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	h := &harness{url: srv.URL}
	for _, tc := range []struct {
		name     string
		body     string
		status   int
		internet bool
		says     string
	}{
		{"base", `{"templateID": "base"}`, 201, false, ""},
		{"code interpreter", `{"templateID": "code-interpreter-v1", "allow_internet_access": true}`, 201, false, ""},
		{"unknown", `{"templateID": "my-template"}`, 400, false, "default, net"},
		{"net", `{"templateID": "net"}`, 201, true, ""},
		{"net, internet off", `{"templateID": "net", "allow_internet_access": false}`, 201, false, ""},
		{"net, allowOut within", `{"templateID": "net", "network": {"allowOut": ["pypi.org", "files.pythonhosted.org"], "denyOut": ["0.0.0.0/0"]}}`, 201, true, ""},
		{"net, deny all", `{"templateID": "net", "network": {"denyOut": ["0.0.0.0/0"]}}`, 201, false, ""},
		{"net, allowOut beyond", `{"templateID": "net", "network": {"allowOut": ["evil.example"], "denyOut": ["0.0.0.0/0"]}}`, 403, false, "evil.example is not allowed by the template's policy"},
		{"net, allowOut address", `{"templateID": "net", "network": {"allowOut": ["1.1.1.1"]}}`, 422, false, "allowed by name"},
		{"base, allowOut", `{"templateID": "base", "network": {"allowOut": ["pypi.org"]}}`, 403, false, "it allows nothing"},
	} {
		code, _, b := h.do(t, http.MethodPost, "/sandboxes", map[string]string{"X-API-Key": apiKey, "Content-Type": "application/json"}, strings.NewReader(tc.body))
		if code != tc.status || !strings.Contains(string(b), tc.says) {
			t.Errorf("%s: got %d %s, want %d saying %q", tc.name, code, b, tc.status, tc.says)
			continue
		}
		if code != 201 {
			continue
		}
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		json.Unmarshal(b, &sb)
		_, _, b = h.do(t, http.MethodGet, "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": apiKey}, nil)
		var info struct {
			AllowInternetAccess bool `json:"allowInternetAccess"`
		}
		json.Unmarshal(b, &info)
		if info.AllowInternetAccess != tc.internet {
			t.Errorf("%s: getInfo says allowInternetAccess %v, want %v", tc.name, info.AllowInternetAccess, tc.internet)
		}
	}
}
