// Package tavilytest is an honest fake of Tavily's search API: an http.Handler that checks requests as Tavily does and answers from a fixed corpus in Tavily's response shape.
//
// Use NewServer in tests:
//
//	srv := tavilytest.NewServer(t)
//	client, _ := tavily.New(tavily.Config{APIKey: srv.Key, BaseURL: srv.URL})
//
// The fake checks the bearer key, the method, the path and every body field
// Tavily documents (types, enums and ranges), answers 401, 400, 404 and 405
// with Tavily's error shape, and ranks documents by simple term scoring. It
// honours max_results, include_domains, exclude_domains, time_range,
// start_date, end_date, topic, include_raw_content, include_answer,
// search_depth with chunks_per_source, include_favicon and include_usage.
//
// It differs from Tavily on purpose in two ways, both to catch client bugs:
// an unknown body field is refused with 400 (Tavily may ignore it), and so is
// an api_key in the body (older Tavily versions accepted one; a client must
// never send it).
//
// Faults are scripted with Inject: each queued Fault answers one request
// (429 with Retry-After, 432, 433, 500, a slow answer, ...). Every request
// is recorded, fault or not, so tests can assert exactly what a client sent.
package tavilytest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Config configures a Handler.
type Config struct {
	// Keys are the API keys the fake accepts as "Authorization: Bearer
	// <key>". With none, every request is refused with 401.
	Keys []string
	// Corpus is what searches match; nil means DefaultCorpus().
	Corpus []Document
	// Now is the fake's clock for time_range; zero means CorpusNow.
	Now time.Time
}

// Handler is the fake Tavily API. It is safe for concurrent use.
type Handler struct {
	keys map[string]bool
	ix   *index
	now  time.Time

	mu       sync.Mutex
	faults   []Fault
	requests []Request
	seq      int
}

// NewHandler returns a fake serving cfg. It panics on a malformed corpus,
// which is a bug in the test that supplied it.
func NewHandler(cfg Config) *Handler {
	docs := cfg.Corpus
	if docs == nil {
		docs = DefaultCorpus()
	}
	ix, err := newIndex(docs)
	if err != nil {
		panic("tavilytest: " + err.Error())
	}
	h := &Handler{keys: map[string]bool{}, ix: ix, now: cfg.Now}
	if h.now.IsZero() {
		h.now = CorpusNow
	}
	for _, k := range cfg.Keys {
		h.keys[k] = true
	}
	return h
}

// Server is a Handler served by an httptest.Server on loopback.
type Server struct {
	*Handler
	// URL is the base URL to configure a client with (no trailing slash).
	URL string
	// Key is an API key the server accepts, random per server.
	Key string
	srv *httptest.Server
}

// NewServer starts a fake with a fresh random key and the default corpus,
// and closes it when the test ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	key := NewKey()
	return NewServerConfig(t, Config{Keys: []string{key}})
}

// NewServerConfig starts a fake with cfg and closes it when the test ends.
// Server.Key is cfg.Keys[0], or "" when cfg has none.
func NewServerConfig(t testing.TB, cfg Config) *Server {
	t.Helper()
	h := NewHandler(cfg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &Server{Handler: h, URL: srv.URL, srv: srv}
	if len(cfg.Keys) > 0 {
		s.Key = cfg.Keys[0]
	}
	return s
}

// Close stops the server; it is safe to call twice (the test's cleanup
// calls it again).
func (s *Server) Close() { s.srv.Close() }

// NewKey returns a random key shaped like Tavily's ("tvly-dev-" and 32 hex
// digits), so tests never share a key by accident.
func NewKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("tavilytest: " + err.Error())
	}
	return "tvly-dev-" + hex.EncodeToString(b)
}

// Request is one request the fake received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Fields decodes the body as a JSON object, or returns nil if it is not
// one.
func (r Request) Fields() map[string]any {
	var m map[string]any
	if json.Unmarshal(r.Body, &m) != nil {
		return nil
	}
	return m
}

