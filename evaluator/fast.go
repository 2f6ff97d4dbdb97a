package evaluator

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// The rubric (evaluator.py) opens a step's artifacts only to parse the
// kinds it knows (CSV, JSON, PNG, HTML, Markdown, text, PDF, notebooks).
// Most steps have none (a cell that wrote no file, a read, a listing, a
// search), and grading them is arithmetic on the request: Grade does that
// arithmetic in Go, exactly as the rubric does, and Evaluate sends only
// the steps with something to parse to the jailed interpreter. A
// differential test grades a table of requests both ways and requires the
// same verdicts. See "When the evaluator runs" in docs/DECISIONS.md.

// passThreshold is the rubric's PASS_THRESHOLD.
const passThreshold = 0.75

// checked are the extensions the rubric parses (its CHECKS), and read the
// ones it opens for evidence.
var (
	checked = map[string]bool{".csv": true, ".json": true, ".jsonl": true, ".png": true, ".html": true, ".htm": true,
		".md": true, ".txt": true, ".pdf": true, ".ipynb": true}
	evidence = map[string]bool{".md": true, ".html": true, ".htm": true}
)

// NeedsFiles reports whether grading req reads any of its artifacts' bytes:
// then only the rubric itself, in its jail, may grade it.
func NeedsFiles(req Request) bool {
	for _, a := range req.Artifacts {
		ext := strings.ToLower(pyExt(a.Path))
		if checked[ext] || evidence[ext] {
			return true
		}
	}
	return false
}

// Grade grades a request whose artifacts the rubric would not open
// (NeedsFiles is false), exactly as evaluator.py does. It reports false
// for any other request.
func Grade(req Request) (Verdict, bool) {
	if NeedsFiles(req) {
		return Verdict{}, false
	}
	ok := req.OK
	var notes []string

	byPath := map[string]Artifact{}
	for _, a := range req.Artifacts {
		byPath[a.Path] = a
	}
	var completeness float64
	switch {
	case !ok:
		completeness = 0.0
		reason := req.Error
		if reason == "" {
			reason = "no reason given"
		}
		notes = append(notes, "the call failed: "+reason)
	case len(req.Expected) > 0:
		have := 0
		for _, e := range req.Expected {
			a, found := byPath[e.Path]
			if !found {
				a, found = req.RunFiles[e.Path]
			}
			if found && a.Size > 0 {
				have++
			} else {
				notes = append(notes, fmt.Sprintf("expected artifact %s is missing or empty", e.Path))
			}
		}
		completeness = float64(have) / float64(len(req.Expected))
	case req.Tool == "tmp.write":
		completeness = 0.5
		if len(req.Artifacts) > 0 && req.Artifacts[0].Size > 0 {
			completeness = 1.0
		}
		if completeness < 1 {
			notes = append(notes, "the written file is empty")
		}
	default:
		completeness = 1.0
	}

	// No artifact of a kind the rubric parses: nothing is checked.
	correctness := 1.0
	if !ok {
		correctness = 0.0
	}

	var scores []float64
	if req.Tool == "browser.search" && ok && req.Results == 0 {
		scores = append(scores, 0.5)
		notes = append(notes, "the search returned no results, so it adds no evidence")
	}
	evidence := 1.0
	if len(scores) > 0 {
		sum := 0.0
		for _, s := range scores {
			sum += s
		}
		evidence = sum / float64(len(scores))
	}

	hygiene := 1.0
	switch {
	case hasWordEnd(req.Stderr, "Error") || hasWordEnd(req.Stderr, "Exception") || strings.Contains(req.Stderr, "Traceback"):
		hygiene -= 0.5
		notes = append(notes, "stderr shows an error")
	case hasWordEnd(req.Stderr, "Warning") || hasWordEnd(req.Stderr, "warning"):
		hygiene -= 0.25
		notes = append(notes, "stderr shows a warning")
	case pyStrip(req.Stderr) != "":
		hygiene -= 0.1
	}
	if !ok {
		hygiene -= 0.25
	}
	if req.Restarted {
		hygiene -= 0.25
		notes = append(notes, "the kernel restarted and lost its state")
	}
	if len(req.Tampered) > 0 {
		hygiene -= 0.5
		notes = append(notes, fmt.Sprintf("the cell changed the journal (%s); it was restored", strings.Join(req.Tampered, ", ")))
	}
	if req.BudgetMs != 0 && req.ElapsedMs > req.BudgetMs {
		hygiene -= 0.25
		notes = append(notes, "the call ran past its time budget")
	}
	hygiene = math.Max(0.0, hygiene)

	// Python's sum() adds left to right from 0 (3.11: no compensation).
	score := (0 + completeness + correctness + evidence + hygiene) / 4
	low := math.Min(math.Min(completeness, correctness), math.Min(evidence, hygiene))
	passed := ok && completeness >= 1.0 && low >= 0.5 && score >= passThreshold
	if len(notes) == 0 {
		notes = append(notes, "all checks passed")
	}
	critique := strings.Join(notes[:min(3, len(notes))], "; ")
	if len(notes) > 3 {
		critique += fmt.Sprintf("; and %d more", len(notes)-3)
	}
	return Verdict{Pass: passed, Score: pyRound4(score), Completeness: pyRound4(completeness), Correctness: pyRound4(correctness),
		Evidence: pyRound4(evidence), Hygiene: pyRound4(hygiene), Critique: critique + "."}, true
}

// pyExt is os.path.splitext(p)[1]: the last dot of the last path element
// and what follows, unless the element's dots all lead it.
func pyExt(p string) string {
	base := p[strings.LastIndexByte(p, '/')+1:]
	dot := strings.LastIndexByte(base, '.')
	if dot <= 0 || strings.Trim(base[:dot], ".") == "" {
		return ""
	}
	return base[dot:]
}

// hasWordEnd reports whether re.search(word + r"\b", s) matches: word
// occurs followed by the end of s or a rune that is not a word character
// (Python's \w on str: letters, digits, numbers, underscore).
func hasWordEnd(s, word string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], word)
		if j < 0 {
			return false
		}
		end := i + j + len(word)
		if end == len(s) {
			return true
		}
		r := []rune(s[end:min(end+4, len(s))])[0]
		if !(unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_') {
			return true
		}
		i += j + 1
	}
}

// pyStrip is str.strip(): whitespace as str.isspace() counts it, which
// includes the information separators \x1c-\x1f that unicode.IsSpace
// does not.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
	})
}

// pyRound4 is Python's round(x, 4): the correctly rounded decimal with
// four places (ties to even, on x's exact value), read back as a float.
func pyRound4(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 4, 64), 64)
	return v
}
