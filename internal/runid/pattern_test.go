package runid

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

var patternRE = regexp.MustCompile(Pattern)

func agree(t *testing.T, s string) {
	t.Helper()
	_, err := Parse(s)
	if got, want := patternRE.MatchString(s), err == nil; got != want {
		t.Errorf("Pattern matches %q: %v, but Parse accepts it: %v (%v)", s, got, want, err)
	}
}

// The pattern the documents state accepts exactly the ids Parse accepts.
func TestPatternAgrees(t *testing.T) {
	for _, s := range []string{"", "a", "-a", ".a", "a-", "r-" + strings.Repeat("x", 62), "r-" + strings.Repeat("x", 63), "a b", "a\n", "é", "A.b_c-9"} {
		agree(t, s)
	}
	const alphabet = "aZ09._-/ \x00é"
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		n := r.IntN(70)
		if r.IntN(2) == 0 {
			n = r.IntN(5)
		}
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		agree(t, b.String())
	}
}
