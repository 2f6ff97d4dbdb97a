package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/triadhq/triad/api/e2b"
)

// E2B's snapshots, forks, metrics and getHost are the tenant's own: another
// tenant gets E2B's not-found answers (404 on the control plane, the
// proxy's 502 for getHost, the same as for a sandbox that does not
// exist); bad input gets E2B's error body with Triad's beside it, never a
// 5xx.
func TestE2BSnapshotsForksAreTheTenantsOwn(t *testing.T) {
	w := newWorld(t)
	a, b := w.tenant("acme"), w.tenant("globex")
	ctl := func(tn *tenant, method, path, body string) answer {
		return w.send(req{method, path, map[string]string{e2b.HeaderAPIKey: tn.key, "Content-Type": "application/json"}, body})
	}
	var snap struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}
	w.json(w.ok("snapshot", ctl(a, "POST", "/sandboxes/"+a.sandbox+"/snapshots", `{"name": "acme-snap"}`)), &snap)
	if snap.SnapshotID == "" || len(snap.Names) != 1 || snap.Names[0] != "acme-snap" {
		t.Fatalf("snapshot: got %+v", snap)
	}
	// B sees none of it.
	if ans := ctl(b, "GET", "/snapshots", ""); ans.status != 200 || bytes.Contains(ans.body, []byte(snap.SnapshotID)) {
		t.Errorf("B's listSnapshots: %d %s, want 200 without A's snapshot", ans.status, ans.body)
	}
	for _, p := range []struct{ method, path, body string }{
		{"POST", "/sandboxes", `{"templateID": "` + snap.SnapshotID + `"}`},
		{"DELETE", "/templates/" + snap.SnapshotID, ""},
		{"POST", "/sandboxes/" + a.sandbox + "/fork", `{}`},
		{"POST", "/sandboxes/" + a.sandbox + "/snapshots", `{}`},
		{"GET", "/sandboxes/" + a.sandbox + "/metrics", ""},
	} {
		ans := ctl(b, p.method, p.path, p.body)
		if p.path == "/sandboxes" {
			// A template B cannot see is a template that does not exist.
			if ans.status != 400 || bytes.Contains(ans.body, []byte("snapshot")) {
				t.Errorf("B creates from A's snapshot: got %d %s, want 400 as for an unknown template", ans.status, ans.body)
			}
			continue
		}
		if ans.status != 404 || !bytes.Contains(ans.body, []byte(`"not_found"`)) {
			t.Errorf("B %s %s: got %d %s, want 404 not_found", p.method, p.path, ans.status, ans.body)
		}
	}
	// getHost: B's token and B's key reach nothing of A's; the answer is
	// the one for a sandbox that does not exist, byte for byte but the id.
	host := "8000-" + a.sandbox + ".localhost"
	nobody := "8000-r-00000000-0000-0000-0000-000000000000.localhost"
	for _, hdr := range []map[string]string{{e2b.HeaderTrafficToken: b.token}, {e2b.HeaderAPIKey: b.key}, {}} {
		got := w.sendHost(host, hdr)
		want := w.sendHost(nobody, hdr)
		if got.status != 502 || want.status != 502 || !bytes.Equal(bytes.ReplaceAll(got.body, []byte(a.sandbox), []byte("X")),
			bytes.ReplaceAll(want.body, []byte("r-00000000-0000-0000-0000-000000000000"), []byte("X"))) {
			t.Errorf("getHost as B (%v): got %d %s, want %d %s", hdr, got.status, got.body, want.status, want.body)
		}
		var e struct{ Message string }
		if json.Unmarshal(got.body, &e) != nil || e.Message != "The sandbox was not found" {
			t.Errorf("getHost as B: %s, want E2B's message", got.body)
		}
	}

	// A's own: fork and create from the snapshot work (wasm: no kernel
	// needed), metrics answer (no kernel yet: nothing used).
	var forks []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
			Domain    string `json:"domain"`
		} `json:"sandbox"`
	}
	w.json(w.ok("fork", ctl(a, "POST", "/sandboxes/"+a.sandbox+"/fork", `{"count": 2}`)), &forks)
	if len(forks) != 2 || forks[0].Sandbox == nil || forks[1].Sandbox == nil || forks[0].Sandbox.SandboxID == forks[1].Sandbox.SandboxID {
		t.Fatalf("fork count 2: got %+v", forks)
	}
	if d := forks[0].Sandbox.Domain; !strings.HasPrefix(d, "localhost:") {
		t.Errorf("fork's domain %q, want localhost:<port> for a loopback listener", d)
	}
	w.ok("create from snapshot", ctl(a, "POST", "/sandboxes", `{"templateID": "`+snap.SnapshotID+`"}`))
	var ms []map[string]any
	w.json(w.ok("metrics", ctl(a, "GET", "/sandboxes/"+a.sandbox+"/metrics", "")), &ms)
	if len(ms) != 1 || ms[0]["memUsed"] != float64(0) || ms[0]["cpuCount"].(float64) < 1 {
		t.Errorf("metrics of a sandbox with no kernel: got %v, want one reading with nothing used", ms)
	}

	// Bad input: E2B's error body with Triad's, 4xx.
	for _, p := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/sandboxes/" + a.sandbox + "/fork", `{"count": 0}`, 400},
		{"POST", "/sandboxes/" + a.sandbox + "/fork", `{"count": 101}`, 400},
		{"POST", "/sandboxes/" + a.sandbox + "/fork", `{"count": "x"}`, 400},
		{"POST", "/sandboxes/" + a.sandbox + "/fork", `{"timeout": -1}`, 400},
		{"POST", "/sandboxes/" + a.sandbox + "/snapshots", `{"name": "no spaces"}`, 400},
		{"POST", "/sandboxes/" + a.sandbox + "/snapshots", `[`, 400},
		{"GET", "/sandboxes/" + a.sandbox + "/metrics?start=x", "", 400},
		{"GET", "/sandboxes/" + a.sandbox + "/metrics?start=10&end=5", "", 400},
		{"GET", "/snapshots?limit=0", "", 400},
		{"GET", "/snapshots?nextToken=r-nope", "", 400},
		{"DELETE", "/templates/not-a-snapshot", "", 404},
		{"POST", "/sandboxes/r-no-such/fork", `{}`, 404},
	} {
		ans := ctl(a, p.method, p.path, p.body)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Error   struct{ Kind, Message, Suggestion string }
		}
		if ans.status != p.status || json.Unmarshal(ans.body, &e) != nil || e.Code != p.status || e.Message == "" || e.Error.Kind == "" || e.Error.Suggestion == "" {
			t.Errorf("%s %s %s: got %d %s, want %d with E2B's and Triad's error", p.method, p.path, p.body, ans.status, ans.body, p.status)
		}
	}
	// Deleted: gone for A too.
	if ans := ctl(a, "DELETE", "/templates/"+snap.SnapshotID, ""); ans.status != 204 {
		t.Errorf("deleteSnapshot: got %d %s", ans.status, ans.body)
	}
	if ans := ctl(a, "DELETE", "/templates/"+snap.SnapshotID, ""); ans.status != 404 {
		t.Errorf("deleteSnapshot again: got %d %s, want 404", ans.status, ans.body)
	}
}

// sendHost sends a GET to a getHost host through the world's listener.
func (w *world) sendHost(host string, hdr map[string]string) answer {
	w.t.Helper()
	hr, err := http.NewRequestWithContext(w.t.Context(), "GET", w.url+"/", nil)
	if err != nil {
		w.t.Fatal(err)
	}
	hr.Host = host
	for k, v := range hdr {
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
