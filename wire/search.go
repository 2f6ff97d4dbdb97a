package wire

// SearchRequest is browser.search's input.
type SearchRequest struct {
	// Query's 400 is Tavily's own limit (browser.MaxQueryChars).
	Query string `json:"query" format:"non-blank" maxLength:"400" doc:"What to search for: 1 to 400 characters, white space at either end not counted."`
	// TopK's range is browser.MaxTopK's.
	TopK         *int     `json:"top_k,omitempty" minimum:"1" maximum:"20" doc:"How many results: 1 to 20; absent means 5."`
	IncludePage  *bool    `json:"include_page,omitempty" doc:"Also return each result's page text in content."`
	AllowDomains []string `json:"allow_domains,omitempty" maxItems:"300" format:"domain" doc:"Only results from these hostnames and their subdomains, e.g. gartner.com: at most 300 bare DNS names (no scheme, port or path), internationalised names in punycode."`
	DateRange    string   `json:"date_range,omitempty" format:"date-range" doc:"Only results published in this range: day, week, month or year (back from now), or YYYY-MM-DD..YYYY-MM-DD (real dates, inclusive, the start not after the end)."`
}

// SearchResult is one search hit.
type SearchResult struct {
	URL   string `json:"url" doc:"The result's address."`
	Title string `json:"title" doc:"The page's title."`
	// Snippet is the provider's short excerpt relevant to the query.
	Snippet string `json:"snippet" doc:"The provider's short excerpt relevant to the query."`
	// PublishedAt is the publication date when the provider knows it:
	// RFC 3339 in UTC, or YYYY-MM-DD when only the day is known, or the
	// provider's text verbatim when it could not be parsed.
	PublishedAt string `json:"published_at,omitempty"`
	// Content is the page text, present when the request set IncludePage.
	Content string `json:"content,omitempty"`
	// Score is the provider's relevance score; only its order within one
	// response means anything.
	Score float64 `json:"score,omitempty"`
}

// SearchResponse is browser.search's answer.
type SearchResponse struct {
	Results []SearchResult `json:"results" doc:"Results, best first."`
	// CitationsID is the sha256 of the stored citations record (a run file
	// under citations/), downloadable like any other content.
	CitationsID string `json:"citations_id" doc:"sha256 of the stored raw-results record (a run file under citations/); cite it."`
}
