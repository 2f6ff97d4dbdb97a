package recipes

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/wire"
)

// Limits on a bound param value, so that a plan stays small.
const (
	MaxStringParam = 64 << 10
	MaxListParam   = 1000
)

// ParametersID is the id of the parameters cell, the first step of every
// plan.
const ParametersID = "parameters"

// Plan is a recipe bound to a run's params: the exact steps to execute.
type Plan struct {
	Recipe *Recipe
	// Params holds every declared param's value, defaults filled in,
	// normalized as described at ParamType.
	Params map[string]any
	// Steps are in execution order. Steps[0] is the parameters cell.
	Steps []Step
}

// Step is one tool call of a plan, fully templated.
type Step struct {
	// N is the 1-based position in the plan.
	N int
	// ID is unique in the plan: the block's id, with "-1", "-2", ... for
	// the items of a foreach block, or ParametersID.
	ID string
	// Title is the nearest heading above the block, for progress display.
	Title string
	Kind  Kind
	// Line is the 1-based line of the block's opening fence (the front
	// matter's first line for the parameters cell).
	Line int
	// Rerun marks a step to execute on every start, resume included. Only
	// the parameters cell has it: it makes no files, so resume cannot skip
	// it by hash, and later cells need its variables in a fresh kernel.
	Rerun bool
	// Code is an exec step's cell source, in Language ("" for Python).
	Code     string `json:",omitempty"`
	Language string `json:",omitempty"`
	// Search is a search step's browser.search arguments, validated, and
	// SaveAs the run path its results are written to.
	Search *browser.Request `json:",omitempty"`
	SaveAs string           `json:",omitempty"`
	// Write is a write step's tmp.write arguments.
	Write *WriteArgs `json:",omitempty"`
	// Outputs are the files the step must leave, with any checks from the
	// front matter.
	Outputs []Output
	// Timeout is the python block's timeout; 0 means the runner's default.
	Timeout time.Duration
}

// WriteArgs are the arguments of one tmp.write call.
type WriteArgs struct {
	Path string `json:"path"`
	Text string `json:"text"`
}

// Definition returns the step's canonical bytes: everything that decides
// what the step does (kind, id, code or arguments, outputs and their
// checks, timeout) and nothing that does not (title, line, prose). Two
// steps with equal definitions do the same thing on the same files, so a
// runner keys resume on Definition plus the hashes of the run's files
// before the step.
func (s *Step) Definition() []byte {
	d := struct {
		Kind      Kind             `json:"kind"`
		ID        string           `json:"id"`
		Code      string           `json:"code,omitempty"`
		Search    *browser.Request `json:"search,omitempty"`
		SaveAs    string           `json:"save_as,omitempty"`
		Write     *WriteArgs       `json:"write,omitempty"`
		Outputs   []Output         `json:"outputs"`
		TimeoutMS int64            `json:"timeout_ms,omitempty"`
	}{s.Kind, s.ID, s.Code, s.Search, s.SaveAs, s.Write, s.Outputs, s.Timeout.Milliseconds()}
	b, err := json.Marshal(d)
	if err != nil {
		// Every field is a string, a number or a slice of them.
		panic("recipes: marshal step definition: " + err.Error())
	}
	return b
}

// Bind validates params against the recipe's declarations and returns the
// plan. A param the recipe does not declare, a value of the wrong type and
// a missing required param are fault.BadInput errors that name the param.
// Values may be Go values or what encoding/json decodes (float64 for every
// number); use ParamFromText for command-line text.
func (r *Recipe) Bind(params map[string]any) (*Plan, error) {
	p, err := r.bind(params)
	if err != nil {
		var le *lineError
		if errors.As(err, &le) {
			return nil, fault.New(fault.BadInput, fmt.Sprintf("%s:%d: %s", r.File, le.line, le.msg),
				"check the params' values; the recipe's templates could not use them")
		}
		return nil, err
	}
	return p, nil
}

