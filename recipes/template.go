package recipes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/template"
	tparse "text/template/parse"
	"unicode"
)

// maxExpansion bounds what one template may produce, so that ranging over
// a long list param cannot blow up a plan.
const maxExpansion = 1 << 20

var errTooLong = errors.New("template output is longer than 1 MiB")

// scope is what templates see: the bound params, the inputs' paths and,
// inside a foreach block, the current item.
type scope struct {
	params  map[string]any
	inputs  map[string]any
	item    any
	hasItem bool
}

func (sc *scope) funcs() template.FuncMap {
	return template.FuncMap{
		"params": func() map[string]any { return sc.params },
		"inputs": func() map[string]any { return sc.inputs },
		"item": func() (any, error) {
			if !sc.hasItem {
				return nil, errors.New("item is only defined in a search block with foreach")
			}
			return sc.item, nil
		},
		"slug":  func(v any) string { return slug(fmt.Sprint(v)) },
		"lower": func(v any) string { return strings.ToLower(fmt.Sprint(v)) },
		"upper": func(v any) string { return strings.ToUpper(fmt.Sprint(v)) },
		"trim":  func(v any) string { return strings.TrimSpace(fmt.Sprint(v)) },
		"join": func(sep string, v any) (string, error) {
			l, ok := v.([]any)
			if !ok {
				return "", fmt.Errorf("join wants a list, got %T", v)
			}
			parts := make([]string, len(l))
			for i, x := range l {
				parts[i] = fmt.Sprint(x)
			}
			return strings.Join(parts, sep), nil
		},
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
	}
}

// expand evaluates s as a template. A string that is exactly one action
// keeps the action's type (an int param stays an int); anything else is
// rendered as text.
func (sc *scope) expand(s string) (any, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	t, err := template.New("").Option("missingkey=error").Funcs(sc.funcs()).Parse(s)
	if err != nil {
		return nil, cleanTemplateErr(err)
	}
	if nodes := t.Tree.Root.Nodes; len(nodes) == 1 {
		if a, ok := nodes[0].(*tparse.ActionNode); ok && len(a.Pipe.Decl) == 0 {
			return sc.native(a.Pipe.String())
		}
	}
	return sc.render(t)
}

// native evaluates one pipeline to a typed value by rendering it as JSON.
func (sc *scope) native(pipe string) (any, error) {
	t, err := template.New("").Option("missingkey=error").Funcs(sc.funcs()).Parse("{{ json (" + pipe + ") }}")
	if err != nil {
		return nil, cleanTemplateErr(err)
	}
	out, err := sc.render(t)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(strings.NewReader(out.(string)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return fromJSON(v), nil
}

func (sc *scope) render(t *template.Template) (any, error) {
	var buf limitedBuffer
	if err := t.Execute(&buf, nil); err != nil {
		if errors.Is(err, errTooLong) {
			return nil, errTooLong
		}
		return nil, cleanTemplateErr(err)
	}
	return buf.String(), nil
}

// fromJSON turns json.Number into int64 or float64, the param value types.
func fromJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = fromJSON(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = fromJSON(x[k])
		}
	}
	return v
}

// cleanTemplateErr drops text/template's `template: :1:9: executing "" at`
// preamble, which names an anonymous template and means nothing to an
// author, and keeps the problem.
func cleanTemplateErr(err error) error {
	return errors.New("template: " + templateNoiseRE.ReplaceAllString(err.Error(), ""))
}

var templateNoiseRE = regexp.MustCompile(`^template: :\d+(:\d+)?: (executing "" at )?`)

// limitedBuffer is a bytes.Buffer that refuses to grow past maxExpansion.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > maxExpansion {
		return 0, errTooLong
	}
	return b.Buffer.Write(p)
}

// slug lowercases s and keeps letters and digits, joining runs of anything
// else with one hyphen, so that a param value is safe in a file name.
func slug(s string) string {
	var b strings.Builder
	hyphen := false
	for _, r := range strings.ToLower(s) {
		if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
			hyphen = false
		} else if !hyphen && b.Len() > 0 {
			b.WriteByte('-')
			hyphen = true
		}
	}
	out := strings.TrimSuffix(b.String(), "-")
	if len(out) > 64 {
		out = strings.TrimSuffix(out[:64], "-")
	}
	if out == "" {
		return "x"
	}
	return out
}
