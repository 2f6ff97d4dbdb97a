package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/gorilla/mux"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/wire"
)

// Requests are validated against the OpenAPI document before a handler
// runs: the body against its operation's schema, and every documented
// parameter (path, query, X-Run-Id) against its own. What the document
// says is what the server enforces, because one is checked by the other;
// the handlers and the core still check what no schema can say (that a
// run exists, that a path is not reserved). See docs/DECISIONS.md, "One
// source for the contract".

// formats are Triad's own string formats, each checked by the function
// its package keeps (so a format says exactly what that function accepts),
// and registered with kin-openapi's validator.
var formats = map[string]func(string) error{
	wire.RunIDFormat: func(s string) error { _, err := runid.Parse(s); return err },
	wire.PathFormat:  func(s string) error { _, err := safepath.Clean(s); return err },
	wire.PrefixFormat: func(s string) error {
		_, err := safepath.CleanPrefix(s)
		return err
	},
	wire.DirFormat: func(s string) error {
		if s == "" {
			return nil
		}
		_, err := safepath.Clean(s)
		return err
	},
	wire.NonBlankFormat: func(s string) error {
		if strings.TrimSpace(s) == "" {
			return fault.New(fault.BadInput, "it holds only white space", "send some text")
		}
		return nil
	},
	wire.EgressHostFormat: func(s string) error {
		if err := egress.CheckRuleHost(s); err != nil {
			return fault.Badf(`send a DNS name (pypi.org), a wildcard (*.example.com) or *; names only, never addresses`, "%v", err)
		}
		return nil
	},
	wire.EgressNameFormat: func(s string) error {
		if _, err := egress.NormalizeHost(s); err != nil {
			return fault.Badf("send a DNS name such as api.example.com, without a wildcard", "%v", err)
		}
		return nil
	},
	wire.CIDRFormat: func(s string) error {
		if err := egress.CheckCIDR(s); err != nil {
			return fault.Badf("send an address (10.1.2.3) or a prefix (10.0.0.0/8, fd00::/8)", "%v", err)
		}
		return nil
	},
	wire.HTTPMethodFormat: func(s string) error {
		if err := egress.CheckMethod(s); err != nil {
			return fault.Badf("send a method such as GET or POST (CONNECT is how HTTPS travels, not a method a rule allows)", "%v", err)
		}
		return nil
	},
	wire.HeaderNameFormat: func(s string) error {
		if !egress.ValidHeaderName(s) {
			return fault.Badf("send a header's name such as Authorization", "%q is not an HTTP header's name", s)
		}
		return nil
	},
	wire.DomainFormat: func(s string) error {
		if err := browser.CheckDomain(s); err != nil {
			return fault.Badf("send a bare hostname such as example.com", "%q is not a hostname: %v", s, err)
		}
		return nil
	},
	wire.DateRangeFormat: func(s string) error { _, err := browser.ParseDateRange(s); return err },
	wire.DurationFormat: func(s string) error {
		if d, err := time.ParseDuration(s); err != nil || d <= 0 {
			return fault.Badf(`send a positive Go duration such as "24h" or "90m"`, "%q is not a positive duration", s)
		}
		return nil
	},
}

func init() {
	for name, check := range formats {
		openapi3.DefineStringFormatValidator(name, openapi3.NewCallbackValidator(check))
	}
}

// formatNames lists Triad's formats, sorted.
func formatNames() []string { return sortedKeys(formats) }

// operation returns the documented operation a request matched.
func (s *Server) operationOf(rt *route, method string) (*openapi3.Operation, error) {
	doc, _, err := s.document()
	if err != nil {
		return nil, err
	}
	item := doc.Paths.Value(DocPath(rt.Path))
	if item == nil || item.GetOperation(method) == nil {
		return nil, fmt.Errorf("%s %s is not in the document", method, rt.Path)
	}
	return item.GetOperation(method), nil
}

var visit = []openapi3.SchemaValidationOption{openapi3.VisitAsRequest(), openapi3.EnableFormatValidation()}