// Requests returns every request received so far, oldest first.
func (h *Handler) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.requests)
}

// Fault scripts one answer. The zero Status answers normally (after Delay).
type Fault struct {
	// Status is the HTTP status to answer with, e.g. 429, 432, 500.
	Status int
	// RetryAfter is sent as the Retry-After header when not empty: delay
	// seconds ("2") or an HTTP date.
	RetryAfter string
	// Delay holds the answer back this long, or until the client gives up.
	Delay time.Duration
	// Detail replaces Tavily's error text for Status.
	Detail string
}

// RateLimited is Tavily's 429, with a Retry-After header when retryAfter is
// not empty.
func RateLimited(retryAfter string) Fault {
	return Fault{Status: http.StatusTooManyRequests, RetryAfter: retryAfter}
}

// PlanLimit is Tavily's 432: the key's or plan's usage limit is exceeded.
func PlanLimit() Fault { return Fault{Status: 432} }

// PayGoLimit is Tavily's 433: the pay-as-you-go limit is exceeded.
func PayGoLimit() Fault { return Fault{Status: 433} }

// ServerError is Tavily's 500.
func ServerError() Fault { return Fault{Status: http.StatusInternalServerError} }

// Slow answers normally after d (or not at all if the client gives up
// first).
func Slow(d time.Duration) Fault { return Fault{Delay: d} }

// Inject queues faults; each answers the next request in order, after which
// the fake answers normally again.
func (h *Handler) Inject(faults ...Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, faults...)
}

// Pending returns how many injected faults are still queued.
func (h *Handler) Pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.faults)
}

// Tavily's error texts, from its API reference.
var details = map[int]string{
	http.StatusUnauthorized:        "Unauthorized: missing or invalid API key.",
	http.StatusTooManyRequests:     "Your request has been blocked due to excessive requests. Please reduce rate of requests.",
	432:                            "This request exceeds your plan's set usage limit. Please upgrade your plan or contact support@tavily.com",
	433:                            "This request exceeds the pay-as-you-go limit. You can increase your limit on the Tavily dashboard.",
	http.StatusInternalServerError: "Internal Server Error",
}

