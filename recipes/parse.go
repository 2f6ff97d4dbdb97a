package recipes

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/recipes/sampledata"
	"github.com/triadhq/triad/wire"
)

// MaxSize is the largest recipe file Parse accepts.
const MaxSize = 1 << 20

const fixSuggestion = "fix the recipe file; the format is described in docs/recipes.md"

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	idRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// An unquoted {{ at the start of a YAML value: YAML reads it as a flow
	// mapping, never as the template the author meant.
	unquotedTmplRE = regexp.MustCompile(`^\s*(-\s+|[A-Za-z0-9_]+:\s+)\{\{`)
)

// pythonKeywords cannot name a param: the parameters cell assigns each
// param to a Python variable of the same name.
var pythonKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true,
	"async": true, "await": true, "break": true, "class": true, "continue": true,
	"def": true, "del": true, "elif": true, "else": true, "except": true, "finally": true,
	"for": true, "from": true, "global": true, "if": true, "import": true, "in": true,
	"is": true, "lambda": true, "nonlocal": true, "not": true, "or": true, "pass": true,
	"raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}

// lineError is a problem at a line of the file, before the file name is
// known to the code that found it.
type lineError struct {
	line int
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("%d: %s", e.line, e.msg) }

func errAt(line int, format string, args ...any) *lineError {
	return &lineError{line: line, msg: fmt.Sprintf(format, args...)}
}

// Parse parses and validates one recipe. file names it in error messages
// (use the file's base name, such as "market-scan.md"). Every problem is
// reported as a fault.BadInput whose message starts with "file:line: ".
//
// Parse also binds the recipe once with its defaults, so a template that
// cannot be evaluated is reported here, with its line, rather than at the
// first run.
func Parse(file string, data []byte) (*Recipe, error) {
	r, err := parse(file, data)
	if err != nil {
		var le *lineError
		if errors.As(err, &le) {
			return nil, fault.New(fault.BadInput, fmt.Sprintf("%s:%d: %s", file, le.line, le.msg), fixSuggestion)
		}
		return nil, err
	}
	return r, nil
}

func parse(file string, data []byte) (*Recipe, error) {
	if len(data) > MaxSize {
		return nil, errAt(1, "recipe is %d bytes; the limit is %d", len(data), MaxSize)
	}
	if !utf8.Valid(data) {
		return nil, errAt(1, "recipe is not valid UTF-8")
	}
	lines := splitLines(data)
	if len(lines) == 0 || strings.TrimSpace(lines[0]) != "---" {
		return nil, errAt(1, `recipe must start with YAML front matter: a line "---", the YAML, and a closing "---"`)
	}
	end := -1
	for i := 1; i < len(lines); i++ {
		if t := strings.TrimRight(lines[i], " \t"); t == "---" || t == "..." {
			end = i
			break
		}
	}
	if end < 0 {
		return nil, errAt(1, `front matter is not closed: add a line "---" after the YAML`)
	}
	r := &Recipe{File: file, Source: data}
	// Line i of the YAML (1-based) is line i+1 of the file.
	if err := r.parseFrontMatter(strings.Join(lines[1:end], "\n"), 1); err != nil {
		return nil, err
	}
	if err := r.parseBody(lines, end+1); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return r, nil
}

// templateName is what a sandbox template's name may be
// (sandbox/image.Variant's rule).
var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// frontMatter is the YAML header as written.
type frontMatter struct {
	Name        string                `yaml:"name"`
	Title       string                `yaml:"title"`
	Description string                `yaml:"description"`
	Backend     string                `yaml:"backend"`
	Template    string                `yaml:"template"`
	Params      orderedMap[paramSpec] `yaml:"params"`
	Inputs      orderedMap[inputSpec] `yaml:"inputs"`
	Outputs     []outputSpec          `yaml:"outputs"`
}

type paramSpec struct {
	Type        string   `yaml:"type"`
	Default     any      `yaml:"default"`
	Required    bool     `yaml:"required"`
	Description string   `yaml:"description"`
	Min         *float64 `yaml:"min"`
	Max         *float64 `yaml:"max"`
	MaxLength   int      `yaml:"max_length"`
}

