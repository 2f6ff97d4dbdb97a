// Package gen makes the sample data files from fixed seeds; it is separate from package sampledata so that it builds before the files it makes exist.
package gen

import (
	"bytes"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Seed is the fixed seed of every generated file. Changing it changes every
// number the standard recipes report on the sample data.
const Seed = 20261122

// Files returns every sample file, by name. It is deterministic: the same
// program on the same architecture always returns the same bytes.
func Files() map[string][]byte {
	leads, spend := salesFunnel()
	return map[string][]byte{
		"leads.csv":                     leads,
		"spend.csv":                     spend,
		"monthly_revenue.csv":           monthlyRevenue(),
		"options.csv":                   options(),
		"competitor_snapshot_prev.json": competitorSnapshot(),
	}
}

// channel is the ground truth of one marketing channel: leads respond to
// spend as leadsAtBase * (spend/baseSpend)^elasticity, so returns diminish
// where elasticity is low.
type channel struct {
	name        string
	baseSpend   float64
	elasticity  float64
	leadsAtBase float64
	winRate     float64
	dealMean    float64
	campaigns   []string
	phase       float64
}

var channels = []channel{
	{"paid_search", 38000, 0.45, 70, 0.08, 13500, []string{"brand", "competitor-terms", "generic-analytics"}, 0},
	{"paid_social", 26000, 0.70, 55, 0.05, 9000, []string{"linkedin-lead-gen", "linkedin-retargeting"}, 1.3},
	{"display", 14000, 0.35, 28, 0.025, 8500, []string{"programmatic", "industry-sites"}, 2.1},
	{"email", 5000, 0.80, 30, 0.10, 11000, []string{"nurture", "newsletter", "product-updates"}, 3.4},
	{"events", 22000, 0.55, 18, 0.16, 24000, []string{"trade-shows", "roundtables", "webinars"}, 4.2},
	{"partner_referral", 9000, 0.85, 22, 0.20, 17000, []string{"crm-partners", "agency-partners"}, 5.0},
}

// Lead-level seasonality by calendar month: December and January are
// slow, autumn is busy.
var leadSeason = [12]float64{0.9, 0.97, 1.03, 1.0, 1.02, 0.98, 0.92, 0.9, 1.08, 1.1, 1.05, 0.8}

var regions = []struct {
	name   string
	weight float64
	win    float64 // multiplier on the channel's win rate
}{{"North America", 0.55, 1.05}, {"EMEA", 0.30, 0.95}, {"APAC", 0.15, 0.85}}

// salesFunnel makes 18 months (2024-07 to 2025-12) of monthly spend per
// channel and the leads it bought, with each lead's outcome. Leads younger
// than 60 days at the end of the data are often still open.
func salesFunnel() (leadsCSV, spendCSV []byte) {
	r := rand.New(rand.NewPCG(Seed, 1))
	start := time.Date(2024, 7, 1, 0, 0, 0, 0, time.UTC)
	end := time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)
	var spendRows, leadRows [][]string
	n := 0
	for m := 0; m < 18; m++ {
		month := start.AddDate(0, m, 0)
		days := month.AddDate(0, 1, -1).Day()
		for _, c := range channels {
			f := 1 + 0.22*math.Sin(2*math.Pi*(float64(m)+c.phase)/7) + 0.10*r.NormFloat64()
			spend := math.Round(c.baseSpend * math.Max(f, 0.4))
			spendRows = append(spendRows, []string{month.Format("2006-01"), c.name, ftoa(spend, 0)})
			mean := c.leadsAtBase * math.Pow(spend/c.baseSpend, c.elasticity) *
				leadSeason[month.Month()-1] * math.Exp(0.08*r.NormFloat64())
			for range poisson(r, mean) {
				n++
				created := month.AddDate(0, 0, r.IntN(days))
				reg := regions[pick(r, []float64{regions[0].weight, regions[1].weight, regions[2].weight})]
				stage, value := "lost", ""
				age := end.Sub(created).Hours() / 24
				switch {
				case r.Float64() > math.Min(1, age/60):
					stage = "open"
				case r.Float64() < c.winRate*reg.win:
					stage = "won"
					v := c.dealMean * math.Exp(0.45*r.NormFloat64()-0.45*0.45/2)
					value = ftoa(math.Max(100, math.Round(v/100)*100), 0)
				}
				leadRows = append(leadRows, []string{
					fmt.Sprintf("L%05d", n), created.Format("2006-01-02"), c.name,
					c.campaigns[r.IntN(len(c.campaigns))], reg.name, stage, value,
				})
			}
		}
	}
	// Leads are listed by creation date, as a CRM export would list them;
	// ids keep the order in which they were generated.
	sortRows(leadRows, 1)
	return writeCSV([]string{"lead_id", "created_date", "channel", "campaign", "region", "stage", "deal_value"}, leadRows),
		writeCSV([]string{"month", "channel", "spend"}, spendRows)
}