func (r *Recipe) bind(params map[string]any) (*Plan, error) {
	unknown := []string{}
	for k := range params {
		if _, ok := r.Param(k); !ok {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fault.Badf(r.paramHelp(), "recipe %s has no param %q", r.Name, unknown[0])
	}
	values := make(map[string]any, len(r.Params))
	for _, p := range r.Params {
		v, given := params[p.Name]
		switch {
		case given:
			nv, err := normalize(p.Type, v)
			if err == nil {
				err = p.check(nv)
			}
			if err != nil {
				return nil, fault.Badf(r.paramHelp(), "param %s: %v", p.Name, err)
			}
			values[p.Name] = nv
		case p.Required:
			return nil, fault.Badf(r.paramHelp(), "param %s is required by recipe %s", p.Name, r.Name)
		case p.Default != nil:
			values[p.Name] = p.Default
		default:
			values[p.Name] = zero(p.Type)
		}
	}

	inputs := map[string]any{}
	for _, in := range r.Inputs {
		inputs[in.Name] = in.Path
	}
	plan := &Plan{Recipe: r, Params: values}
	plan.Steps = append(plan.Steps, Step{ID: ParametersID, Title: "Parameters", Kind: KindExec, Line: 1,
		Rerun: true, Code: parametersCell(r.Params, values, false), Outputs: []Output{}})
	for _, b := range r.Blocks {
		items := []any{nil}
		if b.Foreach != "" {
			items = values[b.Foreach].([]any)
		}
		for i, item := range items {
			sc := &scope{params: values, inputs: inputs, item: item, hasItem: b.Foreach != ""}
			s, err := r.step(b, sc)
			if err != nil {
				return nil, err
			}
			if b.Foreach != "" {
				s.ID = fmt.Sprintf("%s-%d", b.ID, i+1)
			}
			plan.Steps = append(plan.Steps, s)
		}
	}
	ids := map[string]int{}
	saved := map[string]int{}
	for i := range plan.Steps {
		s := &plan.Steps[i]
		s.N = i + 1
		if prev, dup := ids[s.ID]; dup {
			return nil, errAt(s.Line, "step id %s is also the id of the step from line %d", s.ID, prev)
		}
		ids[s.ID] = s.Line
		if s.SaveAs != "" {
			if prev, dup := saved[s.SaveAs]; dup {
				return nil, fault.Badf("make the foreach list's items differ in more than case and punctuation",
					"%s:%d: two searches save to %s (the other is step %d); their items give the same file name", r.File, s.Line, s.SaveAs, prev)
			}
			saved[s.SaveAs] = s.N
		}
	}
	return plan, nil
}

func (r *Recipe) step(b Block, sc *scope) (Step, error) {
	s := Step{ID: b.ID, Title: b.Title, Kind: b.Kind, Line: b.Line,
		Timeout: time.Duration(b.TimeoutSeconds) * time.Second}
	what := string(b.Kind) + " block"
	str := func(field, v string) (string, error) {
		x, err := sc.expand(v)
		if err != nil {
			return "", errAt(b.Line, "%s: %s: %v", what, field, err)
		}
		if _, ok := x.(string); !ok {
			x = fmt.Sprint(x)
		}
		return x.(string), nil
	}
	path := func(field, v string) (string, error) {
		x, err := str(field, v)
		if err != nil {
			return "", err
		}
		p, err := safepath.Clean(x)
		if err != nil {
			return "", errAt(b.Line, "%s: %s: %s", what, field, fault.As(err).Message)
		}
		return p, nil
	}
	switch b.Kind {
	case KindExec:
		what = "python block"
		s.Code, s.Language = b.Body, b.Language
	case KindWrite:
		p, err := path("path", b.path)
		if err != nil {
			return s, err
		}
		text := b.Body
		if !b.Raw {
			if text, err = str("text", text); err != nil {
				return s, err
			}
		}
		s.Write = &WriteArgs{Path: p, Text: text}
	case KindSearch:
		args, err := searchArgs(b.search, sc)
		if err != nil {
			return s, errAt(b.Line, "%s: %v", what, err)
		}
		if s.SaveAs, err = path("save_as", b.search.SaveAs); err != nil {
			return s, err
		}
		s.Search = args
	}
	for _, o := range b.Outputs {
		p, err := path("outputs", o)
		if err != nil {
			return s, err
		}
		out, ok := r.Output(p)
		if !ok {
			out = Output{ExpectedFile: wire.ExpectedFile{Path: p}}
		}
		s.Outputs = append(s.Outputs, out)
	}
	if s.Outputs == nil {
		s.Outputs = []Output{}
	}
	return s, nil
}

// searchArgs templates a search block's values and checks their types.
func searchArgs(src *searchSource, sc *scope) (*browser.Request, error) {
	expand := func(field string, v any) (any, error) {
		x, err := expandValue(v, sc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		return x, nil
	}
	a := &browser.Request{}
	q, err := expand("query", src.Query)
	if err != nil {
		return nil, err
	}
	if a.Query, _ = q.(string); strings.TrimSpace(a.Query) == "" {
		return nil, fmt.Errorf("query must be a non-empty string, got %s", describe(q))
	}
	if src.TopK != nil {
		v, err := expand("top_k", src.TopK)
		if err != nil {
			return nil, err
		}
		n, err := normalize(TypeInt, v)
		if err != nil {
			return nil, fmt.Errorf("top_k must be an integer, got %s", describe(v))
		}
		// Present means validated, as on every surface: 0 is out of
		// range, never "the default".
		if k := n.(int64); k < 1 || k > browser.MaxTopK {
			return nil, fmt.Errorf("top_k is %d; it must be between 1 and %d (leave it out for %d)", k, browser.MaxTopK, browser.DefaultTopK)
		}
		a.TopK = int(n.(int64))
	}
	if src.IncludePage != nil {
		v, err := expand("include_page", src.IncludePage)
		if err != nil {
			return nil, err
		}
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("include_page must be true or false, got %s", describe(v))
		}
		a.IncludePage = b
	}
	if src.AllowDomains != nil {
		v, err := expand("allow_domains", src.AllowDomains)
		if err != nil {
			return nil, err
		}
		if s, ok := v.(string); ok {
			v = []any{s}
		}
		l, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("allow_domains must be a list of domains, got %s", describe(v))
		}
		for _, d := range l {
			s, ok := d.(string)
			if !ok || s == "" {
				return nil, fmt.Errorf("allow_domains must be a list of domains, got an item %s", describe(d))
			}
			a.AllowDomains = append(a.AllowDomains, s)
		}
	}
	if src.DateRange != nil {
		v, err := expand("date_range", src.DateRange)
		if err != nil {
			return nil, err
		}
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("date_range must be a string, got %s", describe(v))
		}
		a.DateRange = s
	}
	if err := a.Validate(); err != nil {
		return nil, errors.New(fault.As(err).Message)
	}
	return a, nil
}

