package apifuzz

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
)

// gen makes values from schemas: valid ones (value), and values that
// break one rule of a schema (invalid).
type gen struct {
	r       *rand.Rand
	formats map[string]func(r *rand.Rand, s *openapi3.Schema) string
}

// errNoValue says a schema allows no value gen can make.
var errNoValue = fmt.Errorf("apifuzz: no value found for the schema")

// value returns a value s allows, checked against s itself (so oneOf,
// anyOf, allOf and not are honoured by trying again).
func (g *gen) value(s *openapi3.Schema) (any, error) {
	for range 50 {
		v := g.try(s, 0)
		if s.VisitJSON(v, visit...) == nil {
			return v, nil
		}
	}
	return nil, errNoValue
}

// visit is how values are checked: as a request (readOnly ignored), with
// formats.
var visit = []openapi3.SchemaValidationOption{openapi3.VisitAsRequest(), openapi3.EnableFormatValidation()}

func (g *gen) try(s *openapi3.Schema, depth int) any {
	if s == nil {
		return g.anyJSON(depth)
	}
	if len(s.Enum) > 0 {
		return s.Enum[g.r.IntN(len(s.Enum))]
	}
	if len(s.AllOf) == 1 && s.Type == nil && len(s.Properties) == 0 {
		return g.try(s.AllOf[0].Value, depth)
	}
	if s.Type == nil || len(*s.Type) == 0 {
		if len(s.AnyOf) > 0 && len(s.Properties) == 0 {
			return g.try(s.AnyOf[g.r.IntN(len(s.AnyOf))].Value, depth)
		}
		if len(s.Properties) > 0 {
			return g.object(s, depth)
		}
		return g.anyJSON(depth)
	}
	switch t := (*s.Type)[g.r.IntN(len(*s.Type))]; t {
	case "string":
		return g.str(s)
	case "integer":
		return g.integer(s)
	case "number":
		return g.number(s)
	case "boolean":
		return g.r.IntN(2) == 0
	case "array":
		return g.array(s, depth)
	case "object":
		return g.object(s, depth)
	case "null":
		return nil
	}
	return nil
}

func (g *gen) anyJSON(depth int) any {
	switch n := g.r.IntN(5); {
	case n == 0 || depth > 2:
		return g.word()
	case n == 1:
		return float64(g.r.IntN(2000) - 1000)
	case n == 2:
		return g.r.IntN(2) == 0
	case n == 3:
		return []any{g.word(), float64(g.r.IntN(10))}
	default:
		return map[string]any{g.word(): g.word()}
	}
}

// words are the building blocks of strings without a pattern: plain,
// with spaces, with characters JSON and paths treat apart, and non-ASCII.
var words = []string{"data", "report", "Q3", "x", "alpha", "beta", "é", "日本", "naïve", "a b", "ü-ß", "O'Neil", "50%", "τ", "😀", "tab\there", "line\nbreak", "\u00a0"}

func (g *gen) word() string { return words[g.r.IntN(len(words))] }

func (g *gen) str(s *openapi3.Schema) string {
	for range 30 {
		v := g.str1(s)
		if s.VisitJSON(v, visit...) == nil && withinBytes(s, v) {
			return v
		}
	}
	return g.str1(s)
}

func withinBytes(s *openapi3.Schema, v string) bool {
	if n, ok := maxBytes(s); ok {
		return uint64(len(v)) <= n
	}
	return true
}

func maxBytes(s *openapi3.Schema) (uint64, bool) {
	switch n := s.Extensions["x-max-bytes"].(type) {
	case float64:
		return uint64(n), true
	case uint64:
		return n, true
	case int:
		return uint64(n), true
	case json.Number:
		v, err := n.Int64()
		return uint64(v), err == nil
	}
	return 0, false
}

func (g *gen) str1(s *openapi3.Schema) string {
	if f := g.formats[s.Format]; f != nil {
		return f(g.r, s)
	}
	if s.Pattern != "" {
		if v, ok := g.matching(s.Pattern); ok {
			return v
		}
	}
	lo, hi := int(s.MinLength), int(s.MinLength)+12
	if s.MaxLength != nil {
		hi = min(hi, int(*s.MaxLength))
	}
	n := lo
	if hi > lo {
		n += g.r.IntN(hi - lo + 1)
	}
	var b strings.Builder
	for utf8.RuneCountInString(b.String()) < n {
		b.WriteString(g.word())
	}
	return string([]rune(b.String())[:n])
}

// matching returns a string the regular expression matches.
func (g *gen) matching(pattern string) (string, bool) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "", false
	}
	re = re.Simplify()
	var b strings.Builder
	anchoredStart := startsAnchored(re)
	if !anchoredStart && g.r.IntN(2) == 0 {
		b.WriteString(g.word())
	}
	g.regex(&b, re, 0)
	if !endsAnchored(re) && g.r.IntN(2) == 0 {
		b.WriteString(g.word())
	}
	return b.String(), true
}

