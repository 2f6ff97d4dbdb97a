package api_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

// journaled is a server whose orchestrator keeps journals (no sandbox).
func journaled(t *testing.T, cfg api.Config) (*client, *orchestrator.Orchestrator) {
	t.Helper()
	store := localBackend(t).open(t)
	orch := orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store)})
	cfg.Orchestrator = orch
	return apiServer(t, cfg), orch
}

// A console session's cookie acts as its key's principal; its
// state-changing requests need the session's CSRF token; a request from
// another origin is refused whatever authenticates it; a session signed
// out of, or of a revoked key, is refused.
func TestSessionCookies(t *testing.T) {
	store := localBackend(t).open(t)
	orch := orchestrator.New(orchestrator.Config{Store: store, Journal: cel.New(store)})
	ks := keys.New(store.Meta(), keys.Config{CacheTTL: time.Millisecond})
	ss := session.New(store.Meta(), ks, session.Config{CacheTTL: time.Millisecond})
	c := apiServer(t, api.Config{Orchestrator: orch, Keys: ks, Sessions: ss})
	tok := c.newKey("initech", auth.Runs)
	p, err := ks.Authenticate(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := ss.Create(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	browser := c.as("")
	cookie := session.CookieName + "=" + sess.ID
	write := func(hdr ...string) answer {
		return browser.do("POST", "/tmp/write", "r-console", strings.NewReader(`{"path":"a.txt","text":"hi"}`), append([]string{"Cookie", cookie}, hdr...)...)
	}
	if a := write(); a.status != 403 || a.errKind(t) != "forbidden" || !strings.Contains(string(a.body), "CSRF") {
		t.Errorf("a write without the CSRF token: got %d %s, want 403 forbidden", a.status, a.body)
	}
	if a := write(session.CSRFHeader, "not-the-token"); a.status != 403 {
		t.Errorf("a write with a wrong CSRF token: got %d, want 403", a.status)
	}
	if a := write(session.CSRFHeader, sess.CSRF); a.status != 200 {
		t.Fatalf("a write with the session's CSRF token: got %d %s", a.status, a.body)
	}
	if a := write(session.CSRFHeader, sess.CSRF, "Origin", "http://evil.example"); a.status != 403 || a.errKind(t) != "forbidden" {
		t.Errorf("a write from another origin: got %d %s, want 403", a.status, a.body)
	}
	if a := write(session.CSRFHeader, sess.CSRF, "Origin", strings.Replace(c.url, "127.0.0.1", "127.0.0.1", 1)); a.status != 200 {
		t.Errorf("a write from the server's own origin: got %d %s", a.status, a.body)
	}
	// Reads need no token, and the session's runs are its key's tenant's.
	var list wire.RunList
	if a := browser.do("GET", "/runs", "", nil, "Cookie", cookie); a.status != 200 {
		t.Fatalf("GET /runs with the cookie: %d %s", a.status, a.body)
	} else {
		a.json(t, &list)
	}
	if len(list.Runs) != 1 || list.Runs[0].RunID != "r-console" || list.Runs[0].StartedBy.Tenant != "initech" || list.Runs[0].StartedBy.KeyID != p.KeyID {
		t.Errorf("the session's runs: %+v", list.Runs)
	}
	// Another tenant's key does not see it; an API key from another
	// origin is refused too (a page elsewhere cannot use a key it holds
	// in the browser against this server either).
	if a := c.do("GET", "/runs/r-console", "", nil); a.status != 404 {
		t.Errorf("tenant acme on initech's run: %d", a.status)
	}
	if a := c.do("POST", "/tmp/write", "r-acme", strings.NewReader(`{"path":"a.txt","text":"hi"}`), "Origin", "null"); a.status != 403 {
		t.Errorf("a keyed write with Origin: null: got %d, want 403", a.status)
	}
	if a := c.do("POST", "/tmp/write", "r-acme", strings.NewReader(`{"path":"a.txt","text":"hi"}`), "Sec-Fetch-Site", "cross-site"); a.status != 403 {
		t.Errorf("a keyed write marked cross-site: got %d, want 403", a.status)
	}

	// Sign-out ends the session: 401 auth.
	if err := ss.Delete(t.Context(), sess.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if a := browser.do("GET", "/runs", "", nil, "Cookie", cookie); a.status != 401 || a.errKind(t) != "auth" {
		t.Errorf("after sign-out: got %d %s, want 401 auth", a.status, a.body)
	}
	// A revoked key ends its sessions.
	sess2, _ := ss.Create(t.Context(), p)
	if _, err := ks.Revoke(t.Context(), p.KeyID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if a := browser.do("GET", "/runs", "", nil, "Cookie", session.CookieName+"="+sess2.ID); a.status != 401 {
		t.Errorf("a session of a revoked key: got %d, want 401", a.status)
	}
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	id, event, data string
}

// events follows GET /runs/{id}/events and sends each event on the
// channel until ctx ends.
func (c *client) events(ctx context.Context, run, lastID string) (<-chan sseEvent, int) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.url+"/runs/"+run+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+c.key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	ch := make(chan sseEvent, 100)
	if resp.StatusCode != 200 {
		resp.Body.Close()
		close(ch)
		return ch, resp.StatusCode
	}
	go func() {
		defer resp.Body.Close()
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		var e sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if e.event != "" {
					ch <- e
				}
				e = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				e.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				e.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				e.data = line[6:]
			}
		}
	}()
	return ch, 200
}

func next(t *testing.T, ch <-chan sseEvent, want string) sseEvent {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("the stream ended; want a %s event", want)
		}
		if e.event != want {
			t.Fatalf("got event %s %s, want %s", e.event, e.data, want)
		}
		return e
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s event within 30 s", want)
	}
	return sseEvent{}
}

