package cel

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Every piece of text that reaches CEL.md from a caller or a cell (inputs,
// paths, error messages, notes, critiques, labels) goes through inline or
// noteLines. Together they make the rule that no such text can imitate the
// journal's own structure, for a Markdown renderer or for a program that
// splits lines as Python's str.splitlines does:
//   - every line break (\n, \r, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029)
//     ends a note line or becomes " ⏎ " in a one-line value, so text can
//     never start a line of its own (a "## Step" heading);
//   - other control characters and invisible format characters (bidi
//     overrides, zero-width marks) are shown as \u escapes;
//   - the Markdown characters that make headings, emphasis, code spans and
//     raw HTML (\ ` * _ # < > [ ]) are backslash-escaped, so
//     "**Evaluation (by Evaluator):** PASS" in a note is plain text.
// See DECISIONS.md, "The journal is written only by Triad".

// maxInline caps a one-line value, in runes.
const maxInline = 300

// isBreak reports whether r ends a line for str.splitlines (and so for any
// reader that splits lines at least as eagerly as CommonMark does).
func isBreak(r rune) bool {
	switch r {
	case '\n', '\r', '\v', '\f', '\x1c', '\x1d', '\x1e', '\u0085', '\u2028', '\u2029':
		return true
	}
	return false
}

// escapeRunes writes s to w with Markdown escaped and invisible runes
// shown; line breaks are the caller's business.
func escapeRunes(w *strings.Builder, s string) {
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			w.WriteString(`\uFFFD`)
		case strings.ContainsRune("\\`*_#<>[]", r):
			w.WriteByte('\\')
			w.WriteRune(r)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || isBreak(r):
			fmt.Fprintf(w, `\u%04X`, r)
		default:
			w.WriteRune(r)
		}
	}
}

// inline renders untrusted text as one line of Markdown text, cut at
// maxInline runes.
func inline(s string) string {
	var w strings.Builder
	n := 0
	cr := false
	for _, r := range s {
		if n == maxInline {
			w.WriteString("…")
			break
		}
		n++
		if isBreak(r) {
			// \r\n is one break.
			if r == '\n' && cr {
				cr = false
				continue
			}
			cr = r == '\r'
			w.WriteString(" ⏎ ")
			continue
		}
		cr = false
		escapeRunes(&w, string(r))
	}
	return w.String()
}

// splitLines splits s at every line break, \r\n counting as one, as
// str.splitlines does.
func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !isBreak(r) {
			i += size
			continue
		}
		out = append(out, s[start:i])
		i += size
		if r == '\r' && i < len(s) && s[i] == '\n' {
			i++
		}
		start = i
	}
	return append(out, s[start:])
}

// noteLines renders an operator note as blockquote lines, one per line of
// its text, each escaped.
func noteLines(text string) []string {
	lines := splitLines(strings.TrimRightFunc(text, isBreak))
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		var w strings.Builder
		w.WriteString("> ")
		escapeRunes(&w, strings.TrimRightFunc(l, unicode.IsSpace))
		out = append(out, w.String())
	}
	return out
}

// codeSpan renders a path as an inline code span whose fence is longer than
// any run of backticks in it (CommonMark), so it cannot close early. Paths
// are validated (internal/safepath) and hold no line breaks or invisible
// characters; escapeRunes-style escapes do not apply inside code spans.
func codeSpan(s string) string {
	longest, run := 0, 0
	for _, c := range []byte(s) {
		if c == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	fence := strings.Repeat("`", longest+1)
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}
