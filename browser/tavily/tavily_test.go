package tavily_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/internal/fault"
)

// clock stands in for time in backoff: Sleep records the wait and moves
// Now forward instead of blocking, so retry tests are quick and can assert
// exactly how long the client chose to wait.
type clock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func newClock() *clock { return &clock{now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

func (c *clock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// setup starts a fake Tavily and a client for it with a fake clock. mod
// adjusts the config before the client is built.
func setup(t *testing.T, mod func(*tavily.Config)) (*tavilytest.Server, *tavily.Client, *clock) {
	t.Helper()
	srv := tavilytest.NewServer(t)
	clk := newClock()
	cfg := tavily.Config{
		APIKey:     srv.Key,
		BaseURL:    srv.URL,
		MinBackoff: 500 * time.Millisecond,
		MaxBackoff: 2 * time.Second,
		Now:        clk.Now,
		Sleep:      clk.Sleep,
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := tavily.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return srv, c, clk
}

func wantFault(t *testing.T, err error, kind fault.Kind, status int) *fault.Error {
	t.Helper()
	fe := fault.As(err)
	if fe == nil {
		t.Fatalf("got error %v, want a *fault.Error of kind %s", err, kind)
	}
	if fe.Kind != kind {
		t.Fatalf("got kind %s (%v), want %s", fe.Kind, err, kind)
	}
	if got := fault.Status(fe.Kind); got != status {
		t.Errorf("got HTTP status %d, want %d", got, status)
	}
	return fe
}

// TestMapping asserts, row by row of docs/search.md's mapping table, the exact
// body the client sends upstream.
func TestMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		req  browser.Request
		want string
	}{
		{"query only: max_results defaults to 5, no page text",
			browser.Request{Query: "acme analytics"},
			`{"query":"acme analytics","max_results":5,"include_raw_content":false}`},
		{"top_k becomes max_results",
			browser.Request{Query: "acme analytics", TopK: 12},
			`{"query":"acme analytics","max_results":12,"include_raw_content":false}`},
		{"allow_domains becomes include_domains",
			browser.Request{Query: "acme analytics", AllowDomains: []string{"Blog.Acme-Analytics.example", "acme-analytics.example"}},
			`{"query":"acme analytics","max_results":5,"include_raw_content":false,"include_domains":["acme-analytics.example","blog.acme-analytics.example"]}`},
		{"date_range day becomes time_range",
			browser.Request{Query: "outage", DateRange: "day"},
			`{"query":"outage","max_results":5,"include_raw_content":false,"time_range":"day"}`},
		{"date_range week becomes time_range",
			browser.Request{Query: "acme analytics", DateRange: "week"},
			`{"query":"acme analytics","max_results":5,"include_raw_content":false,"time_range":"week"}`},
		{"date_range month becomes time_range",
			browser.Request{Query: "acme analytics", DateRange: "month"},
			`{"query":"acme analytics","max_results":5,"include_raw_content":false,"time_range":"month"}`},
		{"date_range year becomes time_range",
			browser.Request{Query: "acme analytics", DateRange: "year"},
			`{"query":"acme analytics","max_results":5,"include_raw_content":false,"time_range":"year"}`},
		{"date_range A..B becomes start_date and end_date",
			browser.Request{Query: "globex insights", DateRange: "2026-11-05..2026-11-11"},
			`{"query":"globex insights","max_results":5,"include_raw_content":false,"start_date":"2026-11-05","end_date":"2026-11-11"}`},
		{"include_page becomes include_raw_content markdown",
			browser.Request{Query: "globex insights", IncludePage: true},
			`{"query":"globex insights","max_results":5,"include_raw_content":"markdown"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, c, _ := setup(t, nil)
			rec, err := c.Search(t.Context(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			reqs := srv.Requests()
			if len(reqs) != 1 {
				t.Fatalf("got %d upstream requests, want 1", len(reqs))
			}
			got := reqs[0]
			if got.Method != http.MethodPost || got.Path != "/search" {
				t.Errorf("got %s %s, want POST /search", got.Method, got.Path)
			}
			if a, want := got.Header.Get("Authorization"), "Bearer "+srv.Key; a != want {
				t.Errorf("got Authorization %q, want %q", a, want)
			}
			if ct := got.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", ct)
			}
			if string(got.Body) != tt.want {
				t.Errorf("upstream body:\n got %s\nwant %s", got.Body, tt.want)
			}
			if bytes.Contains(got.Body, []byte(srv.Key)) {
				t.Error("the API key is in the request body")
			}
			if string(rec.UpstreamRequest) != string(got.Body) {
				t.Errorf("record's request %s differs from what was sent %s", rec.UpstreamRequest, got.Body)
			}
		})
	}
}

func TestResults(t *testing.T) {
	t.Parallel()
	srv, c, clk := setup(t, nil)
	corpus := map[string]tavilytest.Document{}
	for _, d := range tavilytest.DefaultCorpus() {
		corpus[d.URL] = d
	}
	req := browser.Request{Query: "Globex Insights Series D funding", TopK: 3, IncludePage: true}
	rec, err := c.Search(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Results) == 0 {
		t.Fatal("got no results")
	}
	for _, r := range rec.Results {
		d, ok := corpus[r.URL]
		if !ok {
			t.Fatalf("result %s is not in the corpus", r.URL)
		}
		if r.Title != d.Title || r.Snippet != d.Snippet {
			t.Errorf("%s: got title %q snippet %q, want the document's", r.URL, r.Title, r.Snippet)
		}
		if r.Content != d.Page {
			t.Errorf("%s: got content %q, want the page text", r.URL, r.Content)
		}
		if d.Published != "" && r.PublishedAt != d.Published {
			t.Errorf("%s: got published_at %q, want %q", r.URL, r.PublishedAt, d.Published)
		}
		if r.Score <= 0 || r.Score >= 1 {
			t.Errorf("%s: got score %v, want in (0, 1)", r.URL, r.Score)
		}
	}
	if got, want := rec.Results[0].URL, "https://news.globex-insights.example/2026/11/series-d"; got != want {
		t.Errorf("got top result %s, want %s", got, want)
	}
	if rec.Provider != "tavily" || rec.RequestKey != browser.RequestKey(req) || !rec.Time.Equal(clk.Now()) {
		t.Errorf("got provider %q key %s time %v", rec.Provider, rec.RequestKey, rec.Time)
	}
	if len(rec.TopDomains) == 0 {
		t.Error("got no top domains")
	}
	// The raw response is the fake's answer, whole.
	var raw map[string]any
	if err := json.Unmarshal(rec.UpstreamResponse, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"query", "follow_up_questions", "answer", "images", "results", "response_time", "request_id"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("raw response lacks %s", k)
		}
	}
	_ = srv

	// Without include_page there is no page text.
	rec, err = c.Search(t.Context(), browser.Request{Query: "Globex Insights Series D funding", TopK: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rec.Results {
		if r.Content != "" {
			t.Errorf("%s: got content without include_page", r.URL)
		}
	}
}

func TestDedupeWithinCall(t *testing.T) {
	t.Parallel()
	_, c, _ := setup(t, nil)
	rec, err := c.Search(t.Context(), browser.Request{Query: "State of B2B Analytics 2026 survey of 600 buyers", TopK: 10})
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Results []struct{ URL string } `json:"results"`
	}
	if err := json.Unmarshal(rec.UpstreamResponse, &raw); err != nil {
		t.Fatal(err)
	}
	const page = "https://b2bpulse.example/reports/state-of-b2b-analytics-2026"
	upstream := 0
	for _, r := range raw.Results {
		if strings.TrimSuffix(r.URL, "/") == page {
			upstream++
		}
	}
	if upstream != 2 {
		t.Fatalf("the fake returned the report %d times, want 2 (the test needs a duplicate)", upstream)
	}
	kept := 0
	seen := map[string]bool{}
	for _, r := range rec.Results {
		if strings.TrimSuffix(r.URL, "/") == page {
			kept++
		}
		if seen[r.URL] {
			t.Errorf("%s appears twice", r.URL)
		}
		seen[r.URL] = true
	}
	if kept != 1 {
		t.Errorf("got the report %d times in results, want 1", kept)
	}
	if got, want := len(rec.Results), len(raw.Results)-1; got != want {
		t.Errorf("got %d results, want %d", got, want)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	at := newClock().Now().Add(3 * time.Second).Format(http.TimeFormat)
	tests := []struct {
		name       string
		faults     []tavilytest.Fault
		wantWaits  []time.Duration
		wantTries  int
		wantResult bool
	}{
		{"429 with Retry-After seconds", []tavilytest.Fault{tavilytest.RateLimited("2")}, []time.Duration{2 * time.Second}, 2, true},
		{"429 with Retry-After date", []tavilytest.Fault{tavilytest.RateLimited(at)}, []time.Duration{3 * time.Second}, 2, true},
		{"503 with Retry-After", []tavilytest.Fault{{Status: 503, RetryAfter: "1"}}, []time.Duration{time.Second}, 2, true},
		{"two 429s", []tavilytest.Fault{tavilytest.RateLimited("1"), tavilytest.RateLimited("4")}, []time.Duration{time.Second, 4 * time.Second}, 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, c, clk := setup(t, nil)
			srv.Inject(tt.faults...)
			rec, err := c.Search(t.Context(), browser.Request{Query: "crm market share"})
			if err != nil {
				t.Fatalf("got %v, want success after retrying", err)
			}
			if len(rec.Results) == 0 {
				t.Error("got no results")
			}
			if diff := cmp.Diff(tt.wantWaits, clk.Waits()); diff != "" {
				t.Errorf("waits (-want +got):\n%s", diff)
			}
			if got := len(srv.Requests()); got != tt.wantTries {
				t.Errorf("got %d requests, want %d", got, tt.wantTries)
			}
		})
	}
}

// TestRetryAfterRealClock runs one retry on the real clock, so the default
// sleeper is exercised too. It asserts what happened, not how long it took.
func TestRetryAfterRealClock(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	srv.Inject(tavilytest.RateLimited("1"))
	c, err := tavily.New(tavily.Config{APIKey: srv.Key, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.Search(t.Context(), browser.Request{Query: "acme pricing"})
	if err != nil {
		t.Fatalf("got %v, want success after one retry", err)
	}
	if len(rec.Results) == 0 || len(srv.Requests()) != 2 {
		t.Errorf("got %d results after %d requests, want results after 2", len(rec.Results), len(srv.Requests()))
	}
}

func TestBackoffJitter(t *testing.T) {
	t.Parallel()
	srv, c, clk := setup(t, nil)
	srv.Inject(tavilytest.ServerError(), tavilytest.ServerError(), tavilytest.ServerError(), tavilytest.ServerError())
	_, err := c.Search(t.Context(), browser.Request{Query: "acme"})
	fe := wantFault(t, err, fault.Upstream, http.StatusBadGateway)
	if !strings.Contains(fe.Message, "HTTP 500") || !strings.Contains(fe.Message, "4 attempts") {
		t.Errorf("got message %q, want it to name HTTP 500 and 4 attempts", fe.Message)
	}
	if got := len(srv.Requests()); got != tavily.DefaultMaxAttempts {
		t.Errorf("got %d requests, want %d", got, tavily.DefaultMaxAttempts)
	}
	// Exponential from 500ms, capped at 2s, with equal jitter: each wait
	// lies in [d/2, d].
	caps := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
	waits := clk.Waits()
	if len(waits) != len(caps) {
		t.Fatalf("got waits %v, want %d of them", waits, len(caps))
	}
	for i, w := range waits {
		if w < caps[i]/2 || w > caps[i] {
			t.Errorf("wait %d: got %v, want within [%v, %v]", i, w, caps[i]/2, caps[i])
		}
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		faults     []tavilytest.Fault
		mod        func(*tavily.Config)
		kind       fault.Kind
		status     int
		tries      int
		message    string // substring of the message
		suggestion string // substring of the suggestion
	}{
		{"401 bad key", nil, func(c *tavily.Config) { c.APIKey = "tvly-dev-not-a-real-key" },
			fault.UpstreamAuth, 502, 1, "Unauthorized: missing or invalid API key.", "TAVILY_API_KEY"},
		{"403", []tavilytest.Fault{{Status: 403, Detail: "Forbidden"}}, nil,
			fault.UpstreamAuth, 502, 1, "HTTP 403", "TAVILY_API_KEY"},
		{"432 plan limit", []tavilytest.Fault{tavilytest.PlanLimit()}, nil,
			fault.Quota, 429, 1, "plan's set usage limit", "plan"},
		{"433 pay-as-you-go limit", []tavilytest.Fault{tavilytest.PayGoLimit()}, nil,
			fault.Quota, 429, 1, "pay-as-you-go", "pay-as-you-go"},
		{"429 until attempts run out", []tavilytest.Fault{tavilytest.RateLimited("1"), tavilytest.RateLimited("1"), tavilytest.RateLimited("1"), tavilytest.RateLimited("1")}, nil,
			fault.Quota, 429, 4, "4 attempts", "wait"},
		{"429 asking for longer than the retry budget", []tavilytest.Fault{tavilytest.RateLimited("60")}, nil,
			fault.Quota, 429, 1, "retry budget", "wait"},
		{"429 asking for longer than the timeout", []tavilytest.Fault{tavilytest.RateLimited("5")}, func(c *tavily.Config) { c.Timeout = time.Second },
			fault.Quota, 429, 1, "would pass the 1s timeout", "wait"},
		{"500 until attempts run out", []tavilytest.Fault{tavilytest.ServerError(), tavilytest.ServerError(), tavilytest.ServerError()},
			func(c *tavily.Config) { c.MaxAttempts = 3 },
			fault.Upstream, 502, 3, "Internal Server Error", "try again"},
		{"400 from Tavily", []tavilytest.Fault{{Status: 400, Detail: "Invalid topic. Must be 'general' or 'news'."}}, nil,
			fault.BadInput, 400, 1, "Invalid topic", ""},
		{"wrong base path", nil, func(c *tavily.Config) { c.BaseURL += "/v9" },
			fault.Upstream, 502, 1, "HTTP 404", "TRIAD_TAVILY_URL"},
		{"slow answer", []tavilytest.Fault{tavilytest.Slow(time.Hour)}, func(c *tavily.Config) { c.Timeout = 200 * time.Millisecond; c.Sleep = nil },
			fault.Timeout, 504, 1, "Tavily did not answer within", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, c, _ := setup(t, tt.mod)
			srv.Inject(tt.faults...)
			rec, err := c.Search(t.Context(), browser.Request{Query: "acme analytics"})
			if rec != nil {
				t.Errorf("got a record %v with the error", rec)
			}
			fe := wantFault(t, err, tt.kind, tt.status)
			if !strings.Contains(fe.Message, tt.message) {
				t.Errorf("got message %q, want it to contain %q", fe.Message, tt.message)
			}
			if !strings.Contains(fe.Suggestion, tt.suggestion) {
				t.Errorf("got suggestion %q, want it to contain %q", fe.Suggestion, tt.suggestion)
			}
			if got := len(srv.Requests()); got != tt.tries {
				t.Errorf("got %d requests, want %d", got, tt.tries)
			}
		})
	}
}

func TestNotConfigured(t *testing.T) {
	t.Parallel()
	srv := tavilytest.NewServer(t)
	c, err := tavily.New(tavily.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatalf("building a client without a key: got %v, want success", err)
	}
	if c.Configured() {
		t.Error("Configured() = true without a key")
	}
	_, err = c.Search(t.Context(), browser.Request{Query: "acme"})
	fe := wantFault(t, err, fault.NotConfigured, http.StatusServiceUnavailable)
	if !strings.Contains(fe.Suggestion, "TAVILY_API_KEY") {
		t.Errorf("got suggestion %q, want it to name TAVILY_API_KEY", fe.Suggestion)
	}
	if got := len(srv.Requests()); got != 0 {
		t.Errorf("got %d upstream requests, want 0", got)
	}
}

func TestInvalidRequestNotSent(t *testing.T) {
	t.Parallel()
	srv, c, _ := setup(t, nil)
	_, err := c.Search(t.Context(), browser.Request{Query: "q", TopK: 50})
	fe := wantFault(t, err, fault.BadInput, http.StatusBadRequest)
	if !strings.HasPrefix(fe.Message, "top_k") {
		t.Errorf("got message %q, want it to name top_k", fe.Message)
	}
	if got := len(srv.Requests()); got != 0 {
		t.Errorf("got %d upstream requests, want 0", got)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	// A port that was just free and is now closed refuses connections.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	clk := newClock()
	c, err := tavily.New(tavily.Config{APIKey: "tvly-dev-x", BaseURL: "http://" + addr, Now: clk.Now, Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Search(t.Context(), browser.Request{Query: "acme"})
	fe := wantFault(t, err, fault.Unavailable, http.StatusServiceUnavailable)
	if !strings.Contains(fe.Suggestion, "TRIAD_TAVILY_URL") {
		t.Errorf("got suggestion %q, want it to name TRIAD_TAVILY_URL", fe.Suggestion)
	}
	if got := len(clk.Waits()); got != tavily.DefaultMaxAttempts-1 {
		t.Errorf("got %d waits, want %d (transport errors are retried)", got, tavily.DefaultMaxAttempts-1)
	}
}

func TestBrokenConnection(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		// Promise a body, send half, hang up.
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"query\":"))
		conn.Close()
	}))
	t.Cleanup(srv.Close)
	clk := newClock()
	c, err := tavily.New(tavily.Config{APIKey: "tvly-dev-x", BaseURL: srv.URL, MaxAttempts: 2, Now: clk.Now, Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Search(t.Context(), browser.Request{Query: "acme"})
	wantFault(t, err, fault.Upstream, http.StatusBadGateway)
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("got %d calls, want 2", calls)
	}
}

func TestNotJSONAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html>captive portal</html>"))
	}))
	t.Cleanup(srv.Close)
	c, err := tavily.New(tavily.Config{APIKey: "tvly-dev-x", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Search(t.Context(), browser.Request{Query: "acme"})
	wantFault(t, err, fault.Upstream, http.StatusBadGateway)
}

func TestCallerCancels(t *testing.T) {
	t.Parallel()
	srv, c, _ := setup(t, func(c *tavily.Config) { c.Sleep = nil })
	srv.Inject(tavilytest.Slow(time.Hour))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		// Cancel once the request is in flight.
		for len(srv.Requests()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := c.Search(ctx, browser.Request{Query: "acme"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if fe := fault.As(err); fe != nil {
		t.Errorf("got fault %s, want the caller's own cancellation", fe.Kind)
	}
}

// TestKeyNeverLeaks drives every path (success, retries, auth failure,
// server errors, timeout) with debug logging on and checks that the key
// appears in no log line, record or error.
func TestKeyNeverLeaks(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, c, _ := setup(t, func(c *tavily.Config) { c.Logger = logger; c.Timeout = 2 * time.Second })
	bad, err := tavily.New(tavily.Config{APIKey: srv.Key + "x", BaseURL: srv.URL, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	check := func(rec *browser.Record, err error) {
		if rec != nil {
			b, merr := rec.Marshal()
			if merr != nil {
				t.Fatal(merr)
			}
			out = append(out, b)
		}
		if err != nil {
			out = append(out, []byte(err.Error()))
			if fe := fault.As(err); fe != nil {
				out = append(out, []byte(fe.Suggestion))
			}
		}
	}
	req := browser.Request{Query: "acme analytics pricing", IncludePage: true}
	check(c.Search(t.Context(), req))
	srv.Inject(tavilytest.RateLimited("1"), tavilytest.ServerError())
	check(c.Search(t.Context(), req))
	srv.Inject(tavilytest.ServerError(), tavilytest.ServerError(), tavilytest.ServerError(), tavilytest.ServerError())
	check(c.Search(t.Context(), req))
	srv.Inject(tavilytest.Slow(time.Hour))
	check(c.Search(t.Context(), req))
	check(bad.Search(t.Context(), req))

	logMu.Lock()
	out = append(out, logs.Bytes())
	logMu.Unlock()
	if logs.Len() == 0 {
		t.Fatal("no log output; the test needs debug lines to inspect")
	}
	for i, b := range out {
		if bytes.Contains(b, []byte(srv.Key)) {
			t.Errorf("output %d contains the API key:\n%s", i, b)
		}
	}
	for _, r := range srv.Requests() {
		if bytes.Contains(r.Body, []byte(srv.Key)) {
			t.Errorf("a request body contains the API key: %s", r.Body)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestEchoedKeyIsScrubbed covers an upstream (or proxy) that echoes the key
// in its answer or error text: it must not reach the record or the error.
func TestEchoedKeyIsScrubbed(t *testing.T) {
	t.Parallel()
	const key = "tvly-dev-echoed-0123456789"
	var fail atomic.Bool
	fail.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if fail.Load() {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"detail":{"error":"key ` + key + ` is invalid"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"query":"q","echo":"` + key + `","results":[{"url":"https://a.example/` + key + `","title":"t","content":"c","score":0.5,"raw_content":null}],"response_time":0.1,"request_id":"r"}`))
	}))
	t.Cleanup(srv.Close)
	c, err := tavily.New(tavily.Config{APIKey: key, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Search(t.Context(), browser.Request{Query: "q"})
	wantFault(t, err, fault.UpstreamAuth, http.StatusBadGateway)
	if strings.Contains(err.Error(), key) {
		t.Errorf("error contains the key: %v", err)
	}
	fail.Store(false)
	rec, err := c.Search(t.Context(), browser.Request{Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(key)) || !bytes.Contains(b, []byte("[redacted]")) {
		t.Errorf("record not scrubbed:\n%s", b)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  tavily.Config
		ok   bool
	}{
		{"zero config", tavily.Config{}, true},
		{"key with surrounding newline", tavily.Config{APIKey: "tvly-dev-abc\n"}, true},
		{"trailing slash", tavily.Config{BaseURL: "http://127.0.0.1:1/"}, true},
		{"key with a space inside", tavily.Config{APIKey: "tvly-dev secret"}, false},
		{"no scheme", tavily.Config{BaseURL: "api.tavily.com"}, false},
		{"ftp", tavily.Config{BaseURL: "ftp://api.tavily.com"}, false},
		{"query", tavily.Config{BaseURL: "https://api.tavily.com?x=1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := tavily.New(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("got %v, want ok=%v", err, tt.ok)
			}
			if err != nil && tt.cfg.APIKey != "" && strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q shows the key", err)
			}
			if c != nil {
				if err := c.Close(); err != nil {
					t.Error(err)
				}
				if err := c.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
			}
		})
	}
}

