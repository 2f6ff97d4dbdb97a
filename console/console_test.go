package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/console"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// site is a console in front of a stand-in for the API, over a real
// store, orchestrator, key store and sessions.
type site struct {
	url  string
	orch *orchestrator.Orchestrator
	keys *keys.Store
}

func newSite(t *testing.T, cfg console.Config, withKeys bool) *site {
	t.Helper()
	dir := t.TempDir()
	b, err := local.NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err := local.NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	orch := orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store)})
	// Closed before the store: its index writer stops, and writes what
	// calls left pending, while the directory is still there.
	t.Cleanup(func() { orch.Close() })
	cfg.Orchestrator = orch
	if withKeys {
		cfg.Keys = keys.New(store.Meta(), keys.Config{})
		cfg.Sessions = session.New(store.Meta(), cfg.Keys, session.Config{})
	}
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, `{"api":true}`)
	})
	srv := httptest.NewServer(con.Handler(api))
	t.Cleanup(srv.Close)
	return &site{url: srv.URL, orch: orch, keys: cfg.Keys}
}

// client is an HTTP client with cookies that does not follow redirects.
func client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, c *http.Client, u string) answer {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func post(t *testing.T, c *http.Client, u string, form url.Values) answer {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([a-z2-7]+)"`)

func csrfOf(t *testing.T, p answer) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", p.body)
	}
	return m[1]
}

// Sign-in takes an API key into a server-side session: a wrong key is
// refused with the reason, the form is CSRF-protected, the cookie is an
// HttpOnly, SameSite=Strict session id (never the key), a redirect stays
// on the server, and sign-out needs the session's CSRF token.
func TestSignIn(t *testing.T) {
	s := newSite(t, console.Config{}, true)
	tok, _, err := s.keys.Create(context.Background(), "alice", "acme", []auth.Scope{auth.Runs})
	if err != nil {
		t.Fatal(err)
	}
	c := client(t)
	p := get(t, c, s.url+"/")
	if p.status != 303 || p.header.Get("Location") != "/console/signin?next=%2F" {
		t.Fatalf("GET / without a session: %d %s", p.status, p.header.Get("Location"))
	}
	form := get(t, c, s.url+"/console/signin?next=/console/launch")
	if form.status != 200 || !strings.Contains(form.body, `name="key"`) || form.header.Get("Content-Security-Policy") == "" {
		t.Fatalf("the sign-in form: %d %v", form.status, form.header)
	}
	tokA := csrfOf(t, form)
	for _, bad := range []string{"", "not-a-key", "trd_aaaaaaaaaaaa_" + strings.Repeat("b", 52)} {
		p := post(t, c, s.url+"/console/signin", url.Values{"key": {bad}, "csrf": {tokA}, "next": {"/console/launch"}})
		if p.status != 401 || !strings.Contains(p.body, "not accepted") || p.header.Get("Set-Cookie") != "" && strings.Contains(p.header.Get("Set-Cookie"), session.CookieName) {
			t.Errorf("key %q: %d, want 401 with the reason and no session", bad, p.status)
		}
		tokA = csrfOf(t, p)
	}
	// Without the form's token (a cross-site post), nothing happens.
	other := client(t)
	if p := post(t, other, s.url+"/console/signin", url.Values{"key": {tok}, "csrf": {tokA}}); p.status != 403 {
		t.Errorf("a sign-in without the form's cookie: %d, want 403", p.status)
	}
	p = post(t, c, s.url+"/console/signin", url.Values{"key": {tok}, "csrf": {tokA}, "next": {"/console/launch"}})
	if p.status != 303 || p.header.Get("Location") != "/console/launch" {
		t.Fatalf("a good key: %d %s %s", p.status, p.header.Get("Location"), p.body)
	}
	var sess *http.Cookie
	for _, ck := range (&http.Response{Header: p.header}).Cookies() {
		if ck.Name == session.CookieName {
			sess = ck
		}
	}
	if sess == nil || !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.Path != "/" || strings.Contains(sess.Value, tok[4:16]) || sess.MaxAge <= 0 {
		t.Fatalf("session cookie %+v", sess)
	}
	runs := get(t, c, s.url+"/")
	if runs.status != 200 || !strings.Contains(runs.body, `data-page="runs"`) || !strings.Contains(runs.body, "acme") {
		t.Fatalf("the runs page: %d", runs.status)
	}
	if m := regexp.MustCompile(`name="csrf-token" content="([a-z2-7]+)"`).FindStringSubmatch(runs.body); m == nil {
		t.Error("the page carries no CSRF token for its scripts")
	}
	for _, next := range []string{"//evil.example/", "https://evil.example/", "/\\evil.example"} {
		c2 := client(t)
		f := get(t, c2, s.url+"/console/signin")
		if p := post(t, c2, s.url+"/console/signin", url.Values{"key": {tok}, "csrf": {csrfOf(t, f)}, "next": {next}}); p.header.Get("Location") != "/" {
			t.Errorf("next=%s: redirected to %s", next, p.header.Get("Location"))
		}
	}
	// Sign-out needs the session's token; then the session is gone.
	if p := post(t, c, s.url+"/console/signout", url.Values{"csrf": {"wrong"}}); p.status != 403 {
		t.Errorf("sign-out without the token: %d", p.status)
	}
	if p := get(t, c, s.url+"/"); p.status != 200 {
		t.Fatalf("still signed in after a refused sign-out: %d", p.status)
	}
	if p := post(t, c, s.url+"/console/signout", url.Values{"csrf": {csrfOf(t, runs)}}); p.status != 303 || p.header.Get("Location") != "/console/signin" {
		t.Fatalf("sign-out: %d %s", p.status, p.header.Get("Location"))
	}
	if p := get(t, c, s.url+"/"); p.status != 303 {
		t.Errorf("after sign-out, GET /: %d, want the sign-in redirect", p.status)
	}
	// Requests that are not the console's go to the API.
	if p := get(t, c, s.url+"/runs"); p.status != http.StatusTeapot {
		t.Errorf("GET /runs reached the console: %d", p.status)
	}
}