// monthlyRevenue makes 72 months (2020-01 to 2025-12) of revenue with a
// trend that slows after 2022, multiplicative seasonality with a December
// peak and a summer dip, and AR(1) noise.
func monthlyRevenue() []byte {
	r := rand.New(rand.NewPCG(Seed, 2))
	season := [12]float64{0.88, 0.90, 1.02, 0.98, 1.00, 1.04, 0.95, 0.90, 1.03, 1.06, 1.08, 1.16}
	mean := 0.0
	for _, s := range season {
		mean += s / 12
	}
	var rows [][]string
	level, noise := 1_200_000.0, 0.0
	for m := 0; m < 72; m++ {
		month := time.Date(2020, time.Month(1+m), 1, 0, 0, 0, 0, time.UTC)
		if m > 0 {
			growth := 0.010
			if month.Year() >= 2023 {
				growth = 0.006
			}
			level *= 1 + growth
		}
		noise = 0.45*noise + 0.025*r.NormFloat64()
		v := level * season[month.Month()-1] / mean * math.Exp(noise)
		rows = append(rows, []string{month.Format("2006-01"), ftoa(math.Round(v/100)*100, 0)})
	}
	return writeCSV([]string{"month", "revenue"}, rows)
}

// options are four ways to improve revenue forecasting and pipeline
// analytics, with the cost and benefit estimates a CBA starts from. Money
// is in US dollars; benefits are yearly at full adoption.
func options() []byte {
	rows := [][]string{
		{"A", "Buy Acme Analytics Enterprise with Forecast Studio",
			"SaaS platform with AI forecasting; 4-month rollout with a partner; replaces two BI tools.",
			"180000", "240000", "620000", "380000", "820000", "4", "6", "medium", "4"},
		{"B", "Buy Globex Insights Growth with Ask Globex",
			"Self-serve analytics with natural-language queries; quick to roll out, weaker forecasting.",
			"90000", "140000", "380000", "250000", "480000", "2", "4", "low", "3"},
		{"C", "Build warehouse-native forecasting in house",
			"Own models on the data warehouse with a semantic layer; most control, longest build, key-person risk.",
			"420000", "160000", "700000", "300000", "950000", "9", "9", "high", "5"},
		{"D", "Extend the CRM with its revenue analytics add-on",
			"Turn on the CRM vendor's built-in forecasting; cheapest and fastest, limited to CRM data.",
			"40000", "95000", "210000", "150000", "260000", "1", "3", "low", "2"},
	}
	return writeCSV([]string{"option_id", "option", "description", "capex", "annual_opex",
		"annual_benefit", "benefit_low", "benefit_high", "implementation_months", "ramp_months",
		"risk", "strategic_fit"}, rows)
}

// snapshotItem is one search result kept in a competitor snapshot.
type snapshotItem struct {
	URL         string `json:"url"`
	Title       string `json:"title"`
	Snippet     string `json:"snippet"`
	PublishedAt string `json:"published_at,omitempty"`
	Fingerprint string `json:"fingerprint"`
}