// maxBody bounds what the fake reads; Tavily's requests are small.
const maxBody = 1 << 20

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "Could not read the request body.")
		return
	}
	h.mu.Lock()
	h.requests = append(h.requests, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	h.seq++
	seq := h.seq
	var f *Fault
	if len(h.faults) > 0 {
		f = &h.faults[0]
		h.faults = h.faults[1:]
	}
	h.mu.Unlock()

	if f != nil {
		if f.Delay > 0 {
			t := time.NewTimer(f.Delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		if f.Status != 0 {
			if f.RetryAfter != "" {
				w.Header().Set("Retry-After", f.RetryAfter)
			}
			d := f.Detail
			if d == "" {
				d = details[f.Status]
			}
			if d == "" {
				d = http.StatusText(f.Status)
			}
			writeError(w, f.Status, d)
			return
		}
	}

	if r.URL.Path != "/search" {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !h.keys[key] {
		writeError(w, http.StatusUnauthorized, details[http.StatusUnauthorized])
		return
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "Request body too large.")
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusBadRequest, "Content-Type must be application/json.")
		return
	}
	q, msg := parseSearch(body)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	writeJSON(w, http.StatusOK, h.search(q, body, seq))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]map[string]string{"detail": {"error": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// search is a parsed, valid /search body.
type search struct {
	Query            string
	Depth            string
	Topic            string
	MaxResults       int
	ChunksPerSource  int
	TimeRange        string
	StartDate        time.Time
	EndDate          time.Time
	Days             int
	IncludeAnswer    string // "", "basic" or "advanced"
	RawContent       string // "", "markdown" or "text"
	IncludeImages    bool
	IncludeFavicon   bool
	IncludeUsage     bool
	AutoParameters   bool
	IncludeDomains   []string
	ExcludeDomains   []string
	HasStart, HasEnd bool
}

// parseSearch checks a body field by field as Tavily documents them and
// returns the parsed search or Tavily-style error text.
func parseSearch(body []byte) (search, string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return search{}, "Invalid JSON body: expected a JSON object."
	}
	s := search{Depth: "basic", Topic: "general", MaxResults: 5, ChunksPerSource: 3}
	if _, ok := m["api_key"]; ok {
		return s, "api_key must not be sent in the body; send it as 'Authorization: Bearer <key>'."
	}
	for k := range m {
		if !knownFields[k] {
			return s, fmt.Sprintf("Unknown parameter: %s.", k)
		}
	}
	str := func(k string, dst *string) string {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			return ""
		}
		if json.Unmarshal(raw, dst) != nil {
			return fmt.Sprintf("Invalid %s. Must be a string.", k)
		}
		return ""
	}
	boolean := func(k string, dst *bool) string {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			return ""
		}
		if json.Unmarshal(raw, dst) != nil {
			return fmt.Sprintf("Invalid %s. Must be a boolean.", k)
		}
		return ""
	}
	integer := func(k string, dst *int, lo, hi int) string {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			return ""
		}
		var f float64
		if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) {
			return fmt.Sprintf("Invalid %s. Must be an integer.", k)
		}
		if f < float64(lo) || f > float64(hi) {
			return fmt.Sprintf("Invalid %s. Must be between %d and %d.", k, lo, hi)
		}
		*dst = int(f)
		return ""
	}
	oneOf := func(k, v string, allowed ...string) string {
		if v != "" && !slices.Contains(allowed, v) {
			return fmt.Sprintf("Invalid %s. Must be one of: %s.", k, strings.Join(allowed, ", "))
		}
		return ""
	}
	boolOrEnum := func(k string, dst *string, allowed ...string) string {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			return ""
		}
		var b bool
		if json.Unmarshal(raw, &b) == nil {
			if b {
				*dst = allowed[0]
			}
			return ""
		}
		var v string
		if json.Unmarshal(raw, &v) != nil || !slices.Contains(allowed, v) {
			return fmt.Sprintf("Invalid %s. Must be a boolean or one of: %s.", k, strings.Join(allowed, ", "))
		}
		*dst = v
		return ""
	}
	domains := func(k string, dst *[]string, limit int) string {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			return ""
		}
		if json.Unmarshal(raw, dst) != nil {
			return fmt.Sprintf("Invalid %s. Must be a list of strings.", k)
		}
		if len(*dst) > limit {
			return fmt.Sprintf("Too many %s. Maximum is %d.", k, limit)
		}
		return ""
	}
	date := func(k string, dst *time.Time, has *bool) string {
		var v string
		if msg := str(k, &v); msg != "" || v == "" {
			return msg
		}
		t, err := time.Parse(time.DateOnly, v)
		if err != nil || len(v) != len(time.DateOnly) {
			return fmt.Sprintf("Invalid %s. Required to be written in the format YYYY-MM-DD.", k)
		}
		*dst, *has = t, true
		return ""
	}
	var depth, topic string
	checks := []func() string{
		func() string {
			if msg := str("query", &s.Query); msg != "" {
				return msg
			}
			switch n := utf8.RuneCountInString(s.Query); {
			case strings.TrimSpace(s.Query) == "":
				return "Query is missing."
			case n > 400:
				return "Query is too long. Max query length is 400 characters."
			}
			return ""
		},
		func() string { return str("search_depth", &depth) },
		func() string { return oneOf("search_depth", depth, "basic", "advanced", "fast", "ultra-fast") },
		func() string { return str("topic", &topic) },
		func() string { return oneOf("topic", topic, "general", "news", "finance") },
		func() string { return integer("max_results", &s.MaxResults, 0, 20) },
		func() string { return integer("chunks_per_source", &s.ChunksPerSource, 1, 3) },
		func() string { return integer("days", &s.Days, 1, 3650) },
		func() string { return str("time_range", &s.TimeRange) },
		func() string {
			return oneOf("time_range", s.TimeRange, "day", "week", "month", "year", "d", "w", "m", "y")
		},
		func() string { return date("start_date", &s.StartDate, &s.HasStart) },
		func() string { return date("end_date", &s.EndDate, &s.HasEnd) },
		func() string {
			if s.HasStart && s.HasEnd && s.StartDate.After(s.EndDate) {
				return "Invalid date range. start_date must be before end_date."
			}
			return ""
		},
		func() string { return boolOrEnum("include_answer", &s.IncludeAnswer, "basic", "advanced") },
		func() string { return boolOrEnum("include_raw_content", &s.RawContent, "markdown", "text") },
		func() string { return boolean("include_images", &s.IncludeImages) },
		func() string { var b bool; return boolean("include_image_descriptions", &b) },
		func() string { return boolean("include_favicon", &s.IncludeFavicon) },
		func() string { return boolean("include_usage", &s.IncludeUsage) },
		func() string { return boolean("auto_parameters", &s.AutoParameters) },
		func() string { var b bool; return boolean("exact_match", &b) },
		func() string { var c string; return str("country", &c) },
		func() string { return domains("include_domains", &s.IncludeDomains, 300) },
		func() string { return domains("exclude_domains", &s.ExcludeDomains, 150) },
	}
	for _, check := range checks {
		if msg := check(); msg != "" {
			return s, msg
		}
	}
	if depth != "" {
		s.Depth = depth
	}
	if topic != "" {
		s.Topic = topic
	}
	return s, ""
}

