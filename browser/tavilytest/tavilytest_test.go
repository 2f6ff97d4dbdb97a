package tavilytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/browser/tavilytest"
)

// post sends body to the fake as a client would and returns the status,
// headers and decoded JSON answer.
func post(t *testing.T, srv *tavilytest.Server, key, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/search", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v: %s", err, b)
	}
	return resp.StatusCode, resp.Header, m
}

func errorText(m map[string]any) string {
	d, _ := m["detail"].(map[string]any)
	s, _ := d["error"].(string)
	return s
}

func results(m map[string]any) []map[string]any {
	var out []map[string]any
	rs, _ := m["results"].([]any)
	for _, r := range rs {
		out = append(out, r.(map[string]any))
	}
	return out
}

func TestAuth(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	tests := []struct {
		name, key string
		want      int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"wrong key", "tvly-dev-wrong", http.StatusUnauthorized},
		{"right key", srv.Key, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, m := post(t, srv, tt.key, `{"query":"acme"}`)
			if status != tt.want {
				t.Fatalf("got %d, want %d: %v", status, tt.want, m)
			}
			if tt.want == http.StatusUnauthorized {
				if got, want := errorText(m), "Unauthorized: missing or invalid API key."; got != want {
					t.Errorf("got detail.error %q, want %q", got, want)
				}
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	for _, tt := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/search", http.StatusMethodNotAllowed},
		{http.MethodPost, "/extract-nothing", http.StatusNotFound},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: got %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
		}
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	tests := []struct {
		name, body, want string
	}{
		{"not JSON", `query`, "Invalid JSON body"},
		{"no query", `{}`, "Query is missing."},
		{"long query", `{"query":"` + strings.Repeat("x", 401) + `"}`, "Query is too long. Max query length is 400 characters."},
		{"max_results too high", `{"query":"q","max_results":21}`, "Invalid max_results"},
		{"max_results fraction", `{"query":"q","max_results":2.5}`, "Invalid max_results"},
		{"bad topic", `{"query":"q","topic":"sports"}`, "Invalid topic"},
		{"bad time_range", `{"query":"q","time_range":"decade"}`, "Invalid time_range"},
		{"bad start_date", `{"query":"q","start_date":"2025/01/01"}`, "Invalid start_date"},
		{"reversed dates", `{"query":"q","start_date":"2025-02-01","end_date":"2025-01-01"}`, "Invalid date range"},
		{"bad include_raw_content", `{"query":"q","include_raw_content":"html"}`, "Invalid include_raw_content"},
		{"include_domains not a list", `{"query":"q","include_domains":"a.example"}`, "Invalid include_domains"},
		{"unknown field", `{"query":"q","maxresults":3}`, "Unknown parameter: maxresults."},
		{"api_key in body", `{"query":"q","api_key":"` + srv.Key + `"}`, "api_key must not be sent in the body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, m := post(t, srv, srv.Key, tt.body)
			if status != http.StatusBadRequest {
				t.Fatalf("got %d, want 400: %v", status, m)
			}
			if got := errorText(m); !strings.Contains(got, tt.want) {
				t.Errorf("got detail.error %q, want it to contain %q", got, tt.want)
			}
		})
	}
}