// competitorSnapshot is the snapshot an earlier competitor-alert run would
// have saved on 2026-10-25 about the three competitors of the browser
// fake's corpus (browser/tavilytest): some pages unchanged since, two
// pricing pages that changed after it, and two pages gone since.
func competitorSnapshot() []byte {
	item := func(url, title, published, snippet string) snapshotItem {
		return snapshotItem{URL: url, Title: title, Snippet: snippet, PublishedAt: published,
			Fingerprint: fingerprint(title, snippet)}
	}
	snap := struct {
		Format      string                               `json:"format"`
		TakenAt     string                               `json:"taken_at"`
		Competitors map[string]map[string][]snapshotItem `json:"competitors"`
	}{
		Format:  "triad.competitor-snapshot/v1",
		TakenAt: "2026-10-25",
		Competitors: map[string]map[string][]snapshotItem{
			"Acme Analytics": {"items": {
				item("https://www.acme-analytics.example/pricing", "Pricing - Acme Analytics", "",
					"Acme Analytics plans: Starter $29 per seat per month (up to 5 seats), Growth $60 per seat per month with unlimited events, Enterprise custom pricing with SSO, audit logs and EU data residency."),
				item("https://blog.acme-analytics.example/2026/10/pricing-update", "An update to Acme Analytics pricing: usage-based Growth plans", "2026-10-02",
					"Acme Analytics is moving its Growth tier to a hybrid model: list price per seat rises 8% to $65 per month, and 10 million tracked events per month are included before usage charges of $0.20 per additional 100,000 events."),
				item("https://blog.acme-analytics.example/2026/06/frankfurt-region", "Acme Analytics opens Frankfurt region for EU data residency", "2026-06-15",
					"Acme Analytics now hosts EU customers' data in a Frankfurt region, meeting data-residency requirements that had blocked deals with German and French enterprises."),
				item("https://www.acme-analytics.example/press/northwind-crm-partnership", "Acme Analytics and Northwind CRM announce strategic partnership", "2025-09-30",
					"Acme Analytics and Northwind CRM announced a partnership that syncs CRM objects into Acme in near real time and lists Acme in the Northwind marketplace."),
				item("https://careers.acme-analytics.example/jobs/staff-ml-engineer-forecasting", "Staff ML Engineer, Forecasting - Acme Analytics Careers", "2026-08-04",
					"Acme Analytics is hiring a staff machine learning engineer to build forecasting models for revenue teams on CRM and product usage data."),
			}},
			"Globex Insights": {"items": {
				item("https://www.globex-insights.example/pricing", "Plans and pricing - Globex Insights", "",
					"Globex Insights plans: Starter $49 per seat per month (up to 5 seats), Growth $59 per seat per month, Business $89 per seat per month with SSO and audit logs."),
				item("https://www.globex-insights.example/blog/ask-globex", "Introducing Ask Globex: natural-language questions over your product data", "2026-08-20",
					"Ask Globex lets users ask questions in plain English and returns a chart with the generated SQL, available on Growth and Business plans."),
				item("https://www.globex-insights.example/customers/brightcart", "How BrightCart replaced three BI tools with Globex Insights", "2026-03-11",
					"Retail software company BrightCart consolidated three BI tools onto Globex Insights, cutting analytics spend by 35% and report turnaround from days to hours."),
				item("https://status.globex-insights.example/incidents/2025-05-14", "Postmortem: Globex Insights dashboard outage on May 14, 2025", "2025-05-14",
					"Globex Insights dashboards were unavailable for 3 hours 12 minutes on May 14, 2025 after a database migration locked a metadata table."),
			}},
			"Initech Data": {"items": {
				item("https://www.initech-data.example/product", "Initech Data - warehouse-native analytics", "2025-12-01",
					"Initech Data is a warehouse-native analytics platform for data teams: semantic layer, SQL notebooks and dashboards on Snowflake, BigQuery and Databricks. Pricing starts at $45 per seat per month."),
				item("https://www.initech-data.example/newsroom/warehouse-native-connector", "Initech Data launches warehouse-native connector for Snowflake and BigQuery", "2026-04-09",
					"Initech Data released a warehouse-native connector that queries Snowflake and BigQuery in place, so customers no longer copy data into Initech's store."),
				item("https://community.analyticsops.example/t/migrating-from-initech-to-acme/4412", "Migrating from Initech Data to Acme Analytics - lessons learned", "2026-01-20",
					"A data lead describes a six-week migration from Initech Data to Acme Analytics: the semantic layer mapped cleanly, scheduled reports took longest, and total cost fell about 10%."),
				item("https://www.initech-data.example/newsroom/series-c-extension", "Initech Data extends Series C with $30 million from existing investors", "2026-02-17",
					"Initech Data added $30 million to its Series C from existing investors to fund its warehouse-native roadmap and expansion in Europe."),
			}},
		},
	}
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		panic("gen: marshal snapshot: " + err.Error())
	}
	return append(b, '\n')
}

// fingerprint is the competitor-alert recipe's change detector for one
// search result: the first 16 hex digits of the sha256 of its title and
// snippet, lower-cased with whitespace collapsed. The recipe's Python
// computes the same for ASCII text.
func fingerprint(title, snippet string) string {
	norm := func(s string) string { return strings.Join(strings.Fields(strings.ToLower(s)), " ") }
	sum := sha256.Sum256([]byte(norm(title) + "\n" + norm(snippet)))
	return hex.EncodeToString(sum[:])[:16]
}

// poisson draws from a Poisson distribution by Knuth's method, which is
// exact and fast enough for the means used here (under 200).
func poisson(r *rand.Rand, mean float64) int {
	l, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func pick(r *rand.Rand, weights []float64) int {
	x := r.Float64()
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(weights) - 1
}

func sortRows(rows [][]string, col int) {
	slices.SortStableFunc(rows, func(a, b []string) int { return strings.Compare(a[col], b[col]) })
}

func ftoa(f float64, prec int) string { return strconv.FormatFloat(f, 'f', prec, 64) }

func writeCSV(header []string, rows [][]string) []byte {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	_ = w.Write(header) // writes to a bytes.Buffer cannot fail
	_ = w.WriteAll(rows)
	return b.Bytes()
}