// checkParams validates a request's documented parameters: each one
// present must match its schema, and each required one must be present.
// X-Run-Id keeps its own kinds (missing_run_id, invalid_run_id).
func (s *Server) checkParams(r *http.Request, rt *route) error {
	op, err := s.operationOf(rt, r.Method)
	if err != nil {
		return fault.Wrap(fault.Internal, err, "the OpenAPI document could not be built", "report this with the server log")
	}
	var q url.Values
	for _, pr := range op.Parameters {
		p := pr.Value
		var raw string
		var present bool
		switch p.In {
		case "header":
			if p.Name == RunHeader {
				continue // run(r) answers with the run id's own kinds
			}
			raw = r.Header.Get(p.Name)
			present = raw != ""
		case "path":
			esc, ok := mux.Vars(r)[p.Name]
			if !ok {
				continue
			}
			if raw, err = url.PathUnescape(esc); err != nil {
				return fault.Wrap(fault.BadInput, err, fmt.Sprintf("path parameter %s is not validly percent-encoded", p.Name), "percent-encode the path (RFC 3986)")
			}
			present = true
		case "query":
			if q == nil {
				if q, err = url.ParseQuery(r.URL.RawQuery); err != nil {
					return fault.Wrap(fault.BadInput, err, "the query string is malformed", "percent-encode query parameters")
				}
			}
			vs, ok := q[p.Name]
			if ok && len(vs) > 1 {
				return fault.Badf(fmt.Sprintf("send %s once", p.Name), "query parameter %s is given %d times", p.Name, len(vs))
			}
			if ok {
				raw, present = vs[0], true
			}
		}
		if !present {
			if p.Required && p.In != "path" {
				return fault.Badf(fmt.Sprintf("add %s: %s", p.Name, p.Description), "%s parameter %s is missing", p.In, p.Name)
			}
			continue
		}
		where := fmt.Sprintf("%s parameter %s", p.In, p.Name)
		var v any = raw
		if p.Schema.Value.Type.Is("integer") {
			n, err := strconv.ParseInt(raw, 10, 64)
			if err != nil {
				return fault.Badf(fmt.Sprintf("send %s as a whole number: %s", p.Name, p.Description), "%s is %q, not a whole number", where, raw)
			}
			v = n
		}
		if err := p.Schema.Value.VisitJSON(v, visit...); err != nil {
			return schemaFault(err, where, p.Description)
		}
	}
	return nil
}

// jsonBody is how much of a JSON body is read: inline content is base64
// in JSON, so allow for its 4/3 growth.
func (s *Server) jsonBody() int64 { return s.orch.Limits().JSONBody*4/3 + 64<<10 }

// decode reads a JSON request body and checks it against the operation's
// schema in the document, then decodes it strictly into v. The body must
// be JSON (Content-Type application/json or absent; no Content-Encoding),
// valid UTF-8 (never rewritten: two names that differ only in invalid
// bytes must not become the same name), complete, within the size limit,
// and one value that the schema allows (an object: null is not one). An
// operation whose body is optional takes an empty body as none, and then
// leaves v as it is.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	rt := s.routeOf(r)
	if err := jsonContent(r); err != nil {
		return err
	}
	b, err := s.readBody(w, r, s.jsonBody())
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		if rt != nil && rt.OptionalBody {
			return nil
		}
		return fault.New(fault.BadInput, "the request body is empty", "send a JSON object; see docs/api.md or GET /openapi.json")
	}
	return s.decodeJSON(rt, r.Method, b, v)
}

// decodeJSON checks a JSON body (or a form's request part) against the
// operation's schema and decodes it strictly into v (see decode).
func (s *Server) decodeJSON(rt *route, method string, b []byte, v any) error {
	if i := invalidUTF8(b); i >= 0 {
		return fault.Badf("send the body as UTF-8: a name with other bytes cannot be a run path", "the request body is not valid UTF-8 (at byte %d)", i)
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return jsonFault(err)
	}
	if dec.More() {
		return fault.New(fault.BadInput, "the request body has data after the JSON value", "send exactly one JSON object")
	}
	if rt != nil {
		op, err := s.operationOf(rt, method)
		if err != nil {
			return fault.Wrap(fault.Internal, err, "the OpenAPI document could not be built", "report this with the server log")
		}
		if rb := op.RequestBody; rb != nil && rb.Value != nil {
			if mt := rb.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
				if err := mt.Schema.Value.VisitJSON(generic, visit...); err != nil {
					return schemaFault(err, "", "")
				}
			}
		}
	}
	strict := json.NewDecoder(bytes.NewReader(b))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		return jsonFault(err)
	}
	return nil
}