type inputSpec struct {
	Path        string `yaml:"path"`
	Default     string `yaml:"default"`
	Required    bool   `yaml:"required"`
	Description string `yaml:"description"`
}

type outputChecks struct {
	Path     string   `yaml:"path"`
	Columns  []string `yaml:"columns"`
	MinRows  int      `yaml:"min_rows"`
	Keys     []string `yaml:"keys"`
	Contains []string `yaml:"contains"`
}

// outputSpec is an output written either as a bare path or as a mapping
// with checks.
type outputSpec struct {
	outputChecks
	line int
}

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (o *outputSpec) UnmarshalYAML(node ast.Node) error {
	o.line = node.GetToken().Position.Line
	if s, ok := node.(*ast.StringNode); ok {
		o.Path = s.Value
		return nil
	}
	if _, ok := node.(ast.MapNode); !ok {
		return errAt(o.line, "an output is a path or a mapping with path and checks, not %s", describeNode(node))
	}
	return yaml.NodeToValue(node, &o.outputChecks, yaml.DisallowUnknownField())
}

// entry is one key of an orderedMap.
type entry[T any] struct {
	name  string
	line  int
	value T
}

// orderedMap decodes a YAML mapping keeping its order and each key's line.
type orderedMap[T any] []entry[T]

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (m *orderedMap[T]) UnmarshalYAML(node ast.Node) error {
	if _, ok := node.(*ast.NullNode); ok {
		return nil
	}
	mn, ok := node.(ast.MapNode)
	if !ok {
		return errAt(node.GetToken().Position.Line, "want a mapping of names to specs, not %s", describeNode(node))
	}
	it := mn.MapRange()
	for it.Next() {
		var v T
		line := it.Key().GetToken().Position.Line
		if _, isMap := it.Value().(ast.MapNode); !isMap {
			return errAt(line, "%s: want a mapping such as {type: string, default: ...}, not %s", it.Key().GetToken().Value, describeNode(it.Value()))
		}
		if err := yaml.NodeToValue(it.Value(), &v, yaml.DisallowUnknownField()); err != nil {
			return err
		}
		*m = append(*m, entry[T]{name: it.Key().GetToken().Value, line: line, value: v})
	}
	return nil
}

func describeNode(n ast.Node) string {
	switch n.Type() {
	case ast.StringType:
		return "a string"
	case ast.IntegerType, ast.FloatType:
		return "a number"
	case ast.BoolType:
		return "a boolean"
	case ast.SequenceType:
		return "a list"
	case ast.MappingType, ast.MappingValueType:
		return "a mapping"
	case ast.NullType:
		return "nothing"
	}
	return strings.ToLower(n.Type().String())
}

// decodeYAML decodes src into v, refusing unknown fields, and reports the
// first problem at its line in the file (src starts at file line base+1).
func decodeYAML(src string, v any, base int, what string) error {
	for i, l := range strings.Split(src, "\n") {
		if unquotedTmplRE.MatchString(l) {
			return errAt(base+i+1, `%s: quote a value that starts with a template, as in query: "{{ params.objective }}"`, what)
		}
	}
	err := yaml.UnmarshalWithOptions([]byte(src), v, yaml.DisallowUnknownField())
	if err == nil {
		return nil
	}
	var le *lineError
	if errors.As(err, &le) {
		return errAt(base+le.line, "%s: %s", what, le.msg)
	}
	var ye yaml.Error
	if errors.As(err, &ye) {
		line := base + 1
		if tk := ye.GetToken(); tk != nil {
			line = base + tk.Position.Line
		}
		msg := ye.GetMessage()
		var se *yaml.SyntaxError
		if errors.As(err, &se) && strings.Contains(src, "{{") {
			// YAML reads {{ as the start of a flow mapping.
			msg += ` (quote values that hold a template, as in path: "notes/{{ params.name }}.md")`
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			msg = fmt.Sprintf("%q has the wrong type: want %s", ye.GetToken().Value, kindName(te.DstType.Kind().String()))
		}
		return errAt(line, "%s: %s", what, msg)
	}
	return errAt(base+1, "%s: %v", what, err)
}

