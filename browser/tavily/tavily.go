// Package tavily is the browser.Provider that searches the web through Tavily's REST API (POST /search).
//
// The API key travels only in the Authorization header. It is never put in
// the body, the record, an error message or a log line: the record keeps the
// body exactly as sent, and error text from Tavily is scrubbed of the key
// before it is shown.
package tavily

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
)

// Defaults for the zero fields of Config.
const (
	DefaultBaseURL     = "https://api.tavily.com"
	DefaultTimeout     = 30 * time.Second
	DefaultMaxAttempts = 4
	DefaultRetryBudget = 20 * time.Second
	DefaultMinBackoff  = 500 * time.Millisecond
	DefaultMaxBackoff  = 8 * time.Second
)

// MaxResponseBytes bounds the body read from Tavily. Twenty results with
// page text are a few megabytes; anything near this is not a search answer.
const MaxResponseBytes = 64 << 20

// Name is the provider name recorded in citations records.
const Name = "tavily"

// Config configures a Client. The zero value is usable: it searches the real
// Tavily with the defaults above and, lacking a key, answers every search
// with fault.NotConfigured.
type Config struct {
	// APIKey is the Tavily key (TAVILY_API_KEY). Empty is allowed: the
	// client is built and Search reports fault.NotConfigured.
	APIKey string
	// BaseURL is Tavily's address (TRIAD_TAVILY_URL), for proxies and
	// tests; "/search" is appended. Default DefaultBaseURL.
	BaseURL string
	// Timeout bounds one Search call, retries and waits included.
	Timeout time.Duration
	// MaxAttempts bounds the requests one Search sends (first try
	// included).
	MaxAttempts int
	// RetryBudget bounds the time after the first attempt's start within
	// which a retry may still start: a retry whose wait would end later is
	// not made and the last failure is returned.
	RetryBudget time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait
	// between retries when Tavily gives no Retry-After.
	MinBackoff, MaxBackoff time.Duration
	// HTTPClient sends the requests. Nil means a client of the package's
	// own that does not follow redirects (a redirected POST would silently
	// become a GET).
	HTTPClient *http.Client
	// Logger receives one debug line per attempt and a warning per retry;
	// nil is silent.
	Logger *slog.Logger
	// Now and Sleep replace the clock for tests that drive backoff
	// without waiting. Nil means time.Now and a timer that stops when ctx
	// ends.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
}

// Client searches through Tavily. It is safe for concurrent use.
type Client struct {
	key       string
	endpoint  string
	cfg       Config
	http      *http.Client
	ownClient bool
	log       *slog.Logger
	closeOnce sync.Once
}

var _ browser.Provider = (*Client)(nil)

// New checks cfg and returns a client. It opens nothing. An empty APIKey is
// not an error (see Config.APIKey); a malformed BaseURL or a key with
// whitespace or control characters inside is.
func New(cfg Config) (*Client, error) {
	key := strings.TrimSpace(cfg.APIKey)
	if strings.IndexFunc(key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		// Never echo the key: this error ends up in logs.
		return nil, errors.New("tavily: TAVILY_API_KEY contains whitespace or control characters")
	}
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("tavily: base URL %q must be an http or https URL without query or fragment", redactURL(base))
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.RetryBudget <= 0 {
		cfg.RetryBudget = DefaultRetryBudget
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	c := &Client{
		key:      key,
		endpoint: strings.TrimSuffix(u.String(), "/") + "/search",
		cfg:      cfg,
		http:     cfg.HTTPClient,
		log:      cfg.Logger,
	}
	c.cfg.APIKey = "" // keep exactly one copy of the key
	if c.http == nil {
		c.ownClient = true
		c.http = &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Name implements browser.Provider.
func (c *Client) Name() string { return Name }

// Configured reports whether the client has a key; without one every Search
// answers fault.NotConfigured.
func (c *Client) Configured() bool { return c.key != "" }

// Close releases idle connections of the client's own transport. It is safe
// to call twice; Search still works after it (connections are reopened).
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if c.ownClient {
			c.http.CloseIdleConnections()
		}
	})
	return nil
}