// knownFields are the /search body fields in Tavily's API reference.
var knownFields = map[string]bool{
	"query": true, "search_depth": true, "chunks_per_source": true, "max_results": true, "topic": true,
	"time_range": true, "start_date": true, "end_date": true, "days": true, "include_answer": true,
	"include_raw_content": true, "include_images": true, "include_image_descriptions": true,
	"include_favicon": true, "include_domains": true, "exclude_domains": true, "country": true,
	"auto_parameters": true, "exact_match": true, "include_usage": true,
}

// result is one entry of a /search answer, in Tavily's field order.
type result struct {
	URL           string  `json:"url"`
	Title         string  `json:"title"`
	Content       string  `json:"content"`
	Score         float64 `json:"score"`
	RawContent    *string `json:"raw_content"`
	PublishedDate string  `json:"published_date,omitempty"`
	Favicon       string  `json:"favicon,omitempty"`
}

// response is a /search answer, in Tavily's field order.
type response struct {
	Query             string            `json:"query"`
	FollowUpQuestions []string          `json:"follow_up_questions"`
	Answer            *string           `json:"answer"`
	Images            []any             `json:"images"`
	Results           []result          `json:"results"`
	AutoParameters    map[string]string `json:"auto_parameters,omitempty"`
	ResponseTime      float64           `json:"response_time"`
	Usage             map[string]int    `json:"usage,omitempty"`
	RequestID         string            `json:"request_id"`
}

// requestIDSpace makes request ids deterministic: the same request as the
// same numbered request of a fake gets the same id.
var requestIDSpace = uuid.MustParse("6f1c3a52-6c1e-4d55-9a53-3a7b2f0e9d10")