func TestResponseShape(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	status, hdr, m := post(t, srv, srv.Key, `{"query":"Acme Analytics pricing","max_results":3}`)
	if status != http.StatusOK {
		t.Fatalf("got %d, want 200: %v", status, m)
	}
	if got := hdr.Get("Content-Type"); got != "application/json" {
		t.Errorf("got Content-Type %q, want application/json", got)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if diff := cmp.Diff([]string{"answer", "follow_up_questions", "images", "query", "request_id", "response_time", "results"}, keys); diff != "" {
		t.Errorf("top-level fields (-want +got):\n%s", diff)
	}
	if m["answer"] != nil || m["follow_up_questions"] != nil {
		t.Errorf("got answer %v and follow_up_questions %v, want null for both", m["answer"], m["follow_up_questions"])
	}
	rs := results(m)
	if len(rs) != 3 {
		t.Fatalf("got %d results, want 3 (max_results)", len(rs))
	}
	for i, r := range rs {
		for _, k := range []string{"url", "title", "content", "score"} {
			if _, ok := r[k]; !ok {
				t.Errorf("result %d lacks %s", i, k)
			}
		}
		if raw, ok := r["raw_content"]; !ok || raw != nil {
			t.Errorf("result %d: got raw_content %v (present %v), want null", i, raw, ok)
		}
		if i > 0 && r["score"].(float64) > rs[i-1]["score"].(float64) {
			t.Errorf("results not sorted by score: %v after %v", r["score"], rs[i-1]["score"])
		}
	}
	if !strings.Contains(rs[0]["url"].(string), "acme-analytics.example") {
		t.Errorf("got top result %s, want an Acme page", rs[0]["url"])
	}
}

func TestFilters(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	published := func(r map[string]any) time.Time {
		s, _ := r["published_date"].(string)
		tm, err := http.ParseTime(s)
		if err != nil {
			t.Fatalf("result %s: published_date %q: %v", r["url"], s, err)
		}
		return tm
	}
	tests := []struct {
		name  string
		body  string
		check func(t *testing.T, rs []map[string]any)
	}{
		{"include_domains takes subdomains", `{"query":"acme analytics","max_results":20,"include_domains":["acme-analytics.example"]}`, func(t *testing.T, rs []map[string]any) {
			hosts := map[string]bool{}
			for _, r := range rs {
				u := r["url"].(string)
				if !strings.Contains(u, ".acme-analytics.example/") {
					t.Errorf("got %s, want only acme-analytics.example hosts", u)
				}
				hosts[strings.Split(u, "/")[2]] = true
			}
			if len(hosts) < 3 {
				t.Errorf("got hosts %v, want www, blog, investors and docs", hosts)
			}
		}},
		{"exclude_domains", `{"query":"acme analytics","max_results":20,"exclude_domains":["acme-analytics.example"]}`, func(t *testing.T, rs []map[string]any) {
			for _, r := range rs {
				if strings.Contains(r["url"].(string), "acme-analytics.example") {
					t.Errorf("got %s, want no acme-analytics.example hosts", r["url"])
				}
			}
		}},
		{"time_range week", `{"query":"analytics","max_results":20,"time_range":"week"}`, func(t *testing.T, rs []map[string]any) {
			for _, r := range rs {
				if p := published(r); p.Before(tavilytest.CorpusNow.AddDate(0, 0, -7)) {
					t.Errorf("got %s published %v, want within a week of %v", r["url"], p, tavilytest.CorpusNow)
				}
			}
		}},
		{"time_range day", `{"query":"outage","max_results":20,"time_range":"d"}`, func(t *testing.T, rs []map[string]any) {
			for _, r := range rs {
				if p := published(r); p.Before(tavilytest.CorpusNow.Add(-24 * time.Hour)) {
					t.Errorf("got %s published %v, want within a day", r["url"], p)
				}
			}
		}},
		{"start and end date inclusive", `{"query":"globex insights","max_results":20,"start_date":"2026-11-05","end_date":"2026-11-11"}`, func(t *testing.T, rs []map[string]any) {
			var urls []string
			for _, r := range rs {
				urls = append(urls, r["url"].(string))
				p := published(r)
				if p.Before(time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)) || !p.Before(time.Date(2026, 11, 12, 0, 0, 0, 0, time.UTC)) {
					t.Errorf("got %s published %v, want 2026-11-05 to 2026-11-11", r["url"], p)
				}
			}
			for _, want := range []string{"https://news.globex-insights.example/2026/11/series-d", "https://techledger.example/2026/11/11/globex-insights-hiring-emea"} {
				if !slices.Contains(urls, want) {
					t.Errorf("got %v, want it to include %s (published on a boundary day)", urls, want)
				}
			}
		}},
		{"max_results zero", `{"query":"acme","max_results":0}`, func(t *testing.T, rs []map[string]any) {
			if len(rs) != 0 {
				t.Errorf("got %d results, want 0", len(rs))
			}
		}},
		{"no match", `{"query":"zyzzyva quux"}`, func(t *testing.T, rs []map[string]any) {
			if len(rs) != 0 {
				t.Errorf("got %d results, want 0", len(rs))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, m := post(t, srv, srv.Key, tt.body)
			if status != http.StatusOK {
				t.Fatalf("got %d, want 200: %v", status, m)
			}
			rs := results(m)
			if len(rs) == 0 && !strings.Contains(tt.name, "zero") && !strings.Contains(tt.name, "no match") {
				t.Fatal("got no results; the filter test needs some")
			}
			tt.check(t, rs)
		})
	}
}

func TestRawContent(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	for _, mode := range []string{`true`, `"markdown"`, `"text"`} {
		t.Run(mode, func(t *testing.T) {
			_, _, m := post(t, srv, srv.Key, `{"query":"Globex Insights Series D","max_results":2,"include_raw_content":`+mode+`}`)
			rs := results(m)
			if len(rs) == 0 {
				t.Fatal("got no results")
			}
			for _, r := range rs {
				raw, _ := r["raw_content"].(string)
				if len(raw) < 200 || strings.Count(raw, "\n") < 3 {
					t.Errorf("%s: got raw_content %q, want multi-paragraph page text", r["url"], raw)
				}
				if heading := strings.HasPrefix(raw, "# "); heading == (mode == `"text"`) {
					t.Errorf("%s: markdown heading present = %v for mode %s", r["url"], heading, mode)
				}
			}
		})
	}
}

func TestAdvancedAndExtras(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	_, _, m := post(t, srv, srv.Key, `{"query":"Acme revenue guidance","max_results":1,"search_depth":"advanced","chunks_per_source":2,"include_answer":true,"include_favicon":true,"include_usage":true}`)
	rs := results(m)
	if len(rs) != 1 {
		t.Fatalf("got %d results, want 1", len(rs))
	}
	if got := strings.Count(rs[0]["content"].(string), " [...] "); got != 1 {
		t.Errorf("got %d chunk separators in %q, want 1 (two chunks)", got, rs[0]["content"])
	}
	if a, _ := m["answer"].(string); a == "" {
		t.Error("got no answer, want one for include_answer")
	}
	if f, _ := rs[0]["favicon"].(string); !strings.HasSuffix(f, "/favicon.ico") {
		t.Errorf("got favicon %q", f)
	}
	if u, _ := m["usage"].(map[string]any); u["credits"] != 2.0 {
		t.Errorf("got usage %v, want 2 credits for advanced", m["usage"])
	}
}

func TestFaultsAndRecording(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	srv.Inject(tavilytest.RateLimited("7"), tavilytest.PlanLimit(), tavilytest.PayGoLimit(), tavilytest.ServerError())
	wants := []struct {
		status     int
		retryAfter string
		detail     string
	}{
		{429, "7", "excessive requests"},
		{432, "", "plan's set usage limit"},
		{433, "", "pay-as-you-go limit"},
		{500, "", "Internal Server Error"},
		{200, "", ""},
	}
	for i, w := range wants {
		status, hdr, m := post(t, srv, srv.Key, `{"query":"crm market share"}`)
		if status != w.status {
			t.Fatalf("request %d: got %d, want %d", i, status, w.status)
		}
		if got := hdr.Get("Retry-After"); got != w.retryAfter {
			t.Errorf("request %d: got Retry-After %q, want %q", i, got, w.retryAfter)
		}
		if w.detail != "" && !strings.Contains(errorText(m), w.detail) {
			t.Errorf("request %d: got detail %q, want it to contain %q", i, errorText(m), w.detail)
		}
	}
	if got := srv.Pending(); got != 0 {
		t.Errorf("got %d faults pending, want 0", got)
	}
	reqs := srv.Requests()
	if len(reqs) != len(wants) {
		t.Fatalf("got %d recorded requests, want %d", len(reqs), len(wants))
	}
	for _, r := range reqs {
		if r.Method != http.MethodPost || r.Path != "/search" || r.Header.Get("Authorization") != "Bearer "+srv.Key {
			t.Errorf("recorded %s %s auth %q", r.Method, r.Path, r.Header.Get("Authorization"))
		}
		if got := r.Fields()["query"]; got != "crm market share" {
			t.Errorf("recorded query %v", got)
		}
	}
}

func TestSlowGivesUpWithClient(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	srv.Inject(tavilytest.Slow(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/search", strings.NewReader(`{"query":"acme"}`))
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want the client to time out", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want a deadline error", err)
	}
	// The fake must be free again: the next request answers at once.
	if status, _, _ := post(t, srv, srv.Key, `{"query":"acme"}`); status != http.StatusOK {
		t.Errorf("got %d after the slow answer, want 200", status)
	}
}

func TestDeterministic(t *testing.T) {
	t.Parallel()
	a := tavilytest.NewServer(t)
	b := tavilytest.NewServer(t)
	body := `{"query":"B2B SaaS analytics market size","max_results":10,"include_raw_content":"markdown"}`
	_, _, ma := post(t, a, a.Key, body)
	_, _, mb := post(t, b, b.Key, body)
	ja, _ := json.Marshal(ma)
	jb, _ := json.Marshal(mb)
	if !bytes.Equal(ja, jb) {
		t.Errorf("two fakes answered the same first request differently:\n%s\n%s", ja, jb)
	}
	_, _, ma2 := post(t, a, a.Key, body)
	if ma2["request_id"] == ma["request_id"] {
		t.Error("two requests got the same request_id")
	}
}

func TestCorpus(t *testing.T) {
	t.Parallel()
	docs := tavilytest.DefaultCorpus()
	if len(docs) < 40 {
		t.Errorf("got %d documents, want about 40", len(docs))
	}
	for _, d := range docs {
		if d.URL == "" || d.Title == "" || d.Snippet == "" || strings.Count(d.Page, "\n\n") < 2 {
			t.Errorf("document %q is incomplete", d.URL)
		}
		if !strings.Contains(strings.Split(d.URL, "/")[2], ".example") {
			t.Errorf("document %q is not under .example", d.URL)
		}
		if d.Published != "" {
			if p, err := time.Parse(time.RFC3339, d.Published); err != nil || p.After(tavilytest.CorpusNow) {
				t.Errorf("document %q: published %q is not RFC 3339 before CorpusNow", d.URL, d.Published)
			}
		}
	}
}

func TestCustomCorpusAndNoKeys(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServerConfig(t, tavilytest.Config{
		Keys:   []string{"k1"},
		Corpus: []tavilytest.Document{{URL: "https://only.example/x", Title: "Only page", Snippet: "s", Page: "# Only page\n\np1\n\np2"}},
	})
	_, _, m := post(t, srv, "k1", `{"query":"only page"}`)
	if rs := results(m); len(rs) != 1 || rs[0]["url"] != "https://only.example/x" {
		t.Errorf("got %v, want the one custom document", rs)
	}
	locked := tavilytest.NewServerConfig(t, tavilytest.Config{})
	if status, _, _ := post(t, locked, "anything", `{"query":"q"}`); status != http.StatusUnauthorized {
		t.Errorf("got %d from a fake with no keys, want 401", status)
	}
}