// expandValue templates every string in a decoded YAML value.
func expandValue(v any, sc *scope) (any, error) {
	switch x := v.(type) {
	case string:
		return sc.expand(x)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			e, err := expandValue(x[i], sc)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	}
	return v, nil
}

// paramHelp lists the recipe's params, the suggestion of every bind error.
func (r *Recipe) paramHelp() string {
	parts := make([]string, len(r.Params))
	for i, p := range r.Params {
		parts[i] = fmt.Sprintf("%s (%s)", p.Name, p.Type)
	}
	return fmt.Sprintf("recipe %s takes: %s; GET /recipes/%s describes them", r.Name, strings.Join(parts, ", "), r.Name)
}

// ParamFromText converts command-line text (--param name=text) to a value
// of the named param's type: a list is a JSON array or comma-separated
// items.
func (r *Recipe) ParamFromText(name, text string) (any, error) {
	p, ok := r.Param(name)
	if !ok {
		return nil, fault.Badf(r.paramHelp(), "recipe %s has no param %q", r.Name, name)
	}
	var v any = text
	var err error
	switch p.Type {
	case TypeInt:
		v, err = strconv.ParseInt(strings.TrimSpace(text), 10, 64)
	case TypeFloat:
		v, err = strconv.ParseFloat(strings.TrimSpace(text), 64)
	case TypeBool:
		v, err = strconv.ParseBool(strings.TrimSpace(text))
	case TypeList:
		if t := strings.TrimSpace(text); strings.HasPrefix(t, "[") {
			var l []any
			d := json.NewDecoder(strings.NewReader(t))
			d.UseNumber()
			if err = d.Decode(&l); err == nil {
				v = fromJSON(l)
			}
		} else {
			l := []any{}
			for _, s := range strings.Split(text, ",") {
				if s = strings.TrimSpace(s); s != "" {
					l = append(l, s)
				}
			}
			v = l
		}
	}
	if err != nil {
		return nil, fault.Badf(r.paramHelp(), "param %s: %q is not a %s", name, text, p.Type)
	}
	if v, err = normalize(p.Type, v); err != nil {
		return nil, fault.Badf(r.paramHelp(), "param %s: %v", name, err)
	}
	return v, nil
}