// searchRequest is the body of POST /search. Only the fields the contract
// maps onto are sent, so every other parameter keeps Tavily's default
// (search_depth basic, topic general, no answer, no images).
type searchRequest struct {
	Query      string `json:"query"`
	MaxResults int    `json:"max_results"`
	// IncludeRawContent is false or "markdown": Tavily takes a boolean or
	// "markdown"/"text", and "markdown" keeps headings and lists.
	IncludeRawContent any      `json:"include_raw_content"`
	IncludeDomains    []string `json:"include_domains,omitempty"`
	TimeRange         string   `json:"time_range,omitempty"`
	StartDate         string   `json:"start_date,omitempty"`
	EndDate           string   `json:"end_date,omitempty"`
}

// searchResponse holds the fields of Tavily's answer the client reads; the
// record keeps the whole answer.
type searchResponse struct {
	Results []struct {
		URL           string  `json:"url"`
		Title         string  `json:"title"`
		Content       string  `json:"content"`
		Score         float64 `json:"score"`
		RawContent    *string `json:"raw_content"`
		PublishedDate string  `json:"published_date"`
	} `json:"results"`
	RequestID string `json:"request_id"`
}

// Body returns the JSON body the client sends to Tavily for req: the
// contract-to-Tavily mapping in one place. req should be valid.
func Body(req browser.Request) ([]byte, error) {
	n := req.Normalized()
	body := searchRequest{
		Query:             n.Query,
		MaxResults:        n.TopK,
		IncludeRawContent: false,
		IncludeDomains:    n.AllowDomains,
	}
	if n.IncludePage {
		body.IncludeRawContent = "markdown"
	}
	if n.DateRange != "" {
		dr, err := browser.ParseDateRange(n.DateRange)
		if err != nil {
			return nil, err
		}
		body.TimeRange, body.StartDate, body.EndDate = dr.Relative, dr.Start, dr.End
	}
	return json.Marshal(body)
}

// Search implements browser.Provider.
func (c *Client) Search(ctx context.Context, req browser.Request) (*browser.Record, error) {
	if c.key == "" {
		return nil, fault.New(fault.NotConfigured, "web search is not configured: no Tavily API key",
			"set TAVILY_API_KEY to a Tavily API key (from https://app.tavily.com) and restart the server")
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	body, err := Body(req)
	if err != nil {
		return nil, err
	}
	start := c.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	limit := c.cfg.Timeout
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	key := browser.RequestKey(req)

	var last *attemptError
	for attempt := 1; ; attempt++ {
		raw, aerr := c.attempt(ctx, body)
		if aerr == nil {
			return c.record(ctx, req, body, raw, start)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, contextFault(ctx, ctxErr, limit, last)
		}
		last = aerr
		c.log.DebugContext(ctx, "tavily search attempt failed", "request_key", key, "attempt", attempt, "status", aerr.status, "error", aerr.fault.Message)
		if !aerr.retry {
			return nil, aerr.final()
		}
		if attempt >= c.cfg.MaxAttempts {
			return nil, aerr.exhausted(attempt, "")
		}
		wait := aerr.retryAfter
		if wait < 0 {
			wait = c.backoff(attempt)
		}
		if spent := c.cfg.Now().Sub(start); spent+wait > c.cfg.RetryBudget {
			return nil, aerr.exhausted(attempt, fmt.Sprintf("the next retry (in %s) would pass the %s retry budget", wait.Round(time.Millisecond), c.cfg.RetryBudget))
		}
		// The deadline is on the real clock whatever Now is.
		if dl, ok := ctx.Deadline(); ok && wait > time.Until(dl) {
			return nil, aerr.exhausted(attempt, fmt.Sprintf("the next retry (in %s) would pass the %s timeout", wait.Round(time.Millisecond), limit.Round(time.Millisecond)))
		}
		c.log.WarnContext(ctx, "tavily search retrying", "request_key", key, "attempt", attempt, "status", aerr.status, "wait", wait)
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return nil, contextFault(ctx, err, limit, last)
		}
	}
}

// record turns a 200 answer into the call's record.
func (c *Client) record(ctx context.Context, req browser.Request, body, raw []byte, start time.Time) (*browser.Record, error) {
	raw = c.scrub(ctx, raw)
	var resp searchResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fault.Wrap(fault.Upstream, err, "Tavily answered 200 with a body that is not a search response",
			"check that TRIAD_TAVILY_URL points at Tavily's API (default "+DefaultBaseURL+")")
	}
	results := make([]browser.Result, 0, len(resp.Results))
	for _, r := range resp.Results {
		res := browser.Result{
			URL:         r.URL,
			Title:       r.Title,
			Snippet:     r.Content,
			PublishedAt: normalizeDate(r.PublishedDate),
			Score:       r.Score,
		}
		if req.IncludePage && r.RawContent != nil {
			res.Content = *r.RawContent
		}
		results = append(results, res)
	}
	rec := browser.NewRecord(Name, req, body, raw, results, start)
	c.log.DebugContext(ctx, "tavily search done", "request_key", rec.RequestKey, "results", len(rec.Results), "tavily_request_id", resp.RequestID)
	return rec, nil
}