func kindName(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer"
	case strings.HasPrefix(k, "float"):
		return "a number"
	case k == "bool":
		return "true or false"
	case k == "slice":
		return "a list"
	case k == "struct", k == "map":
		return "a mapping"
	}
	return "a " + k
}

func (r *Recipe) parseFrontMatter(src string, base int) error {
	var fm frontMatter
	if err := decodeYAML(src, &fm, base, "front matter"); err != nil {
		return err
	}
	line := base + 1
	if fm.Name == "" {
		return errAt(line, "front matter: name is missing")
	}
	if !nameRE.MatchString(fm.Name) || len(fm.Name) > 64 {
		return errAt(line, "front matter: name %q must be 1-64 characters of [a-z0-9] separated by single hyphens", fm.Name)
	}
	if fm.Title == "" {
		return errAt(line, "front matter: title is missing")
	}
	if fm.Description == "" {
		return errAt(line, "front matter: description is missing")
	}
	r.Name, r.Title, r.Description = fm.Name, fm.Title, strings.TrimSpace(fm.Description)
	switch fm.Backend {
	case "", string(BackendAny):
		r.Backend = BackendAny
	case string(BackendDocker):
		r.Backend = BackendDocker
	default:
		return errAt(line, "front matter: backend %q is neither %q nor %q", fm.Backend, BackendAny, BackendDocker)
	}
	if fm.Template != "" && !templateName.MatchString(fm.Template) {
		return errAt(line, "front matter: template %q is not a template name (lower-case letters, digits and hyphens)", fm.Template)
	}
	r.Template = fm.Template

	seen := map[string]bool{}
	for _, e := range fm.Params {
		e.line += base
		p, err := makeParam(e)
		if err != nil {
			return err
		}
		if seen[p.Name] {
			return errAt(e.line, "param %q is declared twice", p.Name)
		}
		seen[p.Name] = true
		r.Params = append(r.Params, p)
	}
	if !seen["objective"] {
		r.Params = append([]Param{{Name: "objective", Type: TypeString, Default: "",
			Description: "What the run is for, in a sentence.", Line: base}}, r.Params...)
	} else if p, _ := r.Param("objective"); p.Type != TypeString {
		return errAt(p.Line, "param objective must have type string")
	}
	// Every run has a seed and an as-of date; see Recipe.Derive.
	for _, rp := range []Param{
		{Name: ParamSeed, Type: TypeInt, Min: ptr(0.0), Max: ptr(float64(maxSeed)), Description: "Seed of the run's kernel (random, NumPy's global generator, TRIAD_SEED); by default derived from the recipe, its params and its inputs."},
		{Name: ParamAsOf, Type: TypeString, Description: "The run's as-of date, YYYY-MM-DD (TRIAD_AS_OF; SOURCE_DATE_EPOCH for document writers); by default the latest date in the inputs."},
	} {
		if !seen[rp.Name] {
			rp.Line = base
			r.Params = append(r.Params, rp)
		} else if p, _ := r.Param(rp.Name); p.Type != rp.Type {
			return errAt(p.Line, "param %s must have type %s", rp.Name, rp.Type)
		} else if err := checkRunParam(p.Name, p.Default); err != nil {
			return errAt(p.Line, "param %s: default: %v", p.Name, err)
		}
	}

	seen = map[string]bool{}
	paths := map[string]string{}
	for _, e := range fm.Inputs {
		e.line += base
		in := Input{Name: e.name, Path: e.value.Path, Default: e.value.Default,
			Required: e.value.Required, Description: e.value.Description, Line: e.line}
		if !identRE.MatchString(in.Name) {
			return errAt(e.line, "input name %q must be a letter or _ followed by letters, digits or _", in.Name)
		}
		if seen[in.Name] {
			return errAt(e.line, "input %q is declared twice", in.Name)
		}
		seen[in.Name] = true
		if in.Path == "" {
			return errAt(e.line, "input %s: path is missing", in.Name)
		}
		p, err := safepath.Clean(in.Path)
		if err != nil {
			return errAt(e.line, "input %s: %s", in.Name, fault.As(err).Message)
		}
		if other, dup := paths[p]; dup {
			return errAt(e.line, "input %s: path %s is also the path of input %s", in.Name, p, other)
		}
		paths[p], in.Path = in.Name, p
		if in.Required && in.Default != "" {
			return errAt(e.line, "input %s: a required input has no default; drop one of them", in.Name)
		}
		if in.Default != "" && !sampledata.Has(in.Default) {
			return errAt(e.line, "input %s: default %q is not a bundled sample data file (have %s)",
				in.Name, in.Default, strings.Join(sampledata.Names(), ", "))
		}
		r.Inputs = append(r.Inputs, in)
	}

	outs := map[string]bool{}
	for _, o := range fm.Outputs {
		out := Output{ExpectedFile: wire.ExpectedFile{Path: o.Path, Columns: o.Columns, MinRows: o.MinRows, Keys: o.Keys,
			Contains: o.Contains}, Line: base + o.line}
		if out.Path == "" {
			return errAt(out.Line, "output: path is missing")
		}
		p, err := safepath.Clean(out.Path)
		if err != nil {
			return errAt(out.Line, "output: %s", fault.As(err).Message)
		}
		if outs[p] {
			return errAt(out.Line, "output %s is declared twice", p)
		}
		if out.MinRows < 0 {
			return errAt(out.Line, "output %s: min_rows is negative", p)
		}
		outs[p], out.Path = true, p
		r.Outputs = append(r.Outputs, out)
	}
	return nil
}