// Any run's event stream (a manual one here) has a call event for each
// journaled call so far, then each new call as the journal records it,
// with its verdict and critique, and a journal event for a note; a
// reconnect with Last-Event-ID gets only what it missed.
func TestRunEventsForEveryRun(t *testing.T) {
	c, _ := journaled(t, api.Config{})
	run := "r-feed"
	c.write(run, "a.txt", "one")
	c.write(run, "b.txt", "two")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, status := c.events(ctx, run, "")
	if status != 200 {
		t.Fatalf("GET /runs/%s/events: %d", run, status)
	}
	for i, path := range []string{"a.txt", "b.txt"} {
		e := next(t, ch, "call")
		var ce wire.CallEvent
		if err := json.Unmarshal([]byte(e.data), &ce); err != nil {
			t.Fatal(err)
		}
		if ce.Step != i+1 || e.id != strconv.Itoa(ce.Step) || ce.Tool != "tmp.write" || ce.Inputs["path"] != path || (ce.Verdict != "PASS" && ce.Verdict != "FAIL") || ce.Critique == "" || len(ce.Outputs) != 1 {
			t.Errorf("call %d: %s %+v", i+1, e.id, ce)
		}
	}
	c.write(run, "c.txt", "three") // live
	var ce wire.CallEvent
	json.Unmarshal([]byte(next(t, ch, "call").data), &ce)
	if ce.Step != 3 || ce.Inputs["path"] != "c.txt" || ce.Outputs[0].Path != "c.txt" {
		t.Errorf("the live call: %+v", ce)
	}
	if a := c.post("/cel/note", run, map[string]string{"text": "look at c"}); a.status != 200 {
		t.Fatal(a.status)
	}
	var je wire.JournalEvent
	json.Unmarshal([]byte(next(t, ch, "journal").data), &je)
	if je.Kind != "note" {
		t.Errorf("journal event %+v, want a note", je)
	}
	cancel()

	ch2, _ := c.events(t.Context(), run, "2")
	json.Unmarshal([]byte(next(t, ch2, "call").data), &ce)
	if ce.Step != 3 {
		t.Errorf("after Last-Event-ID 2: got step %d, want 3", ce.Step)
	}
	other := c.as(c.newKey("globex", auth.Read))
	if _, status := other.events(t.Context(), run, ""); status != 404 {
		t.Errorf("another tenant's events: %d, want 404", status)
	}
	if _, status := c.events(t.Context(), "r-nobody-made", ""); status != 404 {
		t.Errorf("a run nobody made: %d, want 404", status)
	}
}