// With authentication off, or open on loopback before the first key,
// there is no sign-in; once a key exists, there is.
func TestNoSignInWithoutKeys(t *testing.T) {
	off := newSite(t, console.Config{}, false)
	c := client(t)
	if p := get(t, c, off.url+"/"); p.status != 200 || !strings.Contains(p.body, "operator") || strings.Contains(p.body, "Sign out") {
		t.Errorf("--auth none: GET / %d", p.status)
	}
	if p := get(t, c, off.url+"/console/signin"); p.status != 303 {
		t.Errorf("--auth none: the sign-in page %d, want a redirect", p.status)
	}
	open := newSite(t, console.Config{OpenWithoutKeys: true}, true)
	if p := get(t, c, open.url+"/"); p.status != 200 {
		t.Errorf("open, no key yet: GET / %d", p.status)
	}
	open.keys.Create(context.Background(), "first", "", nil)
	if p := get(t, c, open.url+"/"); p.status != 303 {
		t.Errorf("open, once a key exists: GET / %d, want the sign-in redirect", p.status)
	}
}

// A run's pages are 404 for another tenant, with the console's strict
// headers; the journal renders for its owner.
func TestRunPages(t *testing.T) {
	s := newSite(t, console.Config{}, true)
	ctx := context.Background()
	signIn := func(tenant string) (*http.Client, auth.Principal) {
		tok, _, _ := s.keys.Create(ctx, tenant, tenant, []auth.Scope{auth.Runs})
		p, _ := s.keys.Authenticate(ctx, tok)
		c := client(t)
		f := get(t, c, s.url+"/console/signin")
		post(t, c, s.url+"/console/signin", url.Values{"key": {tok}, "csrf": {csrfOf(t, f)}})
		return c, p
	}
	a, pa := signIn("acme")
	b, _ := signIn("globex")
	run := runid.Must("r-console-pages")
	actx := auth.With(ctx, pa)
	text := "hello **there** <script>alert(1)</script>"
	if _, err := s.orch.Write(actx, run, wire.WriteRequest{Path: "artifacts/report.md", Text: &text}); err != nil {
		t.Fatal(err)
	}
	if err := s.orch.Note(actx, run, "<img src=x onerror=alert(1)>", "alice"); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/console/runs/" + run.String(), "/console/runs/" + run.String() + "/scratch"} {
		p := get(t, a, s.url+path)
		h := p.header
		if p.status != 200 || !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") || strings.Contains(h.Get("Content-Security-Policy"), "unsafe-inline") ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-store" {
			t.Errorf("%s for its owner: %d %v", path, p.status, h)
		}
		if strings.Contains(p.body, "<script>") || strings.Contains(p.body, " on") && regexp.MustCompile(` on[a-z]+=`).MatchString(p.body) {
			t.Errorf("%s has inline script", path)
		}
		if p := get(t, b, s.url+path); p.status != 404 || !strings.Contains(p.body, "Not found") {
			t.Errorf("%s for another tenant: %d, want 404", path, p.status)
		}
	}
	cel := get(t, a, s.url+"/console/runs/"+run.String()+"/cel")
	if cel.status != 200 || !strings.Contains(cel.body, `class="badge badge-`) || strings.Contains(cel.body, "<img") || !strings.Contains(cel.body, "&lt;img src=x onerror=alert(1)&gt;") {
		t.Errorf("the rendered journal: %d\n%s", cel.status, cel.body)
	}
	// A run of the viewer's that has made no call yet has no journal: no
	// content, not an error; another tenant's is still 404.
	fresh := runid.Must("r-console-fresh")
	if err := s.orch.Create(actx, fresh); err != nil {
		t.Fatal(err)
	}
	if p := get(t, a, s.url+"/console/runs/"+fresh.String()+"/cel"); p.status != 204 || p.body != "" {
		t.Errorf("the journal of a run with no call yet: %d %q, want 204", p.status, p.body)
	}
	if p := get(t, b, s.url+"/console/runs/"+fresh.String()+"/cel"); p.status != 404 {
		t.Errorf("another tenant's run with no journal: %d, want 404", p.status)
	}
	md := get(t, a, s.url+"/console/runs/"+run.String()+"/render/artifacts/report.md")
	if md.status != 200 || !strings.Contains(md.body, "<strong>there</strong>") || strings.Contains(md.body, "<script>") {
		t.Errorf("the rendered report: %d %s", md.status, md.body)
	}
	for _, path := range []string{"/cel", "/render/artifacts/report.md"} {
		if p := get(t, b, s.url+"/console/runs/"+run.String()+path); p.status != 404 {
			t.Errorf("%s for another tenant: %d", path, p.status)
		}
	}
	if p := get(t, a, s.url+"/console/runs/"+run.String()+"/render/CEL.step_1.md.txt"); p.status != 400 {
		t.Errorf("rendering a file that is not Markdown: %d", p.status)
	}
	// A notebook renders as cells: Markdown as safe HTML, code and
	// outputs as they are.
	nb := `{"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}}, "cells": [
		{"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# Title\n", "<script>alert(1)</script>\n", "\n", "some *x*"]},
		{"cell_type": "code", "id": "b", "metadata": {}, "execution_count": 3, "source": "print(1)",
		 "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}]}]}`
	if _, err := s.orch.Write(actx, run, wire.WriteRequest{Path: "run.ipynb.json.ipynb", Text: &nb}); err != nil {
		t.Fatal(err)
	}
	view := get(t, a, s.url+"/console/runs/"+run.String()+"/notebook/run.ipynb.json.ipynb")
	var got struct {
		Language string `json:"language"`
		Cells    []struct {
			Type, Source, HTML string
			ExecutionCount     *int              `json:"execution_count"`
			Outputs            []json.RawMessage `json:"outputs"`
		} `json:"cells"`
	}
	if view.status != 200 || json.Unmarshal([]byte(view.body), &got) != nil || len(got.Cells) != 2 {
		t.Fatalf("the notebook's view: %d %s", view.status, view.body)
	}
	if c := got.Cells[0]; c.Type != "markdown" || !strings.Contains(c.HTML, "<h1") || !strings.Contains(c.HTML, "<em>x</em>") || strings.Contains(c.HTML, "<script") {
		t.Errorf("the Markdown cell: %+v", c)
	}
	if c := got.Cells[1]; c.Type != "code" || c.Source != "print(1)" || c.ExecutionCount == nil || *c.ExecutionCount != 3 || len(c.Outputs) != 1 {
		t.Errorf("the code cell: %+v", c)
	}
	if p := get(t, b, s.url+"/console/runs/"+run.String()+"/notebook/run.ipynb.json.ipynb"); p.status != 404 {
		t.Errorf("another tenant's notebook: %d", p.status)
	}
	if p := get(t, a, s.url+"/console/runs/"+run.String()+"/notebook/artifacts/report.md"); p.status != 400 {
		t.Errorf("a Markdown file as a notebook: %d", p.status)
	}
	if p := get(t, a, s.url+"/console/nothing"); p.status != 404 {
		t.Errorf("an unknown console path: %d", p.status)
	}
	js := get(t, a, s.url+"/console/static/lib.js")
	if js.status != 200 || !strings.HasPrefix(js.header.Get("Content-Type"), "text/javascript") {
		t.Errorf("lib.js: %d %s", js.status, js.header.Get("Content-Type"))
	}
}

