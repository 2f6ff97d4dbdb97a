package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// errBody returns the error body, failing unless it is one with a kind,
// message and suggestion.
func errBody(t testing.TB, a answer) wire.ErrorDetail {
	t.Helper()
	var e wire.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Kind == "" || e.Error.Message == "" || e.Error.Suggestion == "" {
		t.Fatalf("got %d %s, want {error:{kind,message,suggestion}}", a.status, a.body)
	}
	return e.Error
}

func wantErr(t testing.TB, a answer, status int, kind string) wire.ErrorDetail {
	t.Helper()
	e := errBody(t, a)
	if a.status != status || string(e.Kind) != kind {
		t.Fatalf("got %d %s, want %d %s", a.status, a.body, status, kind)
	}
	return e
}

// Keys: a request without a key, with a malformed, unknown or revoked one
// is 401 auth with a suggestion; a read key may read but gets 403 on the
// tools that change runs; an admin key manages keys over HTTP, and a key's
// last use shows in the listing.
func TestKeys(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	c.write("r-keys", "a.txt", "a")

	for name, key := range map[string]string{
		"missing":      "",
		"malformed":    "not-a-key",
		"unknown":      "trd_aaaaaaaaaaaa_" + strings.Repeat("a", 52),
		"wrong secret": c.key[:len(c.key)-52] + strings.Repeat("b", 52),
	} {
		a := c.as(key).do("GET", "/tmp/list", "r-keys", nil)
		e := wantErr(t, a, 401, "auth")
		if !strings.Contains(e.Suggestion, "trd_") && !strings.Contains(e.Suggestion, "triad keys") {
			t.Errorf("%s: suggestion %q names neither the key's form nor triad keys", name, e.Suggestion)
		}
		if !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: no WWW-Authenticate: Bearer on a 401", name)
		}
	}
	a := c.do("GET", "/tmp/list", "r-keys", nil, "Authorization", "Basic dXNlcjpwYXNz")
	wantErr(t, a, 401, "auth")

	// A read key reads, and is forbidden to change anything.
	read := c.as(c.newKey("acme", auth.Read))
	if a := read.do("GET", "/tmp/read?path=a.txt", "r-keys", nil); a.status != 200 {
		t.Fatalf("read key, tmp.read: got %d %s", a.status, a.body)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/sandbox/exec", `{"code":"1"}`},
		{"POST", "/tmp/write", `{"path":"x","text":"x"}`},
		{"POST", "/tmp/delete", `{"path":"a.txt"}`},
		{"PUT", "/tmp/files/x", "x"},
		{"POST", "/runs", ""},
		{"POST", "/runs/r-keys/share", `{"path":"a.txt"}`},
		{"GET", "/keys", ""},
	} {
		a := read.do(tc.method, tc.path, "r-keys", strings.NewReader(tc.body))
		if e := wantErr(t, a, 403, "forbidden"); !strings.Contains(e.Suggestion, "--scope") {
			t.Errorf("%s %s: suggestion %q does not say how to get the scope", tc.method, tc.path, e.Suggestion)
		}
	}
	// The run key may not manage keys either.
	wantErr(t, c.do("GET", "/keys", "", nil), 403, "forbidden")

	// Keys over HTTP with an admin key: create, use, list with last use,
	// revoke.
	admin := c.as(c.newKey("ops", auth.Admin))
	a = admin.post("/keys", "", map[string]any{"name": "analyst", "tenant": "acme", "scopes": []string{"read"}})
	if a.status != 201 {
		t.Fatalf("POST /keys: %d %s", a.status, a.body)
	}
	var nk wire.NewKey
	a.json(t, &nk)
	if !strings.HasPrefix(nk.Token, "trd_"+nk.Key.ID+"_") || nk.Key.Tenant != "acme" || nk.Key.LastUsed != nil {
		t.Fatalf("new key: %+v", nk)
	}
	if a := c.as(nk.Token).do("GET", "/tmp/list", "r-keys", nil); a.status != 200 {
		t.Fatalf("the new key: %d %s", a.status, a.body)
	}
	var list wire.KeyList
	admin.do("GET", "/keys", "", nil).json(t, &list)
	found := false
	for _, k := range list.Keys {
		if k.ID == nk.Key.ID {
			found = true
			if k.LastUsed == nil {
				t.Errorf("key %s was used but lists no last use", k.ID)
			}
		}
		if strings.Contains(string(admin.do("GET", "/keys", "", nil).body), nk.Token[len(nk.Token)-52:]) {
			t.Fatal("GET /keys shows a key's secret")
		}
	}
	if !found {
		t.Fatalf("GET /keys lacks the new key: %+v", list)
	}
	if a := admin.do("DELETE", "/keys/"+nk.Key.ID, "", nil); a.status != 200 {
		t.Fatalf("DELETE /keys: %d %s", a.status, a.body)
	}
	e := wantErr(t, c.as(nk.Token).do("GET", "/tmp/list", "r-keys", nil), 401, "auth")
	if !strings.Contains(e.Message, "revoked") {
		t.Errorf("revoked key: message %q does not say so", e.Message)
	}
	wantErr(t, admin.do("DELETE", "/keys/nosuchkey123", "", nil), 404, "not_found")
	// Public routes need no key.
	for _, p := range []string{"/healthz", "/version", "/openapi.json"} {
		if a := c.as("").do("GET", p, "", nil); a.status != 200 {
			t.Errorf("GET %s without a key: %d", p, a.status)
		}
	}
}

