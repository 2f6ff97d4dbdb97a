package tavily_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
)

// Example searches a fake Tavily for last month's news about a competitor
// and prints the results and the record kept for citations.
func Example() {
	fake := httptest.NewServer(tavilytest.NewHandler(tavilytest.Config{Keys: []string{"tvly-dev-example"}}))
	defer fake.Close()

	// In the server, APIKey comes from TAVILY_API_KEY and BaseURL from
	// TRIAD_TAVILY_URL (empty means Tavily itself).
	client, err := tavily.New(tavily.Config{APIKey: "tvly-dev-example", BaseURL: fake.URL})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	rec, err := client.Search(context.Background(), browser.Request{
		Query:     "Globex Insights price cut",
		TopK:      3,
		DateRange: "month",
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rec.Response().Results {
		fmt.Println(r.PublishedAt, r.Title)
	}
	fmt.Println("top domain:", rec.TopDomains[0].Domain)
	fmt.Println("sent upstream:", string(rec.UpstreamRequest))
	// Output:
	// 2026-11-18T16:30:00Z Globex Insights cuts Starter plan price 20% to win small teams
	// 2026-11-08T12:00:00Z Acme Analytics vs Globex Insights: 2026 comparison
	// 2026-11-05T12:00:00Z Globex Insights raises $120 million Series D at $2.1 billion valuation
	// top domain: globex-insights.example
	// sent upstream: {"query":"Globex Insights price cut","max_results":3,"include_raw_content":false,"time_range":"month"}
}