func makeParam(e entry[paramSpec]) (Param, error) {
	s := e.value
	p := Param{Name: e.name, Type: ParamType(s.Type), Required: s.Required, Description: s.Description,
		Min: s.Min, Max: s.Max, MaxLength: s.MaxLength, Line: e.line}
	if !identRE.MatchString(p.Name) || pythonKeywords[p.Name] {
		return p, errAt(e.line, "param name %q must be a Python identifier that is not a keyword", p.Name)
	}
	switch p.Type {
	case TypeString, TypeInt, TypeFloat, TypeBool, TypeList:
	case "":
		return p, errAt(e.line, "param %s: type is missing (string, int, float, bool or list)", p.Name)
	default:
		return p, errAt(e.line, "param %s: type %q is not one of string, int, float, bool, list", p.Name, s.Type)
	}
	if (p.Min != nil || p.Max != nil) && p.Type != TypeInt && p.Type != TypeFloat {
		return p, errAt(e.line, "param %s: min and max are for int and float params", p.Name)
	}
	if p.Min != nil && p.Max != nil && *p.Min > *p.Max {
		return p, errAt(e.line, "param %s: min is above max", p.Name)
	}
	if p.MaxLength != 0 && p.Type != TypeString && p.Type != TypeList || p.MaxLength < 0 {
		return p, errAt(e.line, "param %s: max_length is a positive length, for string and list params", p.Name)
	}
	if s.Default != nil {
		if p.Required {
			return p, errAt(e.line, "param %s: a required param has no default; drop one of them", p.Name)
		}
		v, err := normalize(p.Type, s.Default)
		if err == nil {
			err = p.check(v)
		}
		if err != nil {
			return p, errAt(e.line, "param %s: default: %v", p.Name, err)
		}
		p.Default = v
	}
	return p, nil
}

// execLanguages are the fences besides python whose blocks are
// sandbox.exec cells in another language (wire.ExecRequest.Language); a
// bash block runs in the run's bash kernel, so its shell state carries to
// the next bash block. Other fences (sh, json, ...) stay prose.
var execLanguages = map[string]string{
	"r": wire.LanguageR, "javascript": wire.LanguageJavaScript, "js": wire.LanguageJavaScript,
	"typescript": wire.LanguageTypeScript, "ts": wire.LanguageTypeScript, "bash": wire.LanguageBash,
}