// normalize checks that v is a value of type t and returns it in the
// canonical Go type: string, int64, float64, bool or []any.
func normalize(t ParamType, v any) (any, error) {
	if t == TypeList {
		var items []any
		switch x := v.(type) {
		case []any:
			items = x
		case []string:
			for _, s := range x {
				items = append(items, s)
			}
		default:
			return nil, fmt.Errorf("want a list, got %s", describe(v))
		}
		if len(items) > MaxListParam {
			return nil, fmt.Errorf("list has %d items; the limit is %d", len(items), MaxListParam)
		}
		out := make([]any, len(items))
		for i, it := range items {
			n, err := scalar(it)
			if err != nil {
				return nil, fmt.Errorf("item %d: %v", i+1, err)
			}
			out[i] = n
		}
		return out, nil
	}
	if n, ok := v.(json.Number); ok {
		v = fromJSON(n)
	}
	switch t {
	case TypeString:
		if s, ok := v.(string); ok {
			return checkString(s)
		}
	case TypeBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case TypeInt:
		switch x := v.(type) {
		case int:
			return int64(x), nil
		case int64:
			return x, nil
		case int32:
			return int64(x), nil
		case uint64:
			if x <= math.MaxInt64 {
				return int64(x), nil
			}
		case float64:
			// encoding/json decodes every number as float64.
			if x == math.Trunc(x) && math.Abs(x) <= 1<<53 {
				return int64(x), nil
			}
		}
	case TypeFloat:
		var f float64
		switch x := v.(type) {
		case float64:
			f = x
		case float32:
			f = float64(x)
		case int:
			f = float64(x)
		case int64:
			f = float64(x)
		case uint64:
			f = float64(x)
		default:
			return nil, fmt.Errorf("want %s, got %s", t, describe(v))
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("want a finite number, got %v", f)
		}
		return f, nil
	}
	return nil, fmt.Errorf("want %s, got %s", t, describe(v))
}

// scalar normalizes a list item. Integral numbers become int64, because
// JSON cannot tell 2 from 2.0.
func scalar(v any) (any, error) {
	if n, ok := v.(json.Number); ok {
		v = fromJSON(n)
	}
	switch x := v.(type) {
	case string:
		return checkString(x)
	case bool:
		return x, nil
	case int, int64, int32, uint64:
		return normalize(TypeInt, x)
	case float64:
		if x == math.Trunc(x) && math.Abs(x) <= 1<<53 {
			return int64(x), nil
		}
		return normalize(TypeFloat, x)
	}
	return nil, fmt.Errorf("want a string, number or boolean, got %s", describe(v))
}

func checkString(s string) (any, error) {
	if !utf8.ValidString(s) {
		return nil, errors.New("string is not valid UTF-8")
	}
	if len(s) > MaxStringParam {
		return nil, fmt.Errorf("string is %d bytes; the limit is %d", len(s), MaxStringParam)
	}
	return s, nil
}