func TestPublishedAtNormalised(t *testing.T) {
	t.Parallel()
	dates := map[string]string{
		"https://a.example/1": "Thu, 19 Nov 2026 14:00:00 GMT",
		"https://a.example/2": "2026-11-19",
		"https://a.example/3": "2026-11-19T15:00:00+01:00",
		"https://a.example/4": "last Tuesday",
		"https://a.example/5": "",
	}
	want := map[string]string{
		"https://a.example/1": "2026-11-19T14:00:00Z",
		"https://a.example/2": "2026-11-19",
		"https://a.example/3": "2026-11-19T14:00:00Z",
		"https://a.example/4": "last Tuesday",
		"https://a.example/5": "",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rs []map[string]any
		for _, u := range []string{"https://a.example/1", "https://a.example/2", "https://a.example/3", "https://a.example/4", "https://a.example/5"} {
			m := map[string]any{"url": u, "title": "t", "content": "c", "score": 0.5, "raw_content": nil}
			if dates[u] != "" {
				m["published_date"] = dates[u]
			}
			rs = append(rs, m)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"query": "q", "results": rs, "response_time": 0.1})
	}))
	t.Cleanup(srv.Close)
	c, err := tavily.New(tavily.Config{APIKey: "tvly-dev-x", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.Search(t.Context(), browser.Request{Query: "q"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range rec.Results {
		got[r.URL] = r.PublishedAt
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("published_at (-want +got):\n%s", diff)
	}
}