// scrub removes the key from an upstream answer should Tavily (or a proxy)
// ever echo it: the answer is stored as a run file, and the key must never
// reach one.
func (c *Client) scrub(ctx context.Context, b []byte) []byte {
	if len(c.key) < 8 || !bytes.Contains(b, []byte(c.key)) {
		return b
	}
	c.log.WarnContext(ctx, "tavily answer contained the API key; it was redacted before storing")
	return bytes.ReplaceAll(b, []byte(c.key), []byte("[redacted]"))
}

// attemptError is one failed attempt, classified.
type attemptError struct {
	status int  // HTTP status, 0 for a transport failure
	retry  bool // worth another attempt
	// retryAfter is Tavily's Retry-After, or -1 when absent.
	retryAfter time.Duration
	fault      *fault.Error
}

// final is the error for a failure that is not retried.
func (e *attemptError) final() error { return e.fault }

// exhausted is the error once retries are spent: 429 becomes Quota, a server
// error Upstream (502) and an unreachable Tavily Unavailable (503).
func (e *attemptError) exhausted(attempts int, why string) error {
	f := *e.fault
	tail := fmt.Sprintf(" (gave up after %d attempt", attempts)
	if attempts != 1 {
		tail += "s"
	}
	if why != "" {
		tail += "; " + why
	}
	f.Message += tail + ")"
	return &f
}

// attempt sends one request and returns the raw 200 body, or the classified
// failure.
func (c *Client) attempt(ctx context.Context, body []byte) ([]byte, *attemptError) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, &attemptError{retryAfter: -1, fault: fault.Wrap(fault.Internal, err, "could not build the Tavily request", "")}
	}
	hreq.Header.Set("Authorization", "Bearer "+c.key)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("X-Client-Source", "triad")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, c.transportError(err, false)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, c.transportError(err, true)
	}
	if len(b) > MaxResponseBytes {
		return nil, &attemptError{status: resp.StatusCode, retryAfter: -1, fault: fault.New(fault.Upstream,
			fmt.Sprintf("Tavily's answer is over %d bytes", MaxResponseBytes), "ask for fewer results or leave include_page off")}
	}
	if resp.StatusCode == http.StatusOK {
		return b, nil
	}
	return nil, c.statusError(resp, b)
}

// transportError classifies a failure to get an answer. reached tells a
// connection that broke mid-answer (Upstream, 502) from a Tavily that could
// not be reached at all (Unavailable, 503).
func (c *Client) transportError(err error, reached bool) *attemptError {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	if !reached && (errors.As(err, &dnsErr) || (errors.As(err, &opErr) && opErr.Op == "dial")) {
		return &attemptError{
			retry:      true,
			retryAfter: -1,
			// The cause names only the endpoint, never the key; it is
			// redacted anyway in case a proxy URL carries credentials.
			fault: fault.Wrap(fault.Unavailable, errors.New(c.redact(err.Error())), "could not reach Tavily",
				"check the network and TRIAD_TAVILY_URL (default "+DefaultBaseURL+"), then try again"),
		}
	}
	return &attemptError{
		retry:      true,
		retryAfter: -1,
		fault: fault.Wrap(fault.Upstream, errors.New(c.redact(err.Error())), "the connection to Tavily broke before a full answer",
			"Tavily or the network is having trouble; try again in a few minutes"),
	}
}

