package browser

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/wire"
)

// Limits of the browser.search contract. MaxQueryChars and MaxTopK are
// Tavily's own limits (longer queries and larger max_results are refused
// upstream), enforced here so that the caller gets a 400 naming the field
// instead of an opaque upstream error.
const (
	DefaultTopK   = 5
	MaxTopK       = 20
	MaxQueryChars = 400
	// MaxDomains is Tavily's cap on include_domains.
	MaxDomains = 300
	// MaxRequestBytes bounds the JSON body DecodeRequest reads: 300 domains
	// of 253 bytes fit with room to spare.
	MaxRequestBytes = 1 << 20
)

// Request is the input of browser.search.
type Request struct {
	// Query is what to search for: 1 to 400 characters.
	Query string `json:"query"`
	// TopK is the number of results wanted, 1 to 20; 0 means DefaultTopK.
	TopK int `json:"top_k,omitempty"`
	// IncludePage asks for each result's page text in Result.Content.
	IncludePage bool `json:"include_page,omitempty"`
	// AllowDomains restricts results to these hostnames and their
	// subdomains, e.g. "gartner.com".
	AllowDomains []string `json:"allow_domains,omitempty"`
	// DateRange restricts results by publication date: "day", "week",
	// "month", "year" (back from now) or "YYYY-MM-DD..YYYY-MM-DD"
	// (inclusive).
	DateRange string `json:"date_range,omitempty"`
}

// FromWire turns the wire request into a validated Request: a field that
// is absent takes its default, and a field that is present is validated
// (top_k: 0 is out of range, not "unset").
func FromWire(w wire.SearchRequest) (Request, error) {
	r := Request{Query: w.Query, AllowDomains: w.AllowDomains, DateRange: w.DateRange}
	if w.TopK != nil {
		if *w.TopK < 1 || *w.TopK > MaxTopK {
			return Request{}, fault.Badf(topKSuggestion, "top_k is %d; it must be between 1 and %d", *w.TopK, MaxTopK)
		}
		r.TopK = *w.TopK
	}
	if w.IncludePage != nil {
		r.IncludePage = *w.IncludePage
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// Wire returns r as the wire contract spells it, with every field that is
// set present.
func (r Request) Wire() wire.SearchRequest {
	w := wire.SearchRequest{Query: r.Query, AllowDomains: r.AllowDomains, DateRange: r.DateRange}
	if r.TopK != 0 {
		w.TopK = &r.TopK
	}
	if r.IncludePage {
		w.IncludePage = &r.IncludePage
	}
	return w
}

// The relative date ranges, named as Tavily's time_range names them.
var relativeRanges = []string{"day", "week", "month", "year"}

const (
	querySuggestion  = "send a query of 1 to 400 characters; split a long question into several searches"
	topKSuggestion   = "send top_k between 1 and 20, or leave it out for 5"
	rangeSuggestion  = "send date_range as one of day, week, month, year, or as YYYY-MM-DD..YYYY-MM-DD with the start not after the end"
	domainSuggestion = "send bare hostnames such as \"example.com\": no scheme, path or port; internationalised names in punycode (xn--...)"
)

// Validate reports the first thing wrong with r as a *fault.Error of kind
// fault.BadInput whose message names the offending field. It does not modify
// r; see Normalized for the form providers send upstream.
func (r *Request) Validate() error {
	q := strings.TrimSpace(r.Query)
	switch n := utf8.RuneCountInString(q); {
	case n == 0:
		return fault.Badf(querySuggestion, "query is empty")
	case n > MaxQueryChars:
		return fault.Badf(querySuggestion, "query is %d characters long; the limit is %d", n, MaxQueryChars)
	}
	if !utf8.ValidString(r.Query) {
		return fault.Badf(querySuggestion, "query is not valid UTF-8")
	}
	if r.TopK < 0 || r.TopK > MaxTopK {
		return fault.Badf(topKSuggestion, "top_k is %d; it must be between 1 and %d", r.TopK, MaxTopK)
	}
	if r.DateRange != "" {
		if _, err := ParseDateRange(r.DateRange); err != nil {
			return err
		}
	}
	if len(r.AllowDomains) > MaxDomains {
		return fault.Badf(domainSuggestion, "allow_domains has %d entries; the limit is %d", len(r.AllowDomains), MaxDomains)
	}
	for i, d := range r.AllowDomains {
		if err := CheckDomain(d); err != nil {
			return fault.Badf(domainSuggestion, "allow_domains[%d] %q is not a hostname: %v", i, d, err)
		}
	}
	return nil
}

// Normalized returns r in the canonical form providers send upstream and
// RequestKey hashes: the query trimmed, TopK defaulted, domains lower-cased,
// stripped of a trailing dot, deduplicated and sorted, and the date range in
// lower case. r should be valid; Normalized does not validate.
func (r Request) Normalized() Request {
	n := Request{
		Query:       strings.TrimSpace(r.Query),
		TopK:        r.TopK,
		IncludePage: r.IncludePage,
		DateRange:   strings.ToLower(strings.TrimSpace(r.DateRange)),
	}
	if n.TopK == 0 {
		n.TopK = DefaultTopK
	}
	if len(r.AllowDomains) > 0 {
		ds := make([]string, 0, len(r.AllowDomains))
		for _, d := range r.AllowDomains {
			ds = append(ds, strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), "."))
		}
		slices.Sort(ds)
		n.AllowDomains = slices.Compact(ds)
	}
	return n
}