// A server on loopback with no key at all runs open (every caller is the
// operator); once a key exists, it needs one.
func TestOpenUntilFirstKey(t *testing.T) {
	store := localBackend(t).open(t)
	ks := keys.New(store.Meta(), keys.Config{CacheTTL: time.Millisecond})
	orch := orchestrator.New(orchestrator.Config{Store: store})
	t.Cleanup(func() { orch.Close() })
	h := api.New(api.Config{Orchestrator: orch, Keys: ks, OpenWithoutKeys: true})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &client{t: t, url: srv.URL, h: h, keys: ks}
	if a := c.post("/tmp/write", "r-open", map[string]string{"path": "a", "text": "a"}); a.status != 200 {
		t.Fatalf("open server, no key: %d %s", a.status, a.body)
	}
	tok := c.newKey("default", auth.Runs)
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := c.do("GET", "/tmp/list", "r-open", nil)
		if a.status == 401 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the first key, a request without one still gets %d", a.status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The operator's run belongs to the default tenant, which the key is in.
	if a := c.as(tok).do("GET", "/tmp/read?path=a", "r-open", nil); a.status != 200 {
		t.Fatalf("the default tenant's key reads the operator's run: %d %s", a.status, a.body)
	}
}

// A key revoked through one server is refused by another server sharing
// the same S3 bucket within 5 s.
func TestRevokedKeyOnSecondServer(t *testing.T) {
	srv := miniotest.Shared(t)
	b := s3Backend(t, srv)
	one := newServer(t, b.open(t), orchestrator.Limits{})
	two := newServer(t, b.open(t), orchestrator.Limits{})
	admin := one.as(one.newKey("ops", auth.Admin))
	a := admin.post("/keys", "", map[string]any{"name": "shared", "scopes": []string{"runs"}})
	var nk wire.NewKey
	a.json(t, &nk)
	user := two.as(nk.Token)
	if a := user.write("r-replica", "x.txt", "x"); a.Path != "x.txt" {
		t.Fatalf("key made on server one, used on two: %+v", a)
	}
	if a := admin.do("DELETE", "/keys/"+nk.Key.ID, "", nil); a.status != 200 {
		t.Fatalf("revoke on server one: %d %s", a.status, a.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := user.do("GET", "/tmp/list", "r-replica", nil)
		if a.status == 401 {
			if e := errBody(t, a); e.Kind != "auth" || !strings.Contains(e.Message, "revoked") {
				t.Fatalf("got %s, want auth: revoked", a.body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server two still accepts the key 5 s after server one revoked it (last answer %d)", a.status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Every answer carries the security headers; HSTS only over TLS.
func TestSecurityHeaders(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	tls := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t)}), TLS: true})
	for name, a := range map[string]answer{
		"200":        c.do("GET", "/healthz", "", nil),
		"401":        c.as("").do("GET", "/tmp/list", "r-h", nil),
		"404 route":  c.do("GET", "/nope", "", nil),
		"405":        c.do("DELETE", "/tmp/list", "r-h", nil),
		"file":       c.do("GET", "/tmp/files/"+c.write("r-h", "page.html", "<script>alert(1)</script>").Path, "r-h", nil),
		"tls answer": tls.do("GET", "/version", "", nil),
	} {
		h := a.header
		for k, want := range map[string]string{
			"X-Content-Type-Options": "nosniff",
			"X-Frame-Options":        "DENY",
			"Referrer-Policy":        "no-referrer",
		} {
			if h.Get(k) != want {
				t.Errorf("%s: %s is %q, want %q", name, k, h.Get(k), want)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "sandbox") {
			t.Errorf("%s: Content-Security-Policy is %q", name, csp)
		}
		if hsts := h.Get("Strict-Transport-Security"); (name == "tls answer") != (hsts != "") {
			t.Errorf("%s: Strict-Transport-Security is %q", name, hsts)
		}
	}
}

// The blob rule (issue 12's existence oracle): without a run that holds
// it, HEAD and GET /blobs/<sha> are 404, byte for byte the same whether or
// not the blob exists, and the blob store is not touched; with one, they
// work. With authentication on and off.
func TestBlobsNeedARunThatHoldsThem(t *testing.T) {
	for _, mode := range []string{"keys", "none"} {
		t.Run(mode, func(t *testing.T) {
			// The store's seams are counted, to show a refused request
			// never reaches the blob store.
			m := metrics.New()
			dir := t.TempDir()
			lb, err := local.NewBlobs(dir)
			if err != nil {
				t.Fatal(err)
			}
			lx, err := local.NewIndex(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lx.Close() })
			cb, cx := m.Store("local", lb, lx)
			orch := orchestrator.New(orchestrator.Config{Store: tmpfs.New(cb, cx, nil)})
			c := apiServer(t, api.Config{Orchestrator: orch})
			if mode == "none" {
				h := api.New(api.Config{Orchestrator: orch})
				srv := httptest.NewServer(h)
				t.Cleanup(srv.Close)
				c = &client{t: t, url: srv.URL, h: h}
			}
			blobOps := func() float64 {
				fams, _ := m.Registry().Gather()
				n := 0.0
				for _, f := range fams {
					for _, s := range f.Metric {
						for _, l := range s.Label {
							if f.GetName() == "triad_store_operations_total" && l.GetName() == "op" && strings.HasPrefix(l.GetValue(), "blob_") {
								n += s.Counter.GetValue()
							}
						}
					}
				}
				return n
			}
			secret := c.write("r-holder", "pin.txt", "4711")
			c.write("r-other", "other.txt", "x")
			absent := tmpfs.DigestOf([]byte("4712"))
			opsBefore := blobOps()
			var first answer
			for _, method := range []string{"GET", "HEAD"} {
				for _, tc := range []struct {
					name string
					d    tmpfs.Digest
					run  string
				}{
					{"stored, no run", secret.SHA256, ""},
					{"absent, no run", absent, ""},
					{"stored, bad run id", secret.SHA256, "bad/id"},
					{"stored, run without it", secret.SHA256, "r-other"},
					{"absent, run without it", absent, "r-other"},
					{"stored, unknown run", secret.SHA256, "r-nobody"},
					{"absent, holder run", absent, "r-holder"},
				} {
					a := c.do(method, "/blobs/"+tc.d.String(), tc.run, nil)
					if a.status != 404 {
						t.Fatalf("%s %s: got %d %s, want 404", method, tc.name, a.status, a.body)
					}
					if method == "HEAD" {
						continue
					}
					if first.body == nil {
						first = a
						wantErr(t, a, 404, "not_found")
					}
					if !bytes.Equal(a.body, first.body) || a.header.Get("Content-Length") != first.header.Get("Content-Length") ||
						a.header.Get("Content-Type") != first.header.Get("Content-Type") {
						t.Errorf("%s %s: %q differs from %q", method, tc.name, a.body, first.body)
					}
				}
			}
			if n := blobOps() - opsBefore; n != 0 {
				t.Errorf("refused blob requests made %v blob store operations, want none", n)
			}
			a := c.do("GET", "/blobs/"+secret.SHA256.String(), "r-holder", nil)
			if a.status != 200 || string(a.body) != "4711" {
				t.Fatalf("GET with the holder run: %d %q", a.status, a.body)
			}
			if a := c.do("HEAD", "/blobs/"+secret.SHA256.String(), "r-holder", nil); a.status != 200 || a.header.Get("Content-Length") != "4" {
				t.Fatalf("HEAD with the holder run: %d %v", a.status, a.header)
			}
		})
	}
}

// Share links: they download without a key; expired, revoked, tampered
// and out-of-prefix links, and other tenants' revocations, are 404.
func TestShareLinks(t *testing.T) {
	store := localBackend(t).open(t)
	var clock atomic.Int64 // seconds the links' clock is ahead of the wall's
	now := func() time.Time { return time.Now().Add(time.Duration(clock.Load()) * time.Second) }
	links, err := share.Open(context.Background(), store.Meta(), share.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	c := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: store}), Shares: links})
	const run = "r-share"
	c.write(run, "artifacts/report.html", "<h1>report</h1>")
	c.write(run, "artifacts/data/q1.csv", "a,b\n1,2\n")
	c.write(run, "secret.txt", "not shared")
	anon := c.as("")

	share := func(body map[string]any) wire.Share {
		t.Helper()
		a := c.post("/runs/"+run+"/share", "", body)
		if a.status != 201 {
			t.Fatalf("share %v: %d %s", body, a.status, a.body)
		}
		var s wire.Share
		a.json(t, &s)
		return s
	}
	get := func(url string) answer {
		t.Helper()
		return anon.do("GET", strings.TrimPrefix(url, c.url), "", nil)
	}
	one := share(map[string]any{"path": "artifacts/report.html"})
	if a := get(one.URL); a.status != 200 || string(a.body) != "<h1>report</h1>" || !strings.HasPrefix(a.header.Get("Content-Type"), "text/html") ||
		!strings.Contains(a.header.Get("Content-Security-Policy"), "sandbox") {
		t.Fatalf("path link: %d %q %v", a.status, a.body, a.header)
	}
	pre := share(map[string]any{"prefix": "artifacts/", "ttl": "2h"})
	if exp := time.Until(pre.Expires); exp < time.Hour || exp > 3*time.Hour {
		t.Errorf("ttl 2h: expires in %s", exp)
	}
	a := get(pre.URL)
	var files wire.SharedFiles
	a.json(t, &files)
	if a.status != 200 || a.header.Get("Content-Type") != api.SharedFilesType || len(files.Files) != 2 {
		t.Fatalf("prefix link: %d %s", a.status, a.body)
	}
	for _, f := range files.Files {
		if a := get(f.URL); a.status != 200 || int64(len(a.body)) != f.Size {
			t.Errorf("%s through the link: %d", f.Path, a.status)
		}
	}

	var gone answer
	check := func(name, url string) {
		t.Helper()
		a := get(url)
		if a.status != 404 {
			t.Fatalf("%s: got %d %s, want 404", name, a.status, a.body)
		}
		if gone.body == nil {
			gone = a
			wantErr(t, a, 404, "not_found")
		} else if !bytes.Equal(a.body, gone.body) {
			t.Errorf("%s: body %s differs from %s", name, a.body, gone.body)
		}
	}
	check("outside the prefix", pre.URL+"/secret.txt")
	check("escaping the prefix", pre.URL+"/artifacts/../secret.txt")
	check("another path of a path link", one.URL+"/secret.txt")
	tampered := []byte(one.URL)
	if tampered[len(tampered)-1] == 'A' {
		tampered[len(tampered)-1] = 'B'
	} else {
		tampered[len(tampered)-1] = 'A'
	}
	check("tampered signature", string(tampered))
	check("made up", c.url+"/share/v1.aaaaaaaaaaaaaaaa.9999999999.abc")

	// Another tenant can neither revoke nor see the link.
	other := c.as(c.newKey("globex", auth.Runs))
	wantErr(t, other.do("DELETE", "/shares/"+one.ID, "", nil), 404, "not_found")
	wantErr(t, other.post("/runs/"+run+"/share", "", map[string]any{"path": "secret.txt"}), 404, "not_found")
	if a := get(one.URL); a.status != 200 {
		t.Fatalf("the link stopped working after another tenant's attempt: %d", a.status)
	}
	if a := c.do("DELETE", "/shares/"+one.ID, "", nil); a.status != 200 {
		t.Fatalf("revoke: %d %s", a.status, a.body)
	}
	check("revoked", one.URL)
	wantErr(t, c.do("DELETE", "/shares/"+one.ID, "", nil), 404, "not_found")

	short := share(map[string]any{"path": "secret.txt", "ttl": "1m"})
	if a := get(short.URL); a.status != 200 {
		t.Fatalf("fresh one-minute link: %d", a.status)
	}
	clock.Store(61) // a minute and a second later, by the links' clock
	check("expired", short.URL)
	clock.Store(0)
	wantErr(t, c.post("/runs/"+run+"/share", "", map[string]any{"path": "secret.txt", "ttl": "1s"}), 400, "bad_input")

	for _, body := range []map[string]any{
		{}, {"path": "a", "prefix": "b/"}, {"path": "nope.txt"}, {"path": "../x"}, {"prefix": "artifacts/", "ttl": "forever"},
		{"prefix": "artifacts/", "ttl": "-1h"}, {"prefix": "artifacts/", "ttl": "9000h"},
	} {
		if a := c.post("/runs/"+run+"/share", "", body); a.status != 400 && a.status != 404 {
			t.Errorf("share %v: got %d %s, want 400 or 404", body, a.status, a.body)
		}
	}
}

