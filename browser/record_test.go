package browser_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/browser"
)

func TestDedupe(t *testing.T) {
	t.Parallel()
	in := []browser.Result{
		{URL: "https://Example.com/a/", Title: "first"},
		{URL: "https://example.com/b", Title: "b"},
		{URL: "https://example.com/a#section", Title: "fragment of first"},
		{URL: "https://example.com:443/a", Title: "default port of first"},
		{URL: "https://example.com/a?page=2", Title: "query differs"},
		{URL: "http://example.com/a", Title: "scheme differs"},
		{URL: "https://example.com/b", Title: "exact repeat"},
	}
	want := []string{"first", "b", "query differs", "scheme differs"}
	var got []string
	for _, r := range browser.Dedupe(in) {
		got = append(got, r.Title)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kept titles (-want +got):\n%s", diff)
	}
}

func TestTopDomains(t *testing.T) {
	t.Parallel()
	in := []browser.Result{
		{URL: "https://www.b.example/1"},
		{URL: "https://a.example/1"},
		{URL: "https://B.example/2"},
		{URL: "https://news.a.example/1"},
		{URL: "https://c.example/1"},
		{URL: "https://c.example/2"},
		{URL: "not a url"},
	}
	want := []browser.DomainCount{{"b.example", 2}, {"c.example", 2}, {"a.example", 1}, {"news.a.example", 1}}
	if diff := cmp.Diff(want, browser.TopDomains(in)); diff != "" {
		t.Errorf("top domains (-want +got):\n%s", diff)
	}
}

func sampleRecord() *browser.Record {
	req := browser.Request{Query: "acme <pricing> & plans", AllowDomains: []string{"B.example", "a.example"}}
	sent := json.RawMessage(`{"query":"acme <pricing> & plans","max_results":5}`)
	raw := json.RawMessage(`{
  "query": "acme <pricing> & plans",
  "results": [{"url": "https://a.example/x", "title": "X", "content": "c", "score": 0.5, "raw_content": null}],
  "response_time": 0.4
}`)
	results := []browser.Result{
		{URL: "https://a.example/x", Title: "X", Snippet: "c", Score: 0.5},
		{URL: "https://a.example/x/", Title: "X again", Snippet: "c"},
		{URL: "https://www.b.example/y", Title: "Y", Snippet: "d", PublishedAt: "2026-11-19"},
	}
	at := time.Date(2026, 11, 20, 13, 0, 0, 123456789, time.FixedZone("CET", 3600))
	return browser.NewRecord("fake", req, sent, raw, results, at)
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	rec := sampleRecord()
	if got, want := len(rec.Results), 2; got != want {
		t.Fatalf("got %d results, want %d (deduplicated)", got, want)
	}
	if got, want := rec.Time.Location(), time.UTC; got != want {
		t.Errorf("got time zone %v, want %v", got, want)
	}
	b1, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b2, err := sampleRecord().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Errorf("two marshals of equal records differ:\n%s\n%s", b1, b2)
	}
	for _, want := range []string{
		`"format":"triad.citations/v1"`,
		`"time":"2026-11-20T12:00:00.123456789Z"`,
		`"top_domains":[{"domain":"a.example","count":1},{"domain":"b.example","count":1}]`,
		`"request":{"query":"acme <pricing> & plans","max_results":5}`,
		`"response":{"query":"acme <pricing> & plans","results":[{"url":"https://a.example/x"`,
		`"input":{"query":"acme <pricing> & plans","top_k":5,"allow_domains":["a.example","b.example"]}`,
	} {
		if !bytes.Contains(b1, []byte(want)) {
			t.Errorf("marshalled record lacks %s:\n%s", want, b1)
		}
	}
	back, err := browser.ParseRecord(b1)
	if err != nil {
		t.Fatal(err)
	}
	b3, err := back.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b3) {
		t.Errorf("parse then marshal changed the bytes:\n%s\n%s", b1, b3)
	}
	if diff := cmp.Diff(rec.Response(), back.Response()); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	if got := back.Response().CitationsID; got != "" {
		t.Errorf("got citations_id %q, want it left for the caller", got)
	}
}

func TestRecordEmptyResults(t *testing.T) {
	t.Parallel()
	rec := browser.NewRecord("fake", browser.Request{Query: "nothing"}, json.RawMessage(`{}`), json.RawMessage(`{"results":[]}`), nil, time.Unix(0, 0))
	b, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"results":[]`)) || !bytes.Contains(b, []byte(`"top_domains":[]`)) {
		t.Errorf("empty lists must marshal as [], got %s", b)
	}
	resp, err := json.Marshal(rec.Response())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(resp), `{"results":[],"citations_id":""}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestParseRecordRefuses(t *testing.T) {
	t.Parallel()
	good, err := sampleRecord().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(string) string
	}{
		{"not JSON", func(string) string { return "nope" }},
		{"other format", func(s string) string { return strings.Replace(s, "triad.citations/v1", "triad.citations/v0", 1) }},
		{"no provider", func(s string) string { return strings.Replace(s, `"provider":"fake"`, `"provider":""`, 1) }},
		{"input edited", func(s string) string {
			return strings.Replace(s, `"input":{"query":"acme`, `"input":{"query":"globex`, 1)
		}},
		{"key not hex", func(s string) string {
			var m map[string]any
			_ = json.Unmarshal([]byte(s), &m)
			return strings.Replace(s, m["request_key"].(string), strings.Repeat("z", 64), 1)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := browser.ParseRecord([]byte(tt.edit(string(good)))); err == nil {
				t.Error("got nil error, want a refusal")
			}
		})
	}
}

// The sha256 of the marshalled bytes is what the caller reports as
// citations_id; this pins that the bytes, not the struct, are addressed.
func TestRecordContentAddress(t *testing.T) {
	t.Parallel()
	b, err := sampleRecord().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	other := sampleRecord()
	other.Time = other.Time.Add(time.Nanosecond)
	ob, err := other.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(b) == sha256.Sum256(ob) {
		t.Error("records made at different times share a content address")
	}
}