// jsonContent refuses a JSON body that is declared as anything else, or
// compressed: the server would otherwise read it as what it is not.
func jsonContent(r *http.Request) error {
	if err := noEncoding(r); err != nil {
		return err
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil // clients that send none mean JSON
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || !(mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return fault.New(fault.UnsupportedMediaType, fmt.Sprintf("the body is declared as %q; this endpoint takes application/json", ct),
			"send Content-Type: application/json (curl: --json '{...}', or -H 'Content-Type: application/json')")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fault.New(fault.UnsupportedMediaType, fmt.Sprintf("the body's charset is %q; JSON is UTF-8", cs), "send the body as UTF-8, with charset=utf-8 or no charset")
	}
	return nil
}

// noEncoding refuses a compressed body: Triad does not decompress request
// bodies, and reading one as it came would store or parse the wrong bytes.
func noEncoding(r *http.Request) error {
	for _, v := range r.Header.Values("Content-Encoding") {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return fault.New(fault.UnsupportedMediaType, fmt.Sprintf("the body is sent with Content-Encoding %q, which this server does not decode", e),
					"send the body uncompressed, without Content-Encoding")
			}
		}
	}
	return nil
}

// readBody reads a whole request body of at most limit bytes, under the
// body deadlines (bodyread): a body cut short is incomplete_body, one that
// stops arriving body_timeout, one over the limit too_large.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	body := bodyread.New(w, r, s.c.Body)
	defer body.Close()
	return io.ReadAll(body)
}

// invalidUTF8 returns the offset of b's first invalid UTF-8 byte, or -1.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// jsonFault turns an encoding/json error into a bad_input that names the
// field and the JSON types, never a Go type.
func jsonFault(err error) error {
	const sugg = "send a JSON object with the documented fields; see GET /openapi.json"
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("field %s has the wrong type: got a JSON %s", typeErr.Field, typeErr.Value), sugg)
	case errors.As(err, &typeErr):
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("the request body must be a JSON object; got a JSON %s", typeErr.Value), sugg)
	case errors.As(err, &syntaxErr):
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("the request body is not valid JSON (at byte %d)", syntaxErr.Offset), sugg)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fault.Wrap(fault.BadInput, err, "the request body is not valid JSON (it ends early)", sugg)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if f, uerr := strconv.Unquote(name); uerr == nil {
			name = f
		}
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("unknown field %q", name), "remove it; the operation's schema in GET /openapi.json lists the fields")
	}
	return fault.Wrap(fault.BadInput, err, "the request body is not valid JSON for this endpoint", sugg)
}

// narrow finds, under a failed allOf, anyOf or oneOf, the violation that
// names the most: the value is checked against each alternative again and
// the failure deepest in the value wins (a param of a recipe's params
// rather than "the body does not combine its fields"). A combinator whose
// alternatives all fail at the top, such as "send recipe or run_id", is
// kept: it says more than any one of them. It returns the violation and
// its place in the whole value.
func narrow(se *openapi3.SchemaError) (*openapi3.SchemaError, []string) {
	prefix := se.JSONPointer()
	for range 16 {
		var alts openapi3.SchemaRefs
		switch se.SchemaField {
		case "allOf":
			alts = se.Schema.AllOf
		case "anyOf":
			alts = se.Schema.AnyOf
		case "oneOf":
			alts = se.Schema.OneOf
		default:
			return se, prefix
		}
		var best *openapi3.SchemaError
		for _, a := range alts {
			if a == nil || a.Value == nil {
				continue
			}
			var sub *openapi3.SchemaError
			if err := a.Value.VisitJSON(se.Value); err == nil || !errors.As(err, &sub) || sub.SchemaField == "not" {
				continue // an alternative that holds, or one that only says "not that"
			}
			if best == nil || len(sub.JSONPointer()) > len(best.JSONPointer()) {
				best = sub
			}
		}
		if best == nil {
			return se, prefix
		}
		switch best.SchemaField {
		case "allOf", "anyOf", "oneOf":
		default:
			if len(best.JSONPointer()) == 0 && se.SchemaField != "allOf" {
				return se, prefix
			}
		}
		prefix = append(slices.Clone(prefix), best.JSONPointer()...)
		se = best
	}
	return se, prefix
}

