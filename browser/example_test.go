package browser_test

import (
	"fmt"
	"strings"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
)

// ExampleDecodeRequest shows a browser.search body being read, and the 400
// a bad one gets: the message names the field and the suggestion says what
// to send instead.
func ExampleDecodeRequest() {
	req, err := browser.DecodeRequest(strings.NewReader(`{"query": "Acme Analytics pricing", "date_range": "2026-01-01..2026-06-30"}`))
	fmt.Println(req.Query, req.DateRange, err)
	fmt.Println("normalised top_k:", req.Normalized().TopK)

	_, err = browser.DecodeRequest(strings.NewReader(`{"query": "Acme", "allow_domains": ["https://acme-analytics.example/pricing"]}`))
	fe := fault.As(err)
	fmt.Println(fault.Status(fe.Kind), fe.Message)
	fmt.Println(fe.Suggestion)
	// Output:
	// Acme Analytics pricing 2026-01-01..2026-06-30 <nil>
	// normalised top_k: 5
	// 400 allow_domains[0] "https://acme-analytics.example/pricing" is not a hostname: it has a scheme; send only the host
	// send bare hostnames such as "example.com": no scheme, path or port; internationalised names in punycode (xn--...)
}