func startsAnchored(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginText, syntax.OpBeginLine:
		return true
	case syntax.OpConcat, syntax.OpCapture:
		return len(re.Sub) > 0 && startsAnchored(re.Sub[0])
	case syntax.OpAlternate:
		for _, s := range re.Sub {
			if !startsAnchored(s) {
				return false
			}
		}
		return true
	}
	return false
}

func endsAnchored(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpEndText, syntax.OpEndLine:
		return true
	case syntax.OpConcat, syntax.OpCapture:
		return len(re.Sub) > 0 && endsAnchored(re.Sub[len(re.Sub)-1])
	case syntax.OpAlternate:
		for _, s := range re.Sub {
			if !endsAnchored(s) {
				return false
			}
		}
		return true
	}
	return false
}

func (g *gen) regex(b *strings.Builder, re *syntax.Regexp, depth int) {
	switch re.Op {
	case syntax.OpLiteral:
		for _, r := range re.Rune {
			if re.Flags&syntax.FoldCase != 0 && g.r.IntN(2) == 0 {
				r = unicode.SimpleFold(r)
			}
			b.WriteRune(r)
		}
	case syntax.OpCharClass:
		b.WriteRune(g.class(re.Rune))
	case syntax.OpAnyCharNotNL, syntax.OpAnyChar:
		b.WriteString(string(rune('a' + g.r.IntN(26))))
	case syntax.OpCapture:
		g.regex(b, re.Sub[0], depth)
	case syntax.OpConcat:
		for _, s := range re.Sub {
			g.regex(b, s, depth)
		}
	case syntax.OpAlternate:
		g.regex(b, re.Sub[g.r.IntN(len(re.Sub))], depth)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		lo, hi := 0, 3
		switch re.Op {
		case syntax.OpPlus:
			lo = 1
		case syntax.OpQuest:
			hi = 1
		case syntax.OpRepeat:
			lo, hi = re.Min, re.Max
			if hi < 0 {
				hi = lo + 3
			}
		}
		if depth > 4 {
			hi = lo
		}
		hi = min(hi, lo+8)
		n := lo
		if hi > lo {
			n += g.r.IntN(hi - lo + 1)
		}
		for range n {
			g.regex(b, re.Sub[0], depth+1)
		}
	}
}

// class picks a rune of a character class, preferring printable ASCII.
func (g *gen) class(ranges []rune) rune {
	if g.r.IntN(4) != 0 {
		var ascii []rune
		for i := 0; i+1 < len(ranges); i += 2 {
			for r := max(ranges[i], 0x20); r <= min(ranges[i+1], 0x7e); r++ {
				ascii = append(ascii, r)
			}
		}
		if len(ascii) > 0 {
			return ascii[g.r.IntN(len(ascii))]
		}
	}
	for range 100 {
		i := g.r.IntN(len(ranges)/2) * 2
		lo, hi := ranges[i], ranges[i+1]
		r := lo + rune(g.r.Int64N(int64(hi-lo)+1))
		if utf8.ValidRune(r) && r != utf8.RuneError {
			return r
		}
	}
	return ranges[0]
}

func (g *gen) integer(s *openapi3.Schema) any {
	lo, hi := -1000.0, 1000.0
	if s.Min != nil {
		lo = *s.Min
		if s.Max == nil {
			hi = lo + 1000
		}
	}
	if s.Max != nil {
		hi = *s.Max
		if s.Min == nil {
			lo = hi - 1000
		}
	}
	if v := s.ExclusiveMin.Value; v != nil {
		lo = math.Floor(*v) + 1
	}
	if hi < lo {
		return int64(lo)
	}
	// Boundaries often, values between otherwise.
	switch g.r.IntN(4) {
	case 0:
		return int64(lo)
	case 1:
		return int64(hi)
	}
	return int64(lo) + g.r.Int64N(int64(hi-lo)+1)
}

func (g *gen) number(s *openapi3.Schema) any {
	lo, hi := -1000.0, 1000.0
	if s.Min != nil {
		lo = *s.Min
	}
	if s.Max != nil {
		hi = *s.Max
	}
	if v := s.ExclusiveMin.Value; v != nil {
		lo = *v + 0.001
	}
	if hi < lo {
		hi = lo + 1000
	}
	v := lo + g.r.Float64()*(hi-lo)
	return math.Round(v*1000) / 1000
}

func (g *gen) array(s *openapi3.Schema, depth int) any {
	lo, hi := int(s.MinItems), int(s.MinItems)+3
	if s.MaxItems != nil {
		hi = min(hi, int(*s.MaxItems))
	}
	if depth > 3 {
		hi = lo
	}
	n := lo
	if hi > lo {
		n += g.r.IntN(hi - lo + 1)
	}
	out := make([]any, 0, n)
	var items *openapi3.Schema
	if s.Items != nil {
		items = s.Items.Value
	}
	for range n {
		out = append(out, g.try(items, depth+1))
	}
	return out
}