// requestKeyVersion prefixes the canonical form so that a change to it can
// never make an old record answer a request it did not record.
const requestKeyVersion = "triad.browser.request/v1\n"

// RequestKey is the hex sha256 of the canonical form of req.Normalized().
// Two requests that ask for the same thing (default top_k given or not,
// domains in another order or case) share a key, so a replayed run can answer
// a search from the record of the original one.
func RequestKey(req Request) string {
	n := req.Normalized()
	// A fixed struct keeps the field order, and so the hash, stable;
	// omitempty is off so that every field is always part of the form.
	canon := struct {
		Query        string   `json:"query"`
		TopK         int      `json:"top_k"`
		IncludePage  bool     `json:"include_page"`
		AllowDomains []string `json:"allow_domains"`
		DateRange    string   `json:"date_range"`
	}{n.Query, n.TopK, n.IncludePage, n.AllowDomains, n.DateRange}
	if canon.AllowDomains == nil {
		canon.AllowDomains = []string{}
	}
	b, err := json.Marshal(canon)
	if err != nil {
		// Only strings, ints and bools: Marshal cannot fail.
		panic(fmt.Sprintf("browser: marshal canonical request: %v", err))
	}
	sum := sha256.Sum256(append([]byte(requestKeyVersion), b...))
	return hex.EncodeToString(sum[:])
}

// DecodeRequest reads one JSON object from r strictly (unknown fields and
// trailing data are refused) and validates it. Every failure is a
// *fault.Error of kind fault.BadInput naming the field at fault, or
// fault.TooLarge for a body over MaxRequestBytes.
func DecodeRequest(r io.Reader) (Request, error) {
	body, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		return Request{}, fault.Wrap(fault.BadInput, err, "could not read the request body", "send the body again")
	}
	if len(body) > MaxRequestBytes {
		return Request{}, fault.New(fault.TooLarge, fmt.Sprintf("request body is over %d bytes", MaxRequestBytes), "send a smaller request; allow_domains takes at most 300 hostnames")
	}
	const jsonSuggestion = `send a JSON object such as {"query": "B2B analytics market size", "top_k": 5}`
	if len(bytes.TrimSpace(body)) == 0 {
		return Request{}, fault.Badf(jsonSuggestion, "request body is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req wire.SearchRequest
	if err := dec.Decode(&req); err != nil {
		return Request{}, decodeFault(err, jsonSuggestion)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, fault.Badf(jsonSuggestion, "request body has data after the JSON object")
	}
	return FromWire(req)
}

// decodeFault turns an encoding/json error into a BadInput that names the
// field when there is one.
func decodeFault(err error, suggestion string) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fault.Badf(fieldSuggestion(typeErr.Field), "%s must be %s; got a JSON %s", typeErr.Field, fieldType(typeErr.Field), typeErr.Value)
	case errors.As(err, &typeErr):
		return fault.Badf(suggestion, "request body must be a JSON object; got a JSON %s", typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fault.Badf(suggestion, "request body is not valid JSON (at byte %d)", syntaxErr.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fault.Badf(suggestion, "request body is not valid JSON (it ends early)")
	}
	// encoding/json reports an unknown field only as text.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		field, uerr := strconv.Unquote(name)
		if uerr != nil {
			field = name
		}
		return fault.Badf("remove it: the fields are query, top_k, include_page, allow_domains and date_range", "unknown field %q", field)
	}
	return fault.Wrap(fault.BadInput, err, "request body is not valid JSON", suggestion)
}

