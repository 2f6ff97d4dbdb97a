package wire

import (
	"reflect"
	"regexp"
	"testing"
	"time"
	"unicode"
)

// every wire type with tags, reached from the requests and answers.
var wireTypes = []any{ExecRequest{}, ExecResponse{}, WriteRequest{}, ReadResponse{}, ListRequest{}, ListResponse{}, PathRequest{}, OK{},
	SearchRequest{}, SearchResponse{}, NewRunRequest{}, RunSetupRequest{}, NewRunResponse{}, NoteRequest{}, RunView{}, RecipeRunRequest{}, RecipeRunStarted{},
	RecipeList{}, ShareRequest{}, NewKeyRequest{}, ReplayRequest{}}

// Every tag parses, and every pattern compiles as Go's RE2 (as JSON
// Schema's validators here read it).
func TestFieldsWellFormed(t *testing.T) {
	for _, v := range wireTypes {
		for _, f := range Fields(reflect.TypeOf(v)) {
			fd, err := fieldOf(f.Tag)
			if err != nil {
				t.Errorf("%T.%s: %v", v, f.Name, err)
			}
			for _, p := range []string{fd.Pattern, fd.KeyPattern, fd.ValuePattern} {
				if _, err := regexp.Compile(p); p != "" && err != nil {
					t.Errorf("%T.%s: pattern %q: %v", v, f.Name, p, err)
				}
			}
			if fd.MinDuration != "" {
				if _, err := time.ParseDuration(fd.MinDuration); err != nil {
					t.Errorf("%T.%s: %v", v, f.Name, err)
				}
			}
		}
	}
}

// NonBlank matches a string exactly when it holds a rune that
// unicode.IsSpace (and so strings.TrimSpace, which the core checks with)
// does not count as white space.
func TestNonBlankAgrees(t *testing.T) {
	re := regexp.MustCompile(NonBlank)
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		if got, want := re.MatchString(string(r)), !unicode.IsSpace(r); got != want {
			t.Errorf("U+%04X: NonBlank matches %v, want %v", r, got, want)
		}
	}
}

// The share link's lower bound in the contract is the one the handler
// enforces.
func TestShareTTLBound(t *testing.T) {
	f, _ := reflect.TypeFor[ShareRequest]().FieldByName("TTL")
	fd := FieldOf(f)
	if d, err := time.ParseDuration(fd.MinDuration); err != nil || d != MinShareTTL {
		t.Errorf("ShareRequest.ttl's minimum is %q, want %s", fd.MinDuration, MinShareTTL)
	}
}