func (h *Handler) search(s search, body []byte, seq int) response {
	qterms := terms(s.Query)
	type hit struct {
		d     *indexed
		score float64
	}
	var hits []hit
	for i := range h.ix.docs {
		d := &h.ix.docs[i]
		if !h.admits(d, s) {
			continue
		}
		if sc := h.ix.score(d, qterms); sc > 0 {
			hits = append(hits, hit{d, sc})
		}
	}
	slices.SortStableFunc(hits, func(a, b hit) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.d.URL, b.d.URL)
	})
	hits = hits[:min(s.MaxResults, len(hits))]

	resp := response{Query: s.Query, Images: []any{}, Results: []result{}}
	for _, ht := range hits {
		d := ht.d
		r := result{URL: d.URL, Title: d.Title, Content: d.Snippet, Score: math.Round(ht.score*1e8) / 1e8}
		if (s.Depth == "advanced" || s.Depth == "fast") && len(qterms) > 0 {
			if cs := d.chunks(qterms, s.ChunksPerSource); len(cs) > 0 {
				r.Content = strings.Join(cs, " [...] ")
			}
		}
		switch s.RawContent {
		case "markdown":
			p := d.Page
			r.RawContent = &p
		case "text":
			p := plainText(d.Page)
			r.RawContent = &p
		}
		if !d.published.IsZero() {
			r.PublishedDate = d.published.Format(http.TimeFormat)
		}
		if s.IncludeFavicon {
			r.Favicon = "https://" + d.host + "/favicon.ico"
		}
		resp.Results = append(resp.Results, r)
	}
	if s.IncludeAnswer != "" {
		// Not an LLM: the answer stitches the top snippets together,
		// which is enough for callers that only check it is there.
		var parts []string
		for _, r := range resp.Results[:min(2, len(resp.Results))] {
			parts = append(parts, r.Content)
		}
		a := strings.Join(parts, " ")
		if a == "" {
			a = "No answer could be found for this query."
		}
		resp.Answer = &a
	}
	if s.AutoParameters {
		resp.AutoParameters = map[string]string{"topic": s.Topic, "search_depth": s.Depth}
	}
	if s.IncludeUsage {
		credits := 1
		if s.Depth == "advanced" {
			credits = 2
		}
		resp.Usage = map[string]int{"credits": credits}
	}
	// Synthetic but plausible, and deterministic so recorded answers can
	// be compared byte for byte.
	resp.ResponseTime = math.Round((0.35+0.04*float64(len(resp.Results)))*100) / 100
	resp.RequestID = uuid.NewSHA1(requestIDSpace, append([]byte(strconv.Itoa(seq)+"\n"), body...)).String()
	return resp
}

// admits applies the filters: domains, topic and dates. Undated documents
// pass no date filter, as Tavily filters on publish or update dates.
func (h *Handler) admits(d *indexed, s search) bool {
	if len(s.IncludeDomains) > 0 && !slices.ContainsFunc(s.IncludeDomains, func(dom string) bool { return hostMatches(d.host, dom) }) {
		return false
	}
	if slices.ContainsFunc(s.ExcludeDomains, func(dom string) bool { return hostMatches(d.host, dom) }) {
		return false
	}
	dated := s.TimeRange != "" || s.HasStart || s.HasEnd || s.Topic == "news"
	if !dated {
		return true
	}
	if d.published.IsZero() {
		return false
	}
	if s.TimeRange != "" {
		var from time.Time
		switch s.TimeRange {
		case "day", "d":
			from = h.now.Add(-24 * time.Hour)
		case "week", "w":
			from = h.now.AddDate(0, 0, -7)
		case "month", "m":
			from = h.now.AddDate(0, -1, 0)
		case "year", "y":
			from = h.now.AddDate(-1, 0, 0)
		}
		if d.published.Before(from) || d.published.After(h.now) {
			return false
		}
	}
	if s.Topic == "news" && s.Days > 0 && d.published.Before(h.now.AddDate(0, 0, -s.Days)) {
		return false
	}
	if s.HasStart && d.published.Before(s.StartDate) {
		return false
	}
	// end_date is inclusive: the whole end day counts.
	if s.HasEnd && !d.published.Before(s.EndDate.AddDate(0, 0, 1)) {
		return false
	}
	return true
}

// hostMatches reports whether host is domain or one of its subdomains.
func hostMatches(host, domain string) bool {
	domain = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(domain)), ".")
	domain = strings.TrimPrefix(strings.TrimPrefix(domain, "https://"), "http://")
	return domain != "" && (host == domain || strings.HasSuffix(host, "."+domain))
}