// GET /runs lists the caller's runs, newest first, a page at a time, from
// the tenant's run index; another tenant's runs are not in it.
func TestRunsList(t *testing.T) {
	store := localBackend(t).open(t)
	c := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store)})})
	var mine []string
	for i := range 5 {
		run := "r-list-" + string(rune('a'+i))
		c.write(run, "f.txt", "x")
		mine = append(mine, run)
	}
	c.write(mine[4], "g.txt", "y") // the newest run has two steps
	other := c.as(c.newKey("globex", auth.Runs))
	other.write("r-theirs", "f.txt", "x")

	var got []wire.RunSummary
	cursor := ""
	for pages := 0; ; pages++ {
		q := "/runs?limit=2"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		var page wire.RunList
		a := c.do("GET", q, "", nil)
		a.json(t, &page)
		if a.status != 200 || len(page.Runs) > 2 || pages > 5 {
			t.Fatalf("GET %s: %d %s", q, a.status, a.body)
		}
		got = append(got, page.Runs...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(got) != 5 {
		t.Fatalf("got %d runs, want 5: %+v", len(got), got)
	}
	for i, s := range got {
		if want := mine[4-i]; s.RunID != want {
			t.Errorf("run %d: got %s, want %s (newest first)", i, s.RunID, want)
		}
		if s.Status != "open" || s.StartedBy.Tenant != "acme" || s.StartedBy.KeyID == "" || s.Created.IsZero() || s.LastVerdict == "" {
			t.Errorf("summary %+v lacks status, owner, creation or verdict", s)
		}
	}
	if got[0].Steps != 2 || got[1].Steps != 1 {
		t.Errorf("steps: got %d and %d, want 2 and 1", got[0].Steps, got[1].Steps)
	}
	var theirs wire.RunList
	other.do("GET", "/runs", "", nil).json(t, &theirs)
	if len(theirs.Runs) != 1 || theirs.Runs[0].RunID != "r-theirs" {
		t.Fatalf("globex's list: %+v", theirs)
	}
	wantErr(t, c.do("GET", "/runs?tenant=globex", "", nil), 403, "forbidden")
	admin := c.as(c.newKey("ops", auth.Admin))
	var viaAdmin wire.RunList
	admin.do("GET", "/runs?tenant=globex", "", nil).json(t, &viaAdmin)
	if len(viaAdmin.Runs) != 1 {
		t.Fatalf("admin listing globex: %+v", viaAdmin)
	}
	wantErr(t, c.do("GET", "/runs?cursor=../../x", "", nil), 400, "bad_input")
	wantErr(t, c.do("GET", "/runs?limit=0", "", nil), 400, "bad_input")

	// GET /runs/{id} says who started the run.
	var v wire.RunView
	c.do("GET", "/runs/"+mine[0], "", nil).json(t, &v)
	if v.StartedBy == nil || v.StartedBy.Tenant != "acme" || v.StartedBy.KeyID != got[0].StartedBy.KeyID || v.Created == nil {
		t.Fatalf("GET /runs/{id}: started_by %+v", v.StartedBy)
	}
}

// Audit: every trace record carries the caller's key id and tenant, never
// the key itself.
func TestAuditRecords(t *testing.T) {
	store := localBackend(t).open(t)
	o := orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store)})
	c := apiServer(t, api.Config{Orchestrator: o})
	c.write("r-audit", "a.txt", "a")
	c.do("GET", "/tmp/list", "r-audit", nil)
	p, err := c.keys.Authenticate(context.Background(), c.key)
	if err != nil {
		t.Fatal(err)
	}
	// The store directly: wait for the last call's recording first.
	if err := o.Settle(context.Background(), runid.Must("r-audit")); err != nil {
		t.Fatal(err)
	}
	b, _, err := store.ReadAll(context.Background(), runid.Must("r-audit"), "trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("trace has %d records, want 2", len(lines))
	}
	for _, l := range lines {
		var tr orchestrator.TraceRecord
		if err := json.Unmarshal(l, &tr); err != nil {
			t.Fatal(err)
		}
		if tr.KeyID != p.KeyID || tr.Tenant != "acme" {
			t.Errorf("trace record %s: key %q tenant %q, want %s acme", l, tr.KeyID, tr.Tenant, p.KeyID)
		}
	}
	if bytes.Contains(b, []byte(c.key[len(c.key)-52:])) {
		t.Error("the trace holds the key's secret")
	}
}