// The journal's fragment from a byte offset renders only what was
// appended after it: the page's copy plus each tail is the whole journal
// rendered afresh. An offset past the end answers the whole journal; one
// inside a section, or no number, is a 400 with the error body; another
// tenant's run is 404 with or without it.
func TestJournalFrom(t *testing.T) {
	s := newSite(t, console.Config{}, true)
	ctx := context.Background()
	tok, _, _ := s.keys.Create(ctx, "acme", "acme", []auth.Scope{auth.Runs})
	p, _ := s.keys.Authenticate(ctx, tok)
	a := client(t)
	f := get(t, a, s.url+"/console/signin")
	post(t, a, s.url+"/console/signin", url.Values{"key": {tok}, "csrf": {csrfOf(t, f)}})
	tok2, _, _ := s.keys.Create(ctx, "globex", "globex", []auth.Scope{auth.Runs})
	b := client(t)
	f = get(t, b, s.url+"/console/signin")
	post(t, b, s.url+"/console/signin", url.Values{"key": {tok2}, "csrf": {csrfOf(t, f)}})

	run := runid.Must("r-console-from")
	actx := auth.With(ctx, p)
	step := func(i int) {
		text := strings.Repeat("x", i+1)
		if _, err := s.orch.Write(actx, run, wire.WriteRequest{Path: fmt.Sprintf("artifacts/f%d.md", i), Text: &text}); err != nil {
			t.Fatal(err)
		}
	}
	cel := s.url + "/console/runs/" + run.String() + "/cel"
	step(0)
	whole := get(t, a, cel)
	if whole.status != 200 || whole.header.Get("X-Journal-From") != "0" || whole.header.Get("X-Journal-Size") == "" {
		t.Fatalf("the whole journal: %d %v", whole.status, whole.header)
	}
	shown, size := whole.body, whole.header.Get("X-Journal-Size")
	if p := get(t, a, cel+"?from="+size); p.status != 204 || p.header.Get("X-Journal-Size") != size || p.header.Get("X-Journal-From") != size {
		t.Errorf("from the end with nothing new: %d %v, want 204 with the same size", p.status, p.header)
	}
	for i := 1; i <= 4; i++ {
		step(i)
		if i == 2 {
			if err := s.orch.Note(actx, run, "use the EU figures", "alice"); err != nil {
				t.Fatal(err)
			}
		}
		tail := get(t, a, cel+"?from="+size)
		if tail.status != 200 || tail.header.Get("X-Journal-From") != size {
			t.Fatalf("from %s after step %d: %d %v", size, i+1, tail.status, tail.header)
		}
		if strings.Contains(tail.body, "Step 1:") || !strings.Contains(tail.body, fmt.Sprintf("Step %d:", i+1)) {
			t.Errorf("the tail from %s has %q; want only the new sections", size, tail.body)
		}
		shown += tail.body
		size = tail.header.Get("X-Journal-Size")
		now := get(t, a, cel)
		if now.body != shown || now.header.Get("X-Journal-Size") != size {
			t.Fatalf("after step %d the page's copy (the first answer and each tail) differs from the whole journal:\n got %s\nwant %s", i+1, shown, now.body)
		}
	}
	if p := get(t, a, cel+"?from=99999999"); p.status != 200 || p.header.Get("X-Journal-From") != "0" || p.body != shown {
		t.Errorf("from past the end: %d %v; want the whole journal from 0", p.status, p.header)
	}
	for _, q := range []string{"1", "-5", "abc", "3.5"} {
		p := get(t, a, cel+"?from="+q)
		var e wire.ErrorBody
		if p.status != 400 || json.Unmarshal([]byte(p.body), &e) != nil || e.Error.Kind != "bad_input" || e.Error.Message == "" || e.Error.Suggestion == "" {
			t.Errorf("from=%s: %d %s; want 400 with the error body", q, p.status, p.body)
		}
	}
	if p := get(t, b, cel+"?from="+size); p.status != 404 {
		t.Errorf("another tenant's journal from an offset: %d, want 404", p.status)
	}
}
