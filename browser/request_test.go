package browser_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", browser.MaxQueryChars+1)
	tests := []struct {
		name  string
		req   browser.Request
		field string // "" means valid; otherwise the message must name it
	}{
		{"minimal", browser.Request{Query: "acme analytics"}, ""},
		{"everything", browser.Request{Query: "q", TopK: 20, IncludePage: true, AllowDomains: []string{"example.com", "News.Example.co.uk.", "xn--bcher-kva.example"}, DateRange: "2025-01-01..2025-12-31"}, ""},
		{"query of exactly 400 characters", browser.Request{Query: strings.Repeat("é", browser.MaxQueryChars)}, ""},
		{"top_k 1", browser.Request{Query: "q", TopK: 1}, ""},
		{"relative ranges", browser.Request{Query: "q", DateRange: "week"}, ""},
		{"relative range in capitals", browser.Request{Query: "q", DateRange: "Month"}, ""},
		{"same-day range", browser.Request{Query: "q", DateRange: "2026-02-28..2026-02-28"}, ""},
		{"leap day", browser.Request{Query: "q", DateRange: "2024-02-29..2024-03-01"}, ""},

		{"empty query", browser.Request{}, "query"},
		{"blank query", browser.Request{Query: " \t\n"}, "query"},
		{"query over 400 characters", browser.Request{Query: long}, "query"},
		{"query not UTF-8", browser.Request{Query: "caf\xe9"}, "query"},
		{"top_k 21", browser.Request{Query: "q", TopK: 21}, "top_k"},
		{"top_k negative", browser.Request{Query: "q", TopK: -1}, "top_k"},
		{"date_range word", browser.Request{Query: "q", DateRange: "fortnight"}, "date_range"},
		{"date_range one date", browser.Request{Query: "q", DateRange: "2025-01-01"}, "date_range"},
		{"date_range reversed", browser.Request{Query: "q", DateRange: "2025-02-01..2025-01-01"}, "date_range"},
		{"date_range no such day", browser.Request{Query: "q", DateRange: "2025-02-29..2025-03-01"}, "date_range"},
		{"date_range short month", browser.Request{Query: "q", DateRange: "2025-1-01..2025-03-01"}, "date_range"},
		{"date_range open end", browser.Request{Query: "q", DateRange: "2025-01-01.."}, "date_range"},
		{"date_range with times", browser.Request{Query: "q", DateRange: "2025-01-01T00:00:00Z..2025-01-02"}, "date_range"},
		{"domain with scheme", browser.Request{Query: "q", AllowDomains: []string{"https://example.com"}}, "allow_domains[0]"},
		{"domain with path", browser.Request{Query: "q", AllowDomains: []string{"example.com", "example.com/news"}}, "allow_domains[1]"},
		{"domain with port", browser.Request{Query: "q", AllowDomains: []string{"example.com:443"}}, "allow_domains[0]"},
		{"domain with underscore", browser.Request{Query: "q", AllowDomains: []string{"bad_name.com"}}, "allow_domains[0]"},
		{"domain with leading hyphen", browser.Request{Query: "q", AllowDomains: []string{"-bad.com"}}, "allow_domains[0]"},
		{"domain with empty label", browser.Request{Query: "q", AllowDomains: []string{"a..com"}}, "allow_domains[0]"},
		{"domain with space", browser.Request{Query: "q", AllowDomains: []string{"exa mple.com"}}, "allow_domains[0]"},
		{"domain not ASCII", browser.Request{Query: "q", AllowDomains: []string{"bücher.example"}}, "allow_domains[0]"},
		{"domain is an IP", browser.Request{Query: "q", AllowDomains: []string{"10.0.0.1"}}, "allow_domains[0]"},
		{"domain empty", browser.Request{Query: "q", AllowDomains: []string{""}}, "allow_domains[0]"},
		{"domain label over 63", browser.Request{Query: "q", AllowDomains: []string{strings.Repeat("a", 64) + ".com"}}, "allow_domains[0]"},
		{"too many domains", browser.Request{Query: "q", AllowDomains: make([]string, browser.MaxDomains+1)}, "allow_domains"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.req.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("got %v, want a *fault.Error", err)
			}
			if fe.Kind != fault.BadInput {
				t.Errorf("got kind %s, want %s", fe.Kind, fault.BadInput)
			}
			if !strings.HasPrefix(fe.Message, tt.field+" ") {
				t.Errorf("got message %q, want it to start with the field %q", fe.Message, tt.field)
			}
			if fe.Suggestion == "" {
				t.Error("got an empty suggestion, want advice")
			}
		})
	}
}

func TestDecodeRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		want    browser.Request
		kind    fault.Kind // "" means success
		message string     // a substring the message must contain
	}{
		{"full", `{"query":"acme","top_k":3,"include_page":true,"allow_domains":["a.example"],"date_range":"week"}`,
			browser.Request{Query: "acme", TopK: 3, IncludePage: true, AllowDomains: []string{"a.example"}, DateRange: "week"}, "", ""},
		{"query only, surrounding space", " {\"query\":\"acme\"}\n", browser.Request{Query: "acme"}, "", ""},
		{"not JSON", `query=acme`, browser.Request{}, fault.BadInput, "not valid JSON"},
		{"truncated JSON", `{"query":"acme"`, browser.Request{}, fault.BadInput, "not valid JSON"},
		{"empty body", ``, browser.Request{}, fault.BadInput, "empty"},
		{"array body", `["acme"]`, browser.Request{}, fault.BadInput, "JSON object"},
		{"trailing data", `{"query":"acme"} {"query":"b"}`, browser.Request{}, fault.BadInput, "after the JSON object"},
		{"unknown field", `{"query":"acme","topk":3}`, browser.Request{}, fault.BadInput, `unknown field "topk"`},
		{"top_k a string", `{"query":"acme","top_k":"3"}`, browser.Request{}, fault.BadInput, "top_k must be a whole number"},
		{"top_k a fraction", `{"query":"acme","top_k":2.5}`, browser.Request{}, fault.BadInput, "top_k must be a whole number"},
		{"query a number", `{"query":5}`, browser.Request{}, fault.BadInput, "query must be a string"},
		{"include_page a string", `{"query":"q","include_page":"yes"}`, browser.Request{}, fault.BadInput, "include_page must be true or false"},
		{"allow_domains a string", `{"query":"q","allow_domains":"a.example"}`, browser.Request{}, fault.BadInput, "allow_domains must be"},
		{"allow_domains holds a number", `{"query":"q","allow_domains":[1]}`, browser.Request{}, fault.BadInput, "allow_domains"},
		{"null query", `{"query":null}`, browser.Request{}, fault.BadInput, "query is empty"},
		{"validation runs", `{"query":"q","top_k":99}`, browser.Request{}, fault.BadInput, "top_k is 99"},
		{"too large", `{"query":"` + strings.Repeat("a", browser.MaxRequestBytes) + `"}`, browser.Request{}, fault.TooLarge, "over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := browser.DecodeRequest(strings.NewReader(tt.body))
			if tt.kind == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("request (-want +got):\n%s", diff)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil {
				t.Fatalf("got %v, want a *fault.Error", err)
			}
			if fe.Kind != tt.kind {
				t.Errorf("got kind %s, want %s", fe.Kind, tt.kind)
			}
			if !strings.Contains(fe.Message, tt.message) {
				t.Errorf("got message %q, want it to contain %q", fe.Message, tt.message)
			}
			if got := fault.Status(fe.Kind); tt.kind == fault.BadInput && got != 400 {
				t.Errorf("got status %d, want 400", got)
			}
		})
	}
}

func TestRequestKey(t *testing.T) {
	t.Parallel()
	base := browser.Request{Query: "acme pricing", AllowDomains: []string{"a.example", "b.example"}, DateRange: "week"}
	same := []browser.Request{
		{Query: "  acme pricing ", TopK: browser.DefaultTopK, AllowDomains: []string{"B.example.", "a.example", "a.example"}, DateRange: "Week"},
		{Query: "acme pricing", TopK: 0, AllowDomains: []string{"b.example", "A.EXAMPLE"}, DateRange: "week"},
	}
	different := []browser.Request{
		{Query: "acme prices", AllowDomains: base.AllowDomains, DateRange: "week"},
		{Query: "acme pricing", TopK: 6, AllowDomains: base.AllowDomains, DateRange: "week"},
		{Query: "acme pricing", IncludePage: true, AllowDomains: base.AllowDomains, DateRange: "week"},
		{Query: "acme pricing", AllowDomains: []string{"a.example"}, DateRange: "week"},
		{Query: "acme pricing", AllowDomains: base.AllowDomains, DateRange: "month"},
		{Query: "acme pricing", AllowDomains: base.AllowDomains},
	}
	key := browser.RequestKey(base)
	if len(key) != 64 || strings.Trim(key, "0123456789abcdef") != "" {
		t.Fatalf("got key %q, want 64 lower-case hex digits", key)
	}
	for i, r := range same {
		if got := browser.RequestKey(r); got != key {
			t.Errorf("same[%d]: got %s, want %s", i, got, key)
		}
	}
	seen := map[string]int{key: -1}
	for i, r := range different {
		got := browser.RequestKey(r)
		if j, dup := seen[got]; dup {
			t.Errorf("different[%d]: key %s collides with %d", i, got, j)
		}
		seen[got] = i
	}
}

func TestParseDateRange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want browser.DateRange
	}{
		{"day", browser.DateRange{Relative: "day"}},
		{"YEAR", browser.DateRange{Relative: "year"}},
		{"2025-01-01..2025-06-30", browser.DateRange{Start: "2025-01-01", End: "2025-06-30"}},
	}
	for _, tt := range tests {
		got, err := browser.ParseDateRange(tt.in)
		if err != nil {
			t.Errorf("ParseDateRange(%q): got %v, want nil", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseDateRange(%q): got %+v, want %+v", tt.in, got, tt.want)
		}
	}
}
