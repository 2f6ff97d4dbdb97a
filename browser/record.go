package browser

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/triadhq/triad/wire"
)

// Result is one search hit; Response is browser.search's answer. Both are
// the wire contract's types.
type (
	Result   = wire.SearchResult
	Response = wire.SearchResponse
)

// Provider answers searches. Implementations translate their upstream's
// failures into *fault.Error values (fault.Auth, fault.Quota, fault.Timeout,
// fault.Upstream, fault.Unavailable, fault.NotConfigured) so that callers can
// answer with the right status and suggestion without knowing the upstream.
type Provider interface {
	// Name names the provider in records and logs, e.g. "tavily".
	Name() string
	// Search runs req, which the caller has validated, and returns the
	// record of the call.
	Search(ctx context.Context, req Request) (*Record, error)
}

// RecordFormat names the layout of a marshalled Record; ParseRecord refuses
// any other.
const RecordFormat = "triad.citations/v1"

// Record is the raw-results record of one search, kept for audit and replay.
// It never holds a credential: providers send keys in headers, and UpstreamRequest
// is the body only.
type Record struct {
	// Format is RecordFormat.
	Format string `json:"format"`
	// Provider is the Provider.Name that answered.
	Provider string `json:"provider"`
	// Time is when the search was made, in UTC.
	Time time.Time `json:"time"`
	// RequestKey is RequestKey(Input): the key replay looks records up by.
	RequestKey string `json:"request_key"`
	// Input is the caller's request in normalised form.
	Input Request `json:"input"`
	// UpstreamRequest is exactly the body sent upstream.
	UpstreamRequest json.RawMessage `json:"request"`
	// UpstreamResponse is the upstream's full answer, unaltered in content.
	UpstreamResponse json.RawMessage `json:"response"`
	// Results are the normalised results: deduplicated by URL, in upstream
	// order.
	Results []Result `json:"results"`
	// TopDomains counts Results by domain, most frequent first.
	TopDomains []DomainCount `json:"top_domains"`
}

// DomainCount is one entry of Record.TopDomains.
type DomainCount struct {
	Domain string `json:"domain"`
	Count  int    `json:"count"`
}

// NewRecord assembles the record of one call: it normalises input,
// deduplicates results by URL (the first occurrence wins, so upstream order
// is kept), computes the top domains and the request key, and stores at in
// UTC. sent and raw must be JSON.
func NewRecord(provider string, input Request, sent, raw json.RawMessage, results []Result, at time.Time) *Record {
	deduped := Dedupe(results)
	return &Record{
		Format:           RecordFormat,
		Provider:         provider,
		Time:             at.UTC(),
		RequestKey:       RequestKey(input),
		Input:            input.Normalized(),
		UpstreamRequest:  sent,
		UpstreamResponse: raw,
		Results:          deduped,
		TopDomains:       TopDomains(deduped),
	}
}

// Response returns the browser.search answer this record gives, with
// CitationsID left empty for the caller that stores the record.
func (r *Record) Response() Response {
	out := Response{Results: slices.Clone(r.Results)}
	if out.Results == nil {
		out.Results = []Result{}
	}
	return out
}

// Marshal returns the record's stable bytes: the same record always gives
// the same bytes, so its sha256 is a content address. encoding/json compacts
// the embedded raw JSON; its content is unchanged.
func (r *Record) Marshal() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("marshal citations record: %w", err)
	}
	c := *r
	c.Time = r.Time.UTC()
	if c.Results == nil {
		c.Results = []Result{}
	}
	if c.TopDomains == nil {
		c.TopDomains = []DomainCount{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Page text is full of & < >; escaping them would make the record
	// harder to read for nothing.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("marshal citations record: %w", err)
	}
	return buf.Bytes(), nil
}

// ParseRecord reads bytes written by Record.Marshal.
func ParseRecord(b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse citations record: %w", err)
	}
	if r.Format != RecordFormat {
		return nil, fmt.Errorf("parse citations record: format is %q, want %q", r.Format, RecordFormat)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("parse citations record: %w", err)
	}
	// Replay trusts request_key; a record edited by hand must not answer a
	// request it was not made for.
	if want := RequestKey(r.Input); r.RequestKey != want {
		return nil, fmt.Errorf("parse citations record: request_key %s does not match input (want %s)", r.RequestKey, want)
	}
	return &r, nil
}

func (r *Record) check() error {
	switch {
	case r.Provider == "":
		return errors.New("provider is empty")
	case len(r.RequestKey) != 64:
		return fmt.Errorf("request_key %q is not a hex sha256", r.RequestKey)
	case !json.Valid(r.UpstreamRequest):
		return errors.New("request is not JSON")
	case !json.Valid(r.UpstreamResponse):
		return errors.New("response is not JSON")
	}
	if _, err := hex.DecodeString(r.RequestKey); err != nil {
		return fmt.Errorf("request_key %q is not a hex sha256", r.RequestKey)
	}
	return nil
}

// Dedupe returns results without repeated URLs, keeping the first of each.
// URLs are compared after normalisation (see urlKey), so
// "https://Example.com/a/" and "https://example.com/a#top" are one page.
func Dedupe(results []Result) []Result {
	seen := make(map[string]bool, len(results))
	out := make([]Result, 0, len(results))
	for _, r := range results {
		k := urlKey(r.URL)
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, r)
	}
	return out
}

// urlKey is the identity of a page: scheme and host lower-cased, default
// port, fragment and trailing slash dropped. Query strings are kept because
// they often select different content.
func urlKey(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return raw
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if p := u.Port(); p != "" && !(scheme == "http" && p == "80") && !(scheme == "https" && p == "443") {
		host = net.JoinHostPort(host, p)
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/")
	k := scheme + "://" + host + path
	if u.RawQuery != "" {
		k += "?" + u.RawQuery
	}
	return k
}

// TopDomains counts results by domain (the URL's host, lower-cased, without
// a leading "www."), most frequent first and by name among equals.
func TopDomains(results []Result) []DomainCount {
	counts := map[string]int{}
	for _, r := range results {
		if d := Domain(r.URL); d != "" {
			counts[d]++
		}
	}
	out := make([]DomainCount, 0, len(counts))
	for d, n := range counts {
		out = append(out, DomainCount{Domain: d, Count: n})
	}
	slices.SortFunc(out, func(a, b DomainCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Domain, b.Domain)
	})
	return out
}

// Domain is the domain TopDomains counts rawURL under, or "" when rawURL has
// no host.
func Domain(rawURL string) string {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return ""
	}
	h := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	return strings.TrimPrefix(h, "www.")
}