// blockAttrs is the flow mapping after a fence's language.
type blockAttrs struct {
	ID      string   `yaml:"id"`
	Outputs []string `yaml:"outputs"`
	Timeout int      `yaml:"timeout"`
	Path    string   `yaml:"path"`
	Raw     bool     `yaml:"raw"`
}

// searchSource is a search block as written. Values are templates, so
// their types are checked after binding.
type searchSource struct {
	Query        any    `yaml:"query"`
	TopK         any    `yaml:"top_k"`
	IncludePage  any    `yaml:"include_page"`
	AllowDomains any    `yaml:"allow_domains"`
	DateRange    any    `yaml:"date_range"`
	SaveAs       string `yaml:"save_as"`
	Foreach      string `yaml:"foreach"`
}

var fenceRE = regexp.MustCompile("^( {0,3})(`{3,}|~{3,})(.*)$")

// parseBody scans the Markdown after the front matter for step blocks.
// first is the 0-based index of the first body line.
func (r *Recipe) parseBody(lines []string, first int) error {
	var prose []string
	title := ""
	for i := first; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			if h, ok := heading(lines[i]); ok {
				title = h
			}
			prose = append(prose, lines[i])
			continue
		}
		indent, fence, info := len(m[1]), m[2], strings.TrimSpace(m[3])
		if fence[0] == '`' && strings.Contains(info, "`") {
			prose = append(prose, lines[i])
			continue
		}
		open := i
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			t := strings.TrimRight(lines[i], " \t")
			if ts := strings.TrimLeft(t, " "); len(t)-len(ts) <= 3 && len(ts) >= len(fence) &&
				strings.Trim(ts, fence[:1]) == "" {
				closed = true
				break
			}
			body = append(body, stripIndent(lines[i], indent))
		}
		if !closed {
			return errAt(open+1, "code block is not closed: add a line %s", fence)
		}
		lang, attrs, _ := strings.Cut(info, " ")
		kind, isStep := map[string]Kind{"python": KindExec, "search": KindSearch, "write": KindWrite}[lang]
		cellLang, isCell := execLanguages[lang]
		if isCell {
			kind, isStep = KindExec, true
		}
		if !isStep {
			prose = append(prose, lines[open:i+1]...)
			continue
		}
		b := Block{Kind: kind, Title: title, Doc: strings.Trim(strings.Join(prose, "\n"), "\n"),
			Line: open + 1, Body: strings.Join(body, "\n"), Language: cellLang}
		if len(body) > 0 {
			b.Body += "\n"
		}
		prose = prose[:0]
		if err := r.addBlock(b, strings.TrimSpace(attrs), open+1); err != nil {
			return err
		}
	}
	r.Epilogue = strings.Trim(strings.Join(prose, "\n"), "\n")
	if len(r.Blocks) == 0 {
		return errAt(len(lines), "recipe has no steps: add a ```python, ```search or ```write block")
	}
	return nil
}

