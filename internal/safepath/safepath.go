// Package safepath is the one validator for run file paths, shared by every surface.
package safepath

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
)

// Limits on a path. Names longer than most filesystems allow are refused up
// front so that a path accepted by the store can always be materialised in a
// kernel's working directory.
const (
	MaxPath      = 1024
	MaxComponent = 255
)

// char is a character a path component may hold: anything but "/", a
// backslash, and what unsafeRune refuses.
const char = `[^/\\\p{Cc}\p{Cf}` + "\u2028\u2029" + `]`

// name is a component that names something: not empty, ".", or "..".
const name = `(?:[^./\\\p{Cc}\p{Cf}` + "\u2028\u2029" + `]` + char + `*|\.[^./\\\p{Cc}\p{Cf}` + "\u2028\u2029" + `]` + char + `*|\.\.` + char + `+)`

// body is a path as Clean accepts it: components joined by "/", of which
// empty and "." ones are skipped, the first not empty (no leading "/"), the
// last not empty (no trailing "/"), and at least one a name.
const body = `(?:\.(?:/\.?)*/)?` + name + `(?:(?:/\.?)*/(?:\.|` + name + `))*`

// Pattern and PrefixPattern are the regular expressions (RE2 and ECMA-262
// with the u flag alike) of the paths Clean and CleanPrefix accept, for
// documents that describe them (the OpenAPI document, MCP's tool
// schemas); a test holds each to the same answers as its function. Only
// the byte limits (MaxPath, MaxComponent) are beyond a pattern.
const (
	Pattern       = `^` + body + `$`
	PrefixPattern = `^(?:` + body + `(?:(?:/\.?)*/)?)?$`
)

const suggestion = "use a relative path such as \"data/kpis.csv\": no leading '/', no '..', no control or invisible characters, at most 1024 bytes"

// Clean validates p as a run file path and returns its cleaned form
// ("a//b/./c" becomes "a/b/c"). It refuses, rather than resolves, anything
// that could point outside the run: "..", absolute paths, NUL and control
// characters (and Unicode line separators and invisible format characters),
// backslashes and over-long names.
func Clean(p string) (string, error) {
	return clean(p, false)
}

// CleanPrefix validates a listing prefix. The empty prefix is allowed and a
// trailing slash is kept, so "artifacts/" matches only that directory.
func CleanPrefix(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	return clean(p, true)
}

// unsafeRune reports runes a path may not hold because they can change how
// a line of text that quotes the path reads: C0 and C1 controls (U+0085,
// NEL, among them), the Unicode line and paragraph separators, and
// invisible format characters such as bidirectional overrides. A reader
// that splits lines as Python's str.splitlines does would otherwise see a
// new line in the middle of a journal entry.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Cf, r)
}

func clean(p string, prefix bool) (string, error) {
	if p == "" {
		return "", fault.New(fault.BadInput, "path is empty", suggestion)
	}
	if len(p) > MaxPath {
		return "", fault.Badf(suggestion, "path is %d bytes long; the limit is %d", len(p), MaxPath)
	}
	if !utf8.ValidString(p) {
		return "", fault.New(fault.BadInput, "path is not valid UTF-8", suggestion)
	}
	for _, r := range p {
		if r == 0 {
			return "", fault.New(fault.BadInput, "path contains a NUL byte", suggestion)
		}
		if unsafeRune(r) {
			return "", fault.Badf(suggestion, "path contains the character U+%04X (a control, line or paragraph separator, or invisible format character)", r)
		}
		if r == '\\' {
			return "", fault.New(fault.BadInput, "path contains a backslash", suggestion)
		}
	}
	if strings.HasPrefix(p, "/") {
		return "", fault.Badf(suggestion, "path %q is absolute", p)
	}
	trailing := strings.HasSuffix(p, "/")
	parts := strings.Split(p, "/")
	out := parts[:0]
	for _, c := range parts {
		switch c {
		case "", ".":
			continue
		case "..":
			return "", fault.Badf(suggestion, "path %q contains '..'", p)
		}
		if len(c) > MaxComponent {
			return "", fault.Badf(suggestion, "a component of the path is %d bytes long; the limit is %d", len(c), MaxComponent)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return "", fault.Badf(suggestion, "path %q names no file", p)
	}
	cleaned := strings.Join(out, "/")
	if trailing {
		if !prefix {
			return "", fault.Badf(suggestion, "path %q ends in '/', which names a directory, not a file", p)
		}
		cleaned += "/"
	}
	return cleaned, nil
}