func (g *gen) object(s *openapi3.Schema, depth int) any {
	out := map[string]any{}
	names := sortedKeys(s.Properties)
	for _, name := range names {
		if !slices.Contains(s.Required, name) && g.r.IntN(2) == 0 {
			continue
		}
		out[name] = g.try(s.Properties[name].Value, depth+1)
	}
	if ap := s.AdditionalProperties.Schema; ap != nil && depth < 3 {
		var keys *openapi3.Schema
		if s.PropertyNames != nil {
			keys = s.PropertyNames.Value
		}
		for range g.r.IntN(3) {
			k := g.word()
			if keys != nil {
				k = g.str(keys)
			}
			if _, ok := s.Properties[k]; !ok {
				out[k] = g.try(ap.Value, depth+1)
			}
		}
	}
	return out
}

// invalid returns a value s refuses, made by breaking one of its rules,
// and says which; ok is false when s has no rule to break.
func (g *gen) invalid(s *openapi3.Schema) (any, string, bool) {
	for range 20 {
		v, why := g.break1(s)
		if why == "" {
			continue
		}
		if s.VisitJSON(v, visit...) != nil {
			return v, why, true
		}
	}
	return nil, "", false
}

func (g *gen) break1(s *openapi3.Schema) (any, string) {
	if s == nil {
		return nil, ""
	}
	isObject := s.Type != nil && s.Type.Is("object") || len(s.Properties) > 0
	if isObject {
		base, err := g.value(s)
		obj, ok := base.(map[string]any)
		if err != nil || !ok {
			return nil, ""
		}
		switch n := g.r.IntN(6); {
		case n == 0:
			return nil, "null instead of an object"
		case n == 1:
			return []any{obj}, "an array instead of an object"
		case n == 2 && len(s.Required) > 0:
			k := s.Required[g.r.IntN(len(s.Required))]
			delete(obj, k)
			return obj, "required " + k + " missing"
		case n == 3 && s.AdditionalProperties.Has != nil && !*s.AdditionalProperties.Has:
			obj["unknown_field_x"] = 1
			return obj, "an unknown field"
		default:
			names := sortedKeys(s.Properties)
			if len(names) == 0 {
				return nil, ""
			}
			k := names[g.r.IntN(len(names))]
			v, why := g.breakScalar(s.Properties[k].Value)
			if why == "" {
				return nil, ""
			}
			obj[k] = v
			return obj, k + ": " + why
		}
	}
	return g.breakScalar(s)
}

// breakScalar breaks one rule of a scalar (or array) schema.
func (g *gen) breakScalar(s *openapi3.Schema) (any, string) {
	var opts []func() (any, string)
	if s.Type != nil && !s.Type.Is("null") {
		opts = append(opts, func() (any, string) { return nil, "null" })
		switch {
		case s.Type.Is("string"):
			opts = append(opts, func() (any, string) { return float64(7), "a number instead of a string" })
		case s.Type.Is("integer"), s.Type.Is("number"):
			opts = append(opts, func() (any, string) { return "7", "a string instead of a number" })
		case s.Type.Is("boolean"):
			opts = append(opts, func() (any, string) { return "true", "a string instead of a boolean" })
		case s.Type.Is("array"):
			opts = append(opts, func() (any, string) { return "x", "a string instead of an array" })
		}
	}
	if s.Type != nil && s.Type.Is("integer") {
		opts = append(opts, func() (any, string) { return 1.5, "a fraction instead of a whole number" })
	}
	if s.Min != nil {
		opts = append(opts, func() (any, string) { return *s.Min - 1, "below the minimum" })
	}
	if s.Max != nil {
		opts = append(opts, func() (any, string) { return *s.Max + 1, "above the maximum" })
	}
	if v := s.ExclusiveMin.Value; v != nil {
		opts = append(opts, func() (any, string) { return *v, "at the exclusive minimum" })
	}
	if len(s.Enum) > 0 {
		opts = append(opts, func() (any, string) { return "not-one-of-the-values", "not in the enum" })
	}
	if s.MaxLength != nil {
		opts = append(opts, func() (any, string) { return strings.Repeat("a", int(*s.MaxLength)+1), "too long" })
	}
	if s.MinLength > 0 {
		opts = append(opts, func() (any, string) { return "", "too short" })
	}
	if s.Pattern != "" || s.Format != "" {
		for _, bad := range []string{"", " ", "../x", "/abs", "a\\b", "a\u2028b", "-x", "UPPER", "x y", "a/", "0"} {
			opts = append(opts, func() (any, string) { return bad, fmt.Sprintf("%q against its pattern or format", bad) })
		}
	}
	if s.MaxItems != nil && s.Items != nil {
		opts = append(opts, func() (any, string) {
			a := make([]any, int(*s.MaxItems)+1)
			for i := range a {
				a[i] = g.try(s.Items.Value, 1)
			}
			return a, "too many items"
		})
	}
	if len(opts) == 0 {
		return nil, ""
	}
	return opts[g.r.IntN(len(opts))]()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