// GET /runs/{id}/files lists every file with the call that produced its
// bytes; GET /runs/{id}/files/{path} serves them for a person, sandboxed
// and framable only by the console, as an attachment on request; neither
// is journaled. /blobs takes the run in the query for links.
func TestRunFilesForPeople(t *testing.T) {
	c, orch := journaled(t, api.Config{})
	run := "r-files"
	c.write(run, "artifacts/page.html", "<script>alert(1)</script>")
	c.write(run, "artifacts/chart.svg", `<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>`)
	f := c.write(run, "artifacts/doc.pdf", "%PDF-1.4")
	c.write(run, "artifacts/page.html", "<p>second</p>") // step 4 made the current bytes

	var files wire.RunFiles
	if a := c.do("GET", "/runs/"+run+"/files", "", nil); a.status != 200 {
		t.Fatalf("GET files: %d %s", a.status, a.body)
	} else {
		a.json(t, &files)
	}
	step := map[string]int{}
	for _, f := range files.Files {
		step[f.Path] = f.Step
	}
	for p, want := range map[string]int{"artifacts/page.html": 4, "artifacts/chart.svg": 2, "artifacts/doc.pdf": 3, "CEL.md": 0} {
		if got, ok := step[p]; !ok || got != want {
			t.Errorf("%s: step %d (listed %v), want %d", p, got, ok, want)
		}
	}
	for _, tc := range []struct {
		path, ctype string
		sandbox     bool
	}{
		{"artifacts/page.html", "text/html", true},
		{"artifacts/chart.svg", "image/svg+xml", true},
		{"artifacts/doc.pdf", "application/pdf", false},
	} {
		a := c.do("GET", "/runs/"+run+"/files/"+tc.path, "", nil)
		h := a.header
		csp := h.Get("Content-Security-Policy")
		if a.status != 200 || !strings.HasPrefix(h.Get("Content-Type"), tc.ctype) || h.Get("X-Content-Type-Options") != "nosniff" ||
			strings.Contains(csp, "sandbox") != tc.sandbox || strings.Contains(csp, "allow-same-origin") ||
			!strings.Contains(csp, "frame-ancestors 'self'") || h.Get("X-Frame-Options") != "SAMEORIGIN" || h.Get("Content-Disposition") != "" {
			t.Errorf("%s: %d %v", tc.path, a.status, h)
		}
	}
	a := c.do("GET", "/runs/"+run+"/files/artifacts/page.html?download=1", "", nil)
	if string(a.body) != "<p>second</p>" || a.header.Get("Content-Disposition") != `attachment; filename=page.html` {
		t.Errorf("download: %q %v", a.body, a.header)
	}
	if a := c.do("GET", "/runs/"+run+"/files/nothing.txt", "", nil); a.status != 404 {
		t.Errorf("a missing file: %d", a.status)
	}
	if a := c.do("GET", "/runs/"+run+"/files/../x", "", nil); a.status != 400 {
		t.Errorf("a path with ..: %d %s", a.status, a.body)
	}
	other := c.as(c.newKey("globex", auth.Runs))
	for _, p := range []string{"/runs/" + run + "/files", "/runs/" + run + "/files/artifacts/doc.pdf"} {
		if a := other.do("GET", p, "", nil); a.status != 404 {
			t.Errorf("another tenant: GET %s: %d", p, a.status)
		}
	}

	// By hash, for a link: ?run= and a download name.
	a = c.do("GET", "/blobs/"+f.SHA256.String()+"?run="+run+"&name=brief.pdf", "", nil)
	sum := sha256.Sum256(a.body)
	if a.status != 200 || hex.EncodeToString(sum[:]) != f.SHA256.String() || a.header.Get("Content-Disposition") != "attachment; filename=brief.pdf" {
		t.Errorf("blob by link: %d %v", a.status, a.header)
	}
	if a := other.do("GET", "/blobs/"+f.SHA256.String()+"?run="+run, "", nil); a.status != 404 {
		t.Errorf("another tenant's blob by link: %d", a.status)
	}

	// Looking journaled nothing: four writes, four steps.
	v, err := orch.Status(auth.With(t.Context(), auth.Operator), runid.Must(run))
	if err != nil || len(v.Steps) != 4 {
		t.Errorf("steps after looking: %d (%v), want 4", len(v.Steps), err)
	}
}