func fieldType(field string) string {
	switch {
	case field == "top_k":
		return "a whole number"
	case field == "include_page":
		return "true or false"
	case field == "allow_domains":
		return "an array of hostname strings"
	case strings.HasPrefix(field, "allow_domains"):
		return "a string"
	default:
		return "a string"
	}
}

func fieldSuggestion(field string) string {
	switch {
	case field == "query":
		return querySuggestion
	case field == "top_k":
		return topKSuggestion
	case field == "date_range":
		return rangeSuggestion
	case strings.HasPrefix(field, "allow_domains"):
		return domainSuggestion
	default:
		return "send include_page as true or false"
	}
}

// DateRange is a parsed date_range: either Relative or both Start and End.
type DateRange struct {
	// Relative is "day", "week", "month" or "year", or "" for an absolute
	// range.
	Relative string
	// Start and End are inclusive dates in the form YYYY-MM-DD; both are
	// empty for a relative range.
	Start, End string
}

// ParseDateRange parses a date_range value. Errors are fault.BadInput naming
// date_range.
func ParseDateRange(s string) (DateRange, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	if slices.Contains(relativeRanges, v) {
		return DateRange{Relative: v}, nil
	}
	a, b, ok := strings.Cut(v, "..")
	if !ok {
		return DateRange{}, fault.Badf(rangeSuggestion, "date_range %q is neither day, week, month, year nor YYYY-MM-DD..YYYY-MM-DD", s)
	}
	start, err := parseDay(a)
	if err != nil {
		return DateRange{}, fault.Badf(rangeSuggestion, "date_range %q has a bad start date: %v", s, err)
	}
	end, err := parseDay(b)
	if err != nil {
		return DateRange{}, fault.Badf(rangeSuggestion, "date_range %q has a bad end date: %v", s, err)
	}
	if start.After(end) {
		return DateRange{}, fault.Badf(rangeSuggestion, "date_range %q starts after it ends", s)
	}
	return DateRange{Start: a, End: b}, nil
}

// parseDay accepts exactly YYYY-MM-DD naming a real day.
func parseDay(s string) (time.Time, error) {
	if len(s) != len(time.DateOnly) {
		return time.Time{}, fmt.Errorf("%q is not in the form YYYY-MM-DD", s)
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a calendar date", s)
	}
	return t, nil
}

// CheckDomain accepts a bare DNS name: letters, digits and hyphens in
// labels of 1 to 63 characters, not starting or ending with a hyphen, at most
// 253 characters, an optional trailing dot, and a last label that is not all
// digits (so IPv4 addresses are refused: Tavily filters by domain).
func CheckDomain(d string) error {
	switch {
	case d == "":
		return errors.New("it is empty")
	case strings.Contains(d, "://"):
		return errors.New("it has a scheme; send only the host")
	case strings.ContainsAny(d, "/?#"):
		return errors.New("it has a path; send only the host")
	case strings.Contains(d, ":"):
		return errors.New("it has a port; send only the host")
	case strings.Contains(d, "@"):
		return errors.New("it has user information; send only the host")
	}
	name := strings.TrimSuffix(d, ".")
	if name == "" {
		return errors.New("it has no labels")
	}
	if len(name) > 253 {
		return fmt.Errorf("it is %d characters long; the limit is 253", len(name))
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return err
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return errors.New("it looks like an IP address; send a domain name")
	}
	return nil
}

func checkLabel(l string) error {
	if l == "" {
		return errors.New("it has an empty label (two dots in a row, or a leading dot)")
	}
	if len(l) > 63 {
		return fmt.Errorf("label %q is over 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for _, c := range []byte(l) {
		isAlnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !isAlnum && c != '-' {
			if c >= 0x80 {
				return fmt.Errorf("label %q is not ASCII; use its punycode (xn--) form", l)
			}
			return fmt.Errorf("label %q has the character %q", l, c)
		}
	}
	return nil
}