// schemaFault turns a schema violation into a bad_input that names the
// field and says what it must be. where names a parameter ("" for the
// body); desc is its description, for the suggestion. A format's own
// check answers with its own fault (invalid_run_id for a run id).
func schemaFault(err error, where, desc string) error {
	var se *openapi3.SchemaError
	if !errors.As(err, &se) {
		return fault.Wrap(fault.BadInput, err, "the request does not match the API's schema", "see GET /openapi.json")
	}
	se, ptr := narrow(se)
	name := strings.Join(ptr, ".")
	if where == "" {
		where = name
		if where == "" {
			where = "the request body"
		}
	} else if name != "" {
		where += "." + name
	}
	if desc == "" {
		desc = se.Schema.Description
	}
	sugg := "see the operation's schema in GET /openapi.json"
	if desc != "" {
		sugg = desc
	}
	bad := func(format string, args ...any) error {
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf(format, args...), sugg)
	}
	s := se.Schema
	switch se.SchemaField {
	case "required":
		field := strings.TrimSuffix(strings.TrimPrefix(se.Reason, `property "`), `" is missing`)
		if d := s.Properties[field]; d != nil && d.Value != nil && d.Value.Description != "" {
			sugg = d.Value.Description
		}
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("%s is missing", joinField(name, field)), sugg)
	case "properties", "additionalProperties":
		field := strings.TrimSuffix(strings.TrimPrefix(se.Reason, `property "`), `" is unsupported`)
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("unknown field %q%s", field, in(name)),
			"remove it; the fields are "+strings.Join(sortedKeys(s.Properties), ", "))
	case "type":
		if se.Value == nil && name == "" {
			return bad("the request body is null; send a JSON object")
		}
		return bad("%s must be %s; got %s", where, typeName(s), jsonType(se.Value))
	case "nullable":
		return bad("%s must be %s; got null", where, typeName(s))
	case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
		return bad("%s is %v; %s", where, se.Value, rangeText(s))
	case "minLength", "maxLength":
		return bad("%s is %d characters long; %s", where, utf8.RuneCountInString(fmt.Sprint(se.Value)), lengthText(s))
	case "minItems", "maxItems":
		n := 0
		if a, ok := se.Value.([]any); ok {
			n = len(a)
		}
		return bad("%s has %d items; %s", where, n, itemsText(s))
	case "enum":
		var vs []string
		for _, e := range s.Enum {
			vs = append(vs, fmt.Sprint(e))
		}
		return bad("%s is %s; it must be one of %s", where, quoteValue(se.Value), strings.Join(vs, ", "))
	case "format":
		if fe := fault.As(se.Origin); fe != nil {
			return &fault.Error{Kind: fe.Kind, Message: fmt.Sprintf("%s: %s", where, fe.Message), Suggestion: fe.Suggestion, Err: err}
		}
		return bad("%s is not a valid %s", where, s.Format)
	case "pattern":
		// A pattern that states a format of ours fails first; the format's
		// own check gives its kind (invalid_run_id for a run id).
		if check, ok := formats[s.Format]; ok {
			if v, isStr := se.Value.(string); isStr {
				if fe := fault.As(check(v)); fe != nil {
					return &fault.Error{Kind: fe.Kind, Message: fmt.Sprintf("%s: %s", where, fe.Message), Suggestion: fe.Suggestion, Err: err}
				}
			}
		}
		return bad("%s does not have the form the API allows (the pattern %s)", where, s.Pattern)
	case "oneOf", "anyOf", "allOf", "not":
		return bad("%s does not combine its fields as the API allows: %s", where, ruleText(s))
	}
	return bad("%s: %s", where, se.Reason)
}