// Quotas on stored bytes and runs per hour: over the limit is 429 quota,
// naming the limit and what to do; the tenant's other work goes on.
func TestByteAndRunQuotas(t *testing.T) {
	store := localBackend(t).open(t)
	c := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: store,
		Quotas: orchestrator.Quotas{StoredBytes: 4 << 10, RunsPerHour: 3}})})
	big := strings.Repeat("x", 1500)
	c.write("r-q1", "a.txt", big)
	c.write("r-q1", "b.txt", big)
	a := c.post("/tmp/write", "r-q1", map[string]string{"path": "c.txt", "text": big})
	if e := wantErr(t, a, 429, "quota"); !strings.Contains(e.Message, "stored-bytes") || !strings.Contains(e.Suggestion, "tmp.delete") {
		t.Errorf("byte quota: %+v", e)
	}
	if a := c.post("/tmp/delete", "r-q1", map[string]string{"path": "a.txt"}); a.status != 200 {
		t.Fatalf("delete over the quota: %d %s", a.status, a.body)
	}
	// The usage is re-read within a second.
	deadline := time.Now().Add(5 * time.Second)
	for c.post("/tmp/write", "r-q1", map[string]string{"path": "c.txt", "text": big}).status != 200 {
		if time.Now().After(deadline) {
			t.Fatal("a write still refused 5 s after a delete made room")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.write("r-q2", "x", "x")
	c.write("r-q3", "x", "x")
	e := wantErr(t, c.post("/tmp/write", "r-q4", map[string]string{"path": "x", "text": "x"}), 429, "quota")
	if !strings.Contains(e.Message, "runs in the last hour") || !strings.Contains(e.Suggestion, "--quota-runs-per-hour") {
		t.Errorf("runs quota: %+v", e)
	}
	c.write("r-q2", "y", "y") // an existing run goes on
	// Another tenant has its own count.
	c.as(c.newKey("globex", auth.Runs)).write("r-g1", "x", "x")
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