// GET /runs filters by status and recipe ("manual": no recipe), and the
// summaries carry the objective and the verdict counts.
func TestRunsFilter(t *testing.T) {
	c, orch := journaled(t, api.Config{})
	for _, r := range []string{"r-m1", "r-m2", "r-fc", "r-sr"} {
		c.write(r, "x.txt", "x")
	}
	c.write("r-m2", "y.txt", "y")
	ctx := context.Background()
	if err := orch.OpenRun(ctx, runid.Must("r-fc"), orchestrator.WithRunInfo("forecast-pack", "Forecast revenue")); err != nil {
		t.Fatal(err)
	}
	orch.SetRecipeState(ctx, runid.Must("r-fc"), "forecast-pack", "succeeded")
	orch.SetRecipeState(ctx, runid.Must("r-sr"), "sales-reallocation", "failed")
	ids := func(q string) []string {
		var l wire.RunList
		a := c.do("GET", "/runs"+q, "", nil)
		if a.status != 200 {
			t.Fatalf("GET /runs%s: %d %s", q, a.status, a.body)
		}
		a.json(t, &l)
		var out []string
		for _, r := range l.Runs {
			out = append(out, r.RunID)
		}
		return out
	}
	for q, want := range map[string]string{
		"":                                       "r-sr r-fc r-m2 r-m1",
		"?recipe=manual":                         "r-m2 r-m1",
		"?recipe=forecast-pack":                  "r-fc",
		"?status=failed":                         "r-sr",
		"?status=open":                           "r-m2 r-m1",
		"?status=succeeded&recipe=manual":        "",
		"?recipe=manual&limit=1":                 "r-m2",
		"?status=succeeded&recipe=forecast-pack": "r-fc",
	} {
		if got := strings.Join(ids(q), " "); got != want {
			t.Errorf("GET /runs%s: got %q, want %q", q, got, want)
		}
	}
	var l wire.RunList
	c.do("GET", "/runs?recipe=manual&limit=1", "", nil).json(t, &l)
	var rest wire.RunList
	c.do("GET", "/runs?recipe=manual&limit=1&cursor="+l.NextCursor, "", nil).json(t, &rest)
	if len(rest.Runs) != 1 || rest.Runs[0].RunID != "r-m1" || rest.NextCursor != "" {
		t.Errorf("the second filtered page: %+v", rest)
	}
	c.do("GET", "/runs?recipe=forecast-pack", "", nil).json(t, &l)
	if s := l.Runs[0]; s.Objective != "Forecast revenue" || s.Passed+s.Failed != 1 || s.Steps != 1 {
		t.Errorf("summary %+v lacks the objective or the verdict counts", s)
	}
	c.do("GET", "/runs?recipe=manual", "", nil).json(t, &l)
	if s := l.Runs[0]; s.RunID != "r-m2" || s.Passed+s.Failed != 2 || !s.Updated.After(s.Created) {
		t.Errorf("summary %+v: want 2 verdicts and an update after creation", s)
	}
}