// statusError classifies a non-200 answer.
func (c *Client) statusError(resp *http.Response, body []byte) *attemptError {
	code := resp.StatusCode
	detail := c.redact(errorDetail(body))
	say := func(what string) string {
		if detail != "" {
			return fmt.Sprintf("%s (HTTP %d): %s", what, code, detail)
		}
		return fmt.Sprintf("%s (HTTP %d)", what, code)
	}
	ae := &attemptError{status: code, retryAfter: -1}
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		ae.fault = fault.New(fault.UpstreamAuth, say("Tavily refused the API key"),
			"set TAVILY_API_KEY to a valid Tavily API key (see https://app.tavily.com) and restart the server")
	case code == 432:
		ae.fault = fault.New(fault.Quota, say("Tavily plan or key usage limit exceeded"),
			"upgrade the Tavily plan or raise the key's limit at https://app.tavily.com, or wait for the limit to reset")
	case code == 433:
		ae.fault = fault.New(fault.Quota, say("Tavily pay-as-you-go limit exceeded"),
			"raise the pay-as-you-go limit on the Tavily dashboard (https://app.tavily.com)")
	case code == http.StatusTooManyRequests:
		ae.retry = true
		ae.retryAfter = retryAfter(resp.Header.Get("Retry-After"), c.cfg.Now())
		ae.fault = fault.New(fault.Quota, say("Tavily rate limit exceeded"),
			"wait a minute and search again, or send fewer searches at once")
	case code == http.StatusBadRequest || code == http.StatusUnprocessableEntity:
		ae.fault = fault.New(fault.BadInput, say("Tavily refused the search"),
			"change the query or filters as the message says")
	case code == http.StatusRequestTimeout || code >= 500:
		ae.retry = true
		ae.retryAfter = retryAfter(resp.Header.Get("Retry-After"), c.cfg.Now())
		ae.fault = fault.New(fault.Upstream, say("Tavily failed to answer"),
			"Tavily is having trouble; try again in a few minutes")
	default:
		ae.fault = fault.New(fault.Upstream, say("Tavily answered with an unexpected status"),
			"check that TRIAD_TAVILY_URL points at Tavily's API (default "+DefaultBaseURL+")")
	}
	return ae
}

// contextFault is the error when ctx ended: our timeout (or the caller's
// shorter deadline) is fault.Timeout; a cancelled caller gets its own error
// back. limit is the time the call had.
func contextFault(ctx context.Context, err error, limit time.Duration, last *attemptError) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("tavily search: %w", context.Cause(ctx))
	}
	msg := fmt.Sprintf("Tavily did not answer within %s", limit.Round(time.Millisecond))
	if last != nil {
		msg += "; an earlier attempt failed with: " + last.fault.Message
	}
	return fault.Wrap(fault.Timeout, err, msg, "search again later, or with fewer results or include_page off, which answer faster")
}

// backoff is the jittered exponential wait before retry number attempt
// ("equal jitter": half fixed, half random), so that many clients rate
// limited together do not retry in step.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.MinBackoff
	for i := 1; i < attempt && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.cfg.MaxBackoff)
	half := d / 2
	return half + rand.N(d-half+1)
}

// retryAfter parses a Retry-After value: delay seconds or an HTTP date. It
// returns -1 when the header is absent or unreadable, 0 for a date already
// past.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return -1
		}
		// Cap absurd values before converting so they cannot overflow;
		// anything this long is over every retry budget anyway.
		return time.Duration(min(n, 1<<20)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return -1
}

// errorDetail extracts Tavily's error text: {"detail":{"error":"..."}},
// FastAPI's {"detail":"..."} or the envelope {"error":{"message":"..."}}.
func errorDetail(body []byte) string {
	var v struct {
		Detail json.RawMessage `json:"detail"`
		Error  json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	var s string
	var obj struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	switch {
	case json.Unmarshal(v.Detail, &obj) == nil && obj.Error != "":
		s = obj.Error
	case json.Unmarshal(v.Detail, &s) == nil && s != "":
	case json.Unmarshal(v.Error, &obj) == nil && obj.Message != "":
		s = obj.Message
	case json.Unmarshal(v.Error, &s) == nil && s != "":
	}
	const limit = 300
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit]) + "…"
	}
	return s
}

// redact removes the key from text bound for an error message or log.
func (c *Client) redact(s string) string {
	if c.key == "" {
		return s
	}
	return strings.ReplaceAll(s, c.key, "[redacted]")
}

// redactURL hides user information in a URL shown in an error.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// normalizeDate renders Tavily's published_date (RFC 1123 as in news
// results, RFC 3339, or a bare date) as RFC 3339 UTC or YYYY-MM-DD, and
// passes anything else through so no information is lost.
func normalizeDate(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t.Format(time.DateOnly)
	}
	for _, layout := range []string{time.RFC1123, time.RFC1123Z, time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC().Format(time.RFC3339)
		}
	}
	return s
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
