package wire

// SearchRequest is browser.search's input.
type SearchRequest struct {
	// Query is what to search for: 1 to 400 characters.
	Query string `json:"query"`
	// TopK is the number of results wanted: absent means 5; present must
	// be 1 to 20.
	TopK *int `json:"top_k,omitempty"`
	// IncludePage asks for each result's page text in SearchResult.Content.
	IncludePage *bool `json:"include_page,omitempty"`
	// AllowDomains restricts results to these hostnames and their
	// subdomains, e.g. "gartner.com".
	AllowDomains []string `json:"allow_domains,omitempty"`
	// DateRange restricts results by publication date: "day", "week",
	// "month", "year" (back from now) or "YYYY-MM-DD..YYYY-MM-DD"
	// (inclusive).
	DateRange string `json:"date_range,omitempty"`
}

// SearchResult is one search hit.
type SearchResult struct {
	URL   string `json:"url"`
	Title string `json:"title"`
	// Snippet is the provider's short excerpt relevant to the query.
	Snippet string `json:"snippet"`
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
	Results []SearchResult `json:"results"`
	// CitationsID is the sha256 of the stored citations record (a run file
	// under citations/), downloadable like any other content.
	CitationsID string `json:"citations_id"`
}