func (r *Recipe) addBlock(b Block, attrs string, line int) error {
	what := string(b.Kind) + " block"
	if b.Kind == KindExec {
		what = "python block"
		if b.Language != "" {
			what = b.Language + " block"
		}
	}
	var a blockAttrs
	if attrs != "" {
		if !strings.HasPrefix(attrs, "{") {
			return errAt(line, "%s: write attributes as a flow mapping after the language, as in ```python {outputs: [facts.json]}", what)
		}
		// The attributes sit on the fence line, so every YAML line is it.
		if err := decodeYAML(attrs, &a, line-1, what+" attributes"); err != nil {
			return err
		}
	}
	b.ID = a.ID
	if b.ID == "" {
		b.ID = fmt.Sprintf("step-%d", len(r.Blocks)+1)
	} else if !idRE.MatchString(b.ID) || b.ID == "parameters" {
		return errAt(line, "%s: id %q must be 1-63 characters of [a-z0-9_-], starting with a letter or digit, and not \"parameters\"", what, b.ID)
	}
	for _, o := range r.Blocks {
		if o.ID == b.ID {
			return errAt(line, "%s: id %q is also the id of the block at line %d", what, b.ID, o.Line)
		}
	}
	if strings.TrimSpace(b.Body) == "" {
		return errAt(line, "%s is empty", what)
	}
	switch b.Kind {
	case KindExec:
		if a.Path != "" || a.Raw {
			return errAt(line, "%s: path and raw are attributes of write blocks; a python block declares outputs", what)
		}
		if a.Timeout < 0 {
			return errAt(line, "%s: timeout is negative", what)
		}
		b.Outputs, b.TimeoutSeconds = a.Outputs, a.Timeout
	case KindWrite:
		if len(a.Outputs) > 0 || a.Timeout != 0 {
			return errAt(line, "%s: outputs and timeout are attributes of python blocks; a write block has path", what)
		}
		if a.Path == "" {
			return errAt(line, "%s: path is missing: write ```write {path: notes/brief.md}", what)
		}
		b.path, b.Raw, b.Outputs = a.Path, a.Raw, []string{a.Path}
	case KindSearch:
		if len(a.Outputs) > 0 || a.Timeout != 0 || a.Path != "" || a.Raw {
			return errAt(line, "%s: the only attribute of a search block is id; save_as goes in the block", what)
		}
		var s searchSource
		if err := decodeYAML(b.Body, &s, line, what); err != nil {
			return err
		}
		if s.Query == nil {
			return errAt(line, "%s: query is missing", what)
		}
		if s.SaveAs == "" {
			return errAt(line, "%s: save_as is missing: name the run path the results are saved to, such as evidence/search.json", what)
		}
		if s.Foreach != "" {
			p, ok := r.Param(s.Foreach)
			if !ok || p.Type != TypeList {
				return errAt(line, "%s: foreach %q must name a list param", what, s.Foreach)
			}
			if !strings.Contains(s.SaveAs, "item") {
				return errAt(line, "%s: with foreach, save_as must use {{ item }} so each search saves to its own file", what)
			}
		}
		b.search, b.Foreach, b.Outputs = &s, s.Foreach, []string{s.SaveAs}
	}
	r.Blocks = append(r.Blocks, b)
	return nil
}

// check validates what needs the whole recipe: templates evaluate with the
// defaults, step outputs are valid paths, and every declared output is
// produced by some step.
func (r *Recipe) check() error {
	values := map[string]any{}
	for _, p := range r.Params {
		if p.Required {
			values[p.Name] = placeholder(p.Type)
		}
	}
	plan, err := r.bind(values)
	if err != nil {
		return err
	}
	produced := map[string]bool{}
	for _, s := range plan.Steps {
		for _, o := range s.Outputs {
			produced[o.Path] = true
		}
	}
	for _, o := range r.Outputs {
		if !produced[o.Path] {
			return errAt(o.Line, "output %s is produced by no step: list it in a python block's outputs, or as a search's save_as or a write's path", o.Path)
		}
	}
	return nil
}

// placeholder is a value of type t used to dry-run templates of required
// params, which have no default.
func placeholder(t ParamType) any {
	switch t {
	case TypeInt:
		return int64(1)
	case TypeFloat:
		return 1.0
	case TypeBool:
		return true
	case TypeList:
		return []any{"example"}
	}
	return "example"
}

func heading(l string) (string, bool) {
	t := strings.TrimLeft(l, " ")
	if len(l)-len(t) > 3 || !strings.HasPrefix(t, "#") {
		return "", false
	}
	h := strings.TrimLeft(t, "#")
	if len(t)-len(h) > 6 || (h != "" && h[0] != ' ' && h[0] != '\t') {
		return "", false
	}
	return strings.TrimSpace(strings.TrimRight(strings.TrimSpace(h), "#")), true
}

func stripIndent(l string, n int) string {
	for i := 0; i < n && strings.HasPrefix(l, " "); i++ {
		l = l[1:]
	}
	return l
}

func splitLines(data []byte) []string {
	s := string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
