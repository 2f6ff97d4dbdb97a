package tavilytest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
)

// CorpusNow is the fake's default "now": the corpus was written as if on this
// day, so time_range filters give the same answers whenever the tests run.
var CorpusNow = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// Document is one page the fake can return.
type Document struct {
	URL   string `json:"url"`
	Title string `json:"title"`
	// Published is the publication time, RFC 3339; empty for undated pages
	// (pricing pages, docs), which time filters and the news topic exclude.
	Published string `json:"published"`
	// Snippet is what the fake returns as a result's content.
	Snippet string `json:"snippet"`
	// Page is the page text in markdown, returned as raw_content.
	Page string `json:"page"`
}

//go:embed testdata/corpus.json
var corpusJSON []byte

// DefaultCorpus returns the built-in corpus: 42 fictional documents about the
// B2B SaaS analytics market, CRM vendors and three competitors (Acme
// Analytics, Globex Insights, Initech Data), dated up to CorpusNow. Every
// host is under the reserved .example top-level domain. One report appears
// twice, with and without a trailing slash, as syndicated copies do on the
// real web.
func DefaultCorpus() []Document {
	var docs []Document
	if err := json.Unmarshal(corpusJSON, &docs); err != nil {
		panic(fmt.Sprintf("tavilytest: embedded corpus: %v", err))
	}
	return docs
}

// indexed is a Document prepared for matching.
type indexed struct {
	Document
	published time.Time // zero when undated
	host      string
	title     map[string]int
	snippet   map[string]int
	page      map[string]int
	paras     []string
}

type index struct {
	docs []indexed
	idf  map[string]float64
}

func newIndex(docs []Document) (*index, error) {
	ix := &index{idf: map[string]float64{}}
	df := map[string]int{}
	for _, d := range docs {
		u, err := url.Parse(d.URL)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("document %q: not an absolute URL", d.URL)
		}
		in := indexed{
			Document: d,
			host:     strings.ToLower(u.Hostname()),
			title:    termCounts(d.Title),
			snippet:  termCounts(d.Snippet),
			page:     termCounts(d.Page),
			paras:    paragraphs(d.Page),
		}
		if d.Published != "" {
			t, err := time.Parse(time.RFC3339, d.Published)
			if err != nil {
				return nil, fmt.Errorf("document %q: published: %w", d.URL, err)
			}
			in.published = t.UTC()
		}
		seen := map[string]bool{}
		for _, m := range []map[string]int{in.title, in.snippet, in.page} {
			for t := range m {
				if !seen[t] {
					seen[t] = true
					df[t]++
				}
			}
		}
		ix.docs = append(ix.docs, in)
	}
	n := float64(len(docs))
	for t, c := range df {
		ix.idf[t] = math.Log(1 + n/float64(c))
	}
	return ix, nil
}

// score is a BM25-flavoured relevance in [0, 1): for each query term, a
// saturating count in the title (weight 3), snippet (2) and page (1), scaled
// by the term's rarity, divided by the best a document could score.
func (ix *index) score(d *indexed, terms []string) float64 {
	var got, best float64
	sat := func(c int) float64 { return float64(c) / (float64(c) + 1.2) }
	for _, t := range terms {
		idf, ok := ix.idf[t]
		if !ok {
			idf = math.Log(1 + float64(len(ix.docs)))
		}
		got += idf * (3*sat(d.title[t]) + 2*sat(d.snippet[t]) + sat(d.page[t]))
		best += idf * 6
	}
	if best == 0 {
		return 0
	}
	return got / best
}

// chunks returns up to n paragraphs of d's page that share the most terms
// with the query, each cut to 500 characters, in page order: what Tavily's
// advanced search puts in content.
func (d *indexed) chunks(terms []string, n int) []string {
	type scored struct {
		i, hits int
	}
	var ps []scored
	for i, p := range d.paras {
		c := termCounts(p)
		hits := 0
		for _, t := range terms {
			hits += c[t]
		}
		if hits > 0 {
			ps = append(ps, scored{i, hits})
		}
	}
	slices.SortStableFunc(ps, func(a, b scored) int { return b.hits - a.hits })
	ps = ps[:min(n, len(ps))]
	slices.SortFunc(ps, func(a, b scored) int { return a.i - b.i })
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		s := d.paras[p.i]
		if r := []rune(s); len(r) > 500 {
			s = string(r[:500])
		}
		out = append(out, s)
	}
	return out
}

func paragraphs(page string) []string {
	var out []string
	for _, p := range strings.Split(page, "\n\n") {
		if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, "# ") {
			out = append(out, p)
		}
	}
	return out
}

var stopwords = map[string]bool{
	"a": true, "an": true, "and": true, "are": true, "as": true, "at": true, "be": true, "by": true,
	"for": true, "from": true, "has": true, "how": true, "in": true, "is": true, "it": true, "its": true,
	"of": true, "on": true, "or": true, "that": true, "the": true, "this": true, "to": true, "was": true,
	"what": true, "when": true, "which": true, "who": true, "why": true, "will": true, "with": true,
	"about": true, "latest": true, "news": true, "vs": true,
}

// terms splits text into lower-case words, drops stopwords and one-letter
// words, and strips a plural "s" so "vendors" finds "vendor".
func terms(text string) []string {
	var out []string
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if len(w) < 2 || stopwords[w] {
			continue
		}
		if len(w) > 3 && strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") {
			w = w[:len(w)-1]
		}
		out = append(out, w)
	}
	return out
}

func termCounts(text string) map[string]int {
	m := map[string]int{}
	for _, t := range terms(text) {
		m[t]++
	}
	return m
}

// plainText strips the markdown marks the corpus uses, for
// include_raw_content "text".
func plainText(md string) string {
	var b strings.Builder
	for _, line := range strings.Split(md, "\n") {
		line = strings.TrimLeft(line, "#")
		line = strings.TrimPrefix(strings.TrimSpace(line), "- ")
		if strings.HasPrefix(line, "|---") {
			continue
		}
		line = strings.ReplaceAll(line, "**", "")
		line = strings.Trim(line, "|")
		line = strings.ReplaceAll(line, " | ", "\t")
		b.WriteString(strings.TrimSpace(line))
		b.WriteByte('\n')
	}
	return strings.TrimSpace(b.String()) + "\n"
}