func zero(t ParamType) any {
	switch t {
	case TypeInt:
		return int64(0)
	case TypeFloat:
		return 0.0
	case TypeBool:
		return false
	case TypeList:
		return []any{}
	}
	return ""
}

// describe names v's type and shows a bounded part of it for messages.
func describe(v any) string {
	var kind string
	switch v.(type) {
	case nil:
		return "nothing"
	case string:
		kind = "string"
	case bool:
		kind = "bool"
	case int, int32, int64, uint64:
		kind = "int"
	case float32, float64:
		kind = "float"
	case []any, []string:
		kind = "list"
	case map[string]any:
		kind = "mapping"
	default:
		kind = fmt.Sprintf("%T", v)
	}
	b, err := json.Marshal(v)
	s := string(b)
	if err != nil {
		s = fmt.Sprint(v)
	}
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return kind + " " + s
}

// parametersCell is the Python cell that assigns each param, as Papermill's
// injected parameters cell does. Literals come from pyLiteral, never from
// pasting text, so no value can break out of its literal. In a Triad run
// (literal false) seed and as_of are read from the kernel, where Triad's
// setup put the run's values, so that the cell's source is the same
// whatever they are and a replay with another seed runs the same cell.
func parametersCell(params []Param, values map[string]any, literal bool) string {
	var b strings.Builder
	b.WriteString("# Parameters, injected by Triad (as Papermill does) from the run's params\n")
	b.WriteString("# and the recipe's defaults. Later cells read these variables.\n")
	for _, p := range params {
		switch {
		case !literal && p.Name == ParamSeed:
			fmt.Fprintf(&b, "%s = TRIAD_SEED  # the run's seed, set by Triad when the kernel started\n", p.Name)
		case !literal && p.Name == ParamAsOf:
			fmt.Fprintf(&b, "%s = TRIAD_AS_OF  # the run's as-of date, YYYY-MM-DD, or \"\" for none\n", p.Name)
		default:
			fmt.Fprintf(&b, "%s = %s\n", p.Name, pyLiteral(values[p.Name]))
		}
	}
	return b.String()
}

// pyLiteral renders a normalized param value as a Python literal. Strings
// go through JSON: every JSON string escape (\" \\ \n \uXXXX ...) means the
// same in a Python string literal, and encoding/json never emits "\/".
func pyLiteral(v any) string {
	switch x := v.(type) {
	case string:
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(x) // a valid UTF-8 string always encodes
		return strings.TrimSuffix(b.String(), "\n")
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return s
	case []any:
		parts := make([]string, len(x))
		for i := range x {
			parts[i] = pyLiteral(x[i])
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return "None"
}

// check applies the param's declared bounds to v, a normalized value.
func (p Param) check(v any) error {
	switch x := v.(type) {
	case int64:
		return p.checkNumber(float64(x))
	case float64:
		return p.checkNumber(x)
	case string:
		if p.MaxLength > 0 && utf8.RuneCountInString(x) > p.MaxLength {
			return fmt.Errorf("%d characters; the limit is %d", utf8.RuneCountInString(x), p.MaxLength)
		}
	case []any:
		for i, it := range x {
			if s, ok := it.(string); ok && p.MaxLength > 0 && utf8.RuneCountInString(s) > p.MaxLength {
				return fmt.Errorf("item %d is %d characters; the limit is %d", i+1, utf8.RuneCountInString(s), p.MaxLength)
			}
		}
	}
	return nil
}

func (p Param) checkNumber(f float64) error {
	switch {
	case p.Min != nil && f < *p.Min, p.Max != nil && f > *p.Max:
		return fmt.Errorf("%v is out of range %v..%v", f, bound(p.Min), bound(p.Max))
	}
	return nil
}

func bound(b *float64) string {
	if b == nil {
		return ""
	}
	return strconv.FormatFloat(*b, 'f', -1, 64)
}

func ptr[T any](v T) *T { return &v }
