package tavily_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/internal/fault"
)

// TestLive searches the real Tavily. It is the one test allowed to skip:
// it needs TAVILY_API_KEY (and TRIAD_TAVILY_URL for a proxy, if any) and
// spends one API credit.
func TestLive(t *testing.T) {
	key := os.Getenv("TAVILY_API_KEY")
	if key == "" {
		t.Skip("skipping: TAVILY_API_KEY is not set (the live Tavily test runs only with a real key)")
	}
	base := os.Getenv("TRIAD_TAVILY_URL")
	c, err := tavily.New(tavily.Config{APIKey: key, BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	rec, err := c.Search(t.Context(), browser.Request{Query: "Tavily search API for AI agents", TopK: 3, IncludePage: true})
	if err != nil {
		t.Fatalf("live search: %v", err)
	}
	if len(rec.Results) == 0 {
		t.Fatal("got no results from Tavily")
	}
	if len(rec.Results) > 3 {
		t.Errorf("got %d results, want at most 3 (top_k)", len(rec.Results))
	}
	withPage := 0
	for _, r := range rec.Results {
		if !strings.HasPrefix(r.URL, "http") || r.Title == "" {
			t.Errorf("result lacks url or title: %+v", r)
		}
		if r.Content != "" {
			withPage++
		}
	}
	if withPage == 0 {
		t.Error("include_page returned no page text for any result")
	}
	b, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(key)) {
		t.Error("the record contains the API key")
	}
	if !bytes.Contains(rec.UpstreamResponse, []byte(`"results"`)) {
		t.Errorf("raw response lacks results: %.200s", rec.UpstreamResponse)
	}

	// A wrong key costs nothing and must come back as Auth.
	bad, err := tavily.New(tavily.Config{APIKey: key + "-wrong", BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Search(t.Context(), browser.Request{Query: "tavily"})
	if fe := fault.As(err); fe == nil || fe.Kind != fault.UpstreamAuth {
		t.Errorf("wrong key: got %v, want kind %s", err, fault.UpstreamAuth)
	}
}