func joinField(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

func in(name string) string {
	if name == "" {
		return ""
	}
	return " in " + name
}

func typeName(s *openapi3.Schema) string {
	if s.Type == nil || len(*s.Type) == 0 {
		return "another value"
	}
	switch t := (*s.Type)[0]; t {
	case "integer":
		return "a whole number"
	case "object", "array":
		return "an " + t
	default:
		return "a " + t
	}
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64, int64, int:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	default:
		return "an object"
	}
}

func quoteValue(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

func rangeText(s *openapi3.Schema) string {
	lo, hi := "", ""
	if s.Min != nil {
		lo = strconv.FormatFloat(*s.Min, 'f', -1, 64)
	}
	if s.ExclusiveMin.Value != nil {
		return "it must be more than " + strconv.FormatFloat(*s.ExclusiveMin.Value, 'f', -1, 64)
	}
	if s.Max != nil {
		hi = strconv.FormatFloat(*s.Max, 'f', -1, 64)
	}
	switch {
	case lo != "" && hi != "":
		return fmt.Sprintf("it must be between %s and %s", lo, hi)
	case lo != "":
		return "it must be at least " + lo
	default:
		return "it must be at most " + hi
	}
}

func lengthText(s *openapi3.Schema) string {
	if s.MaxLength != nil {
		return fmt.Sprintf("it must be %d to %d characters", s.MinLength, *s.MaxLength)
	}
	return fmt.Sprintf("it must be at least %d characters", s.MinLength)
}

func itemsText(s *openapi3.Schema) string {
	if s.MaxItems != nil {
		return fmt.Sprintf("it must have %d to %d", s.MinItems, *s.MaxItems)
	}
	return fmt.Sprintf("it must have at least %d", s.MinItems)
}

// ruleText says a schema's rules on how its fields combine.
func ruleText(s *openapi3.Schema) string {
	var out []string
	var names []string
	for _, r := range s.OneOf {
		names = append(names, r.Value.Required...)
	}
	if len(names) > 0 {
		out = append(out, "send exactly one of "+strings.Join(names, " and "))
	}
	names = nil
	for _, r := range s.AnyOf {
		names = append(names, r.Value.Required...)
	}
	if len(names) > 0 {
		out = append(out, "send at least one of "+strings.Join(names, " and "))
	}
	for _, c := range s.AllOf {
		out = append(out, conditionText(c.Value))
	}
	return strings.Join(out, "; ")
}

// conditionText says a condition (see condition) in words.
func conditionText(s *openapi3.Schema) string {
	if len(s.AnyOf) != 2 {
		return "see GET /openapi.json"
	}
	is, absent := s.AnyOf[0].Value, s.AnyOf[1].Value
	not := false
	if is.Not != nil {
		is, not = is.Not.Value, true
	}
	var fields []string
	if absent.Not != nil {
		for _, r := range absent.Not.Value.AnyOf {
			fields = append(fields, r.Value.Required...)
		}
	}
	if len(is.Required) == 0 {
		return "see GET /openapi.json"
	}
	f := is.Required[0]
	v := ""
	if p := is.Properties[f]; p != nil && len(p.Value.Enum) == 1 {
		v = fmt.Sprint(p.Value.Enum[0])
	}
	if not {
		return fmt.Sprintf("%s only when %s is not %s", strings.Join(fields, " and "), f, v)
	}
	return fmt.Sprintf("%s only when %s is %s", strings.Join(fields, " and "), f, v)
}

// recipeSchemas states each recipe's params in the schema of a recipe
// run's request: the recipe is one of those this server can run (the
// others, elsewhere, need another sandbox), and when the request names
// it, its params are that recipe's, of their types, the required ones
// present and no others.
func recipeSchemas(s *openapi3.Schema, recipes []wire.RecipeInfo, elsewhere []string) error {
	if s == nil {
		return errors.New("no RecipeRunRequest schema")
	}
	p := s.Properties["recipe"]
	if p == nil || p.Value == nil {
		return errors.New("RecipeRunRequest has no recipe")
	}
	if len(elsewhere) > 0 {
		p.Value.Description += " This server's sandbox runs the recipes listed; " + strings.Join(elsewhere, ", ") +
			" need the Docker sandbox (start triad with --sandbox docker)."
	}
	for _, rc := range recipes {
		p.Value.Enum = append(p.Value.Enum, rc.Name)
		params := &openapi3.Schema{Type: &openapi3.Types{"object"}, Properties: openapi3.Schemas{}}
		no := false
		params.AdditionalProperties = openapi3.AdditionalProperties{Has: &no}
		for _, rp := range rc.Params {
			params.Properties[rp.Name] = &openapi3.SchemaRef{Value: recipeParamSchema(rp)}
			if rp.Required {
				params.Required = append(params.Required, rp.Name)
			}
		}
		named := &openapi3.Schema{Required: []string{"recipe"},
			Properties: openapi3.Schemas{"recipe": &openapi3.SchemaRef{Value: &openapi3.Schema{Enum: []any{rc.Name}}}}}
		s.AllOf = append(s.AllOf, &openapi3.SchemaRef{Value: &openapi3.Schema{AnyOf: openapi3.SchemaRefs{
			{Value: &openapi3.Schema{Not: &openapi3.SchemaRef{Value: named}}},
			{Value: &openapi3.Schema{Properties: openapi3.Schemas{"params": {Value: params}}}},
		}}})
	}
	return nil
}

// recipeParamSchema is a recipe param's value's schema (recipes.normalize
// says what each type takes).
func recipeParamSchema(p wire.RecipeParam) *openapi3.Schema {
	const maxString = 64 << 10 // recipes.MaxStringParam
	scalar := &openapi3.Schema{AnyOf: openapi3.SchemaRefs{
		{Value: &openapi3.Schema{Type: &openapi3.Types{"string"}, Extensions: map[string]any{"x-max-bytes": maxString}}},
		{Value: &openapi3.Schema{Type: &openapi3.Types{"boolean"}}},
		{Value: &openapi3.Schema{Type: &openapi3.Types{"number"}}},
	}}
	var s *openapi3.Schema
	switch p.Type {
	case "string":
		s = &openapi3.Schema{Type: &openapi3.Types{"string"}, Extensions: map[string]any{"x-max-bytes": maxString}}
	case "int":
		lo, hi := float64(-(1 << 53)), float64(1<<53)
		s = &openapi3.Schema{Type: &openapi3.Types{"integer"}, Min: &lo, Max: &hi}
	case "float":
		s = &openapi3.Schema{Type: &openapi3.Types{"number"}}
	case "bool":
		s = &openapi3.Schema{Type: &openapi3.Types{"boolean"}}
	case "list":
		hi := uint64(1000)
		s = &openapi3.Schema{Type: &openapi3.Types{"array"}, Items: &openapi3.SchemaRef{Value: scalar}, MaxItems: &hi}
	default:
		s = &openapi3.Schema{}
	}
	if p.Minimum != nil {
		s.Min = p.Minimum
	}
	if p.Maximum != nil {
		s.Max = p.Maximum
	}
	if n := uint64(p.MaxLength); n > 0 {
		if s.Items != nil {
			s.Items = &openapi3.SchemaRef{Value: &openapi3.Schema{AnyOf: openapi3.SchemaRefs{
				{Value: &openapi3.Schema{Type: &openapi3.Types{"string"}, MaxLength: &n}},
				{Value: &openapi3.Schema{Type: &openapi3.Types{"boolean"}}},
				{Value: &openapi3.Schema{Type: &openapi3.Types{"number"}}},
			}}}
		} else {
			s.MaxLength = &n
		}
	}
	if p.Name == "as_of" && p.Type == "string" {
		// recipes.checkRunParam: a date, or empty for none.
		s.AnyOf = openapi3.SchemaRefs{{Value: &openapi3.Schema{Enum: []any{""}}}, {Value: &openapi3.Schema{Format: "date"}}}
	}
	s.Description = p.Description
	return s
}
