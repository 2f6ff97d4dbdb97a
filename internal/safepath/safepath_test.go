package safepath

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

var (
	pathRE   = regexp.MustCompile(Pattern)
	prefixRE = regexp.MustCompile(PrefixPattern)
)

// pieces are what paths that test the patterns are made of: every class of
// character and component Clean treats apart.
var pieces = []string{"a", "b.txt", ".", "..", "...", ".x", "..x", "/", "/", "/", "\\", "\x00", "\x7f", "\u0085", "\u2028", "\u2029", "\u200b", "\ufeff", "é", "日本", " ", "-", "\xff"}

// agree checks that the pattern and the function give the same answer for
// p: a string a JSON document can hold (valid UTF-8), within the byte
// limits, which no pattern states.
func agree(t *testing.T, p string) {
	t.Helper()
	if len(p) > MaxComponent || !utf8.ValidString(p) {
		return
	}
	_, err := Clean(p)
	if got, want := pathRE.MatchString(p), err == nil; got != want {
		t.Errorf("Pattern matches %q: %v, but Clean accepts it: %v (%v)", p, got, want, err)
	}
	_, err = CleanPrefix(p)
	if got, want := prefixRE.MatchString(p), err == nil; got != want {
		t.Errorf("PrefixPattern matches %q: %v, but CleanPrefix accepts it: %v (%v)", p, got, want, err)
	}
}

// The patterns the documents state accept exactly the paths Clean and
// CleanPrefix accept.
func TestPatternsAgree(t *testing.T) {
	for _, p := range []string{"", "a", "a/b", "./a", "a/./b", "a//b", ".//a", "a/", "a/.", "a/./", "./", ".", "..", "../a", "a/..", "a/../b",
		"/a", "...", ".a", "..a", "a\\b", "a\x00", "a\u2028b", "a\u200bb", "é/日本.csv", "a\xff", "artifacts/", "./artifacts//"} {
		agree(t, p)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var b strings.Builder
		for range 1 + r.IntN(7) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		agree(t, b.String())
	}
}

func FuzzPatternsAgree(f *testing.F) {
	for _, p := range []string{"a/b", "./a", "a//b/", "..", "a\u2028"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) { agree(t, p) })
}
