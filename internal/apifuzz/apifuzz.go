// Package apifuzz is a property-based tester of an HTTP API driven by its OpenAPI document: it makes requests the document allows and requests it refuses, follows the document's links from answer to call, and checks every answer against the document.
//
// It plays the part Schemathesis plays elsewhere, which cannot be
// installed here: per operation, positive cases (values generated from
// the schemas: every answer must be documented, match its schema and not
// be a refusal of the caller's input) and negative cases (one rule of a
// schema broken: the answer must be a 4xx); then a stateful phase that
// starts from the operations whose answers carry links and calls the
// linked operations with the values the links name. Any 5xx is a failure.
package apifuzz

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// Config is one fuzzing session.
type Config struct {
	// Doc is the document, loaded (its $refs resolved).
	Doc *openapi3.T
	// BaseURL is the server's address; Client sends each request (and
	// adds credentials).
	BaseURL string
	Client  *http.Client
	// Seed makes a session repeatable.
	Seed uint64
	// Cases is the number of positive and of negative cases per
	// operation (PerOp, by operationId, where it differs); Chains the
	// number of link chains the stateful phase follows, each at most
	// Depth calls long.
	Cases, Chains, Depth int
	PerOp                map[string]int
	// Formats make values of formats the document names, beyond what a
	// schema's other keywords say (a format's generator must make values
	// its validator accepts).
	Formats map[string]func(r *rand.Rand, s *openapi3.Schema) string
	// Skip leaves out operations (by operationId), with the reason for the
	// report.
	Skip map[string]string
	// Accepted are the 4xx statuses a valid request may get for reasons
	// no schema can state (an id that names nothing, a conflict, another
	// tenant's run, a quota): Schemathesis's positive_data_acceptance
	// allows the same.
	Accepted []int
	// Observe, when set, is told of every call made.
	Observe func(Call)
}

// Call is one request and its answer.
type Call struct {
	Op, Method, URL string
	Kind            string // positive, negative, stateful
	Why             string // what a negative case broke
	Body            []byte
	Status          int
	Answer          []byte
}

// Failure is a call whose answer broke the contract.
type Failure struct {
	Check string // server_error, schema_violation, valid_rejected, invalid_accepted
	Call
	Detail string
}

func (f Failure) String() string {
	body := f.Body
	if len(body) > 300 {
		body = body[:300]
	}
	ans := f.Answer
	if len(ans) > 400 {
		ans = ans[:400]
	}
	return fmt.Sprintf("%s: %s %s (%s %s) body %s -> %d %s: %s", f.Check, f.Method, f.URL, f.Kind, f.Why, body, f.Status, ans, f.Detail)
}

// Report counts a session's calls and lists its failures.
type Report struct {
	Requests   int
	Operations int
	Skipped    map[string]string
	// ByClass counts answers by status class ("2xx", "4xx", "5xx").
	ByClass map[string]int
	// ByOp counts each operation's calls by status.
	ByOp     map[string]map[int]int
	Failures []Failure
	// Links is the number of links followed in the stateful phase.
	Links int
}

type op struct {
	id, method, path string
	item             *openapi3.PathItem
	o                *openapi3.Operation
}

type fuzzer struct {
	c   Config
	g   *gen
	ops []op
	mu  sync.Mutex
	rep Report
}

// Run runs a session and reports it.
func Run(ctx context.Context, c Config) Report {
	if c.Depth == 0 {
		c.Depth = 3
	}
	f := &fuzzer{c: c, g: &gen{r: rand.New(rand.NewPCG(c.Seed, c.Seed^0x5eed)), formats: c.Formats},
		rep: Report{Skipped: map[string]string{}, ByClass: map[string]int{}, ByOp: map[string]map[int]int{}}}
	for _, path := range c.Doc.Paths.InMatchingOrder() {
		item := c.Doc.Paths.Value(path)
		for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
			o := item.GetOperation(method)
			if o == nil {
				continue
			}
			if why, ok := c.Skip[o.OperationID]; ok {
				f.rep.Skipped[o.OperationID] = why
				continue
			}
			f.ops = append(f.ops, op{id: o.OperationID, method: method, path: path, item: item, o: o})
		}
	}
	slices.SortFunc(f.ops, func(a, b op) int { return strings.Compare(a.id, b.id) })
	f.rep.Operations = len(f.ops)
	// Rounds over every operation in a new order each time, so that reads
	// meet what earlier writes made.
	for round := 0; ; round++ {
		order := slices.Clone(f.ops)
		f.g.r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		more := false
		for _, o := range order {
			n, ok := c.PerOp[o.id]
			if !ok {
				n = c.Cases
			}
			if round >= n {
				continue
			}
			if ctx.Err() != nil {
				return f.rep
			}
			more = true
			f.positive(ctx, o, nil)
			f.negative(ctx, o)
		}
		if !more {
			break
		}
	}
	var starts []op
	for _, o := range f.ops {
		if len(links(o.o)) > 0 {
			starts = append(starts, o)
		}
	}
	for i := 0; i < c.Chains && len(starts) > 0 && ctx.Err() == nil; i++ {
		f.chain(ctx, starts[f.g.r.IntN(len(starts))], nil, c.Depth)
	}
	return f.rep
}

// request is a call being built.
type request struct {
	path   map[string]string
	query  url.Values
	header http.Header
	body   []byte
	ctype  string
	why    string
}

// build makes a valid request for o, with the values fixed gives (by
// "path.x", "query.x", "header.x") and a body merged with fixed["body"].
func (f *fuzzer) build(o op, fixed map[string]any) (*request, bool) {
	rq := &request{path: map[string]string{}, query: url.Values{}, header: http.Header{}}
	for _, pr := range append(slices.Clone(o.item.Parameters), o.o.Parameters...) {
		p := pr.Value
		key := p.In + "." + p.Name
		if v, ok := fixed[key]; ok {
			rq.set(p, fmt.Sprint(v))
			continue
		}
		if !p.Required && f.g.r.IntN(2) == 0 {
			continue
		}
		v, err := f.g.value(p.Schema.Value)
		if err != nil {
			return nil, false
		}
		rq.set(p, scalarText(v))
	}
	if rb := o.o.RequestBody; rb != nil && rb.Value != nil {
		for ct, mt := range rb.Value.Content {
			rq.ctype = ct
			switch {
			case strings.Contains(ct, "json"):
				if !rb.Value.Required && f.g.r.IntN(4) == 0 && fixed["body"] == nil {
					rq.ctype = ""
					break
				}
				v, err := f.g.value(mt.Schema.Value)
				if err != nil {
					return nil, false
				}
				if m, ok := fixed["body"].(map[string]any); ok {
					obj, _ := v.(map[string]any)
					if obj == nil {
						obj = map[string]any{}
					}
					for k, x := range m {
						obj[k] = x
					}
					v = obj
					if mt.Schema.Value.VisitJSON(v, visit...) != nil {
						return nil, false
					}
				}
				rq.body, _ = json.Marshal(v)
			default:
				b := make([]byte, f.g.r.IntN(64))
				for i := range b {
					b[i] = byte(f.g.r.IntN(256))
				}
				rq.body = b
			}
			break
		}
	}
	return rq, true
}

func (rq *request) set(p *openapi3.Parameter, v string) {
	switch p.In {
	case "path":
		rq.path[p.Name] = v
	case "query":
		rq.query.Set(p.Name, v)
	case "header":
		rq.header.Set(p.Name, v)
	}
}

func scalarText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case int64:
		return strconv.FormatInt(x, 10)
	case bool:
		return strconv.FormatBool(x)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// positive makes a valid request for o and checks its answer; it returns
// the call when it succeeded.
func (f *fuzzer) positive(ctx context.Context, o op, fixed map[string]any) (*Call, *request) {
	rq, ok := f.build(o, fixed)
	if !ok {
		return nil, nil
	}
	kind := "positive"
	if fixed != nil {
		kind = "stateful"
	}
	call, resp := f.send(ctx, o, rq, kind)
	if call == nil {
		return nil, nil
	}
	if call.Status >= 400 && call.Status < 500 && !slices.Contains(f.c.Accepted, call.Status) {
		f.fail("valid_rejected", *call, "the document allows this request")
	}
	f.conform(o, rq, call, resp)
	if call.Status < 300 {
		return call, rq
	}
	return nil, nil
}

// negative breaks one rule of o's parameters or body and checks the
// answer is a 4xx.
func (f *fuzzer) negative(ctx context.Context, o op) {
	rq, ok := f.build(o, nil)
	if !ok {
		return
	}
	var targets []func() bool
	for _, pr := range append(slices.Clone(o.item.Parameters), o.o.Parameters...) {
		p := pr.Value
		targets = append(targets, func() bool {
			if p.Required && p.In != "path" && f.g.r.IntN(3) == 0 {
				rq.unset(p)
				rq.why = p.In + " " + p.Name + " missing"
				return true
			}
			v, why, ok := f.g.invalid(p.Schema.Value)
			if !ok || v == nil {
				return false
			}
			if _, isArr := v.([]any); isArr {
				return false
			}
			text := scalarText(v)
			if paramAllows(p.Schema.Value, text) {
				return false // its text says something the schema allows ("7" is the integer 7)
			}
			if p.In == "path" && text == "" {
				return false // an empty segment is another route
			}
			if p.In == "header" && strings.ContainsAny(text, "\r\n\x00") {
				return false
			}
			rq.set(p, text)
			rq.why = p.In + " " + p.Name + ": " + why
			return true
		})
	}
	if rb := o.o.RequestBody; rb != nil && rb.Value != nil {
		if mt := rb.Value.Content.Get("application/json"); mt != nil {
			targets = append(targets, func() bool {
				v, why, ok := f.g.invalid(mt.Schema.Value)
				if !ok {
					return false
				}
				rq.body, _ = json.Marshal(v)
				rq.ctype = "application/json"
				rq.why = "body: " + why
				return true
			})
		}
	}
	if len(targets) == 0 {
		return
	}
	for range 5 {
		if targets[f.g.r.IntN(len(targets))]() {
			break
		}
	}
	if rq.why == "" {
		return
	}
	call, resp := f.send(ctx, o, rq, "negative")
	if call == nil {
		return
	}
	if call.Status < 400 {
		f.fail("invalid_accepted", *call, "the document does not allow this request")
	}
	f.conform(o, rq, call, resp)
}

// paramAllows reports whether a parameter's schema allows its text, read
// as a server reads it: a number for an integer or number schema.
func paramAllows(s *openapi3.Schema, text string) bool {
	var v any = text
	if s.Type != nil && (s.Type.Is("integer") || s.Type.Is("number")) {
		n, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return false
		}
		if s.Type.Is("integer") {
			i, err := strconv.ParseInt(text, 10, 64)
			if err != nil {
				return false
			}
			n = float64(i)
		}
		v = n
	}
	return s.VisitJSON(v, visit...) == nil
}

func (rq *request) unset(p *openapi3.Parameter) {
	switch p.In {
	case "path":
		// A path without a segment is another route: keep it.
	case "query":
		rq.query.Del(p.Name)
	case "header":
		rq.header.Del(p.Name)
	}
}

// chain calls o, then follows one of its answer's links, depth times.
func (f *fuzzer) chain(ctx context.Context, o op, fixed map[string]any, depth int) {
	call, rq := f.positive(ctx, o, fixed)
	if call == nil || depth <= 1 {
		return
	}
	ls := links(o.o)
	if len(ls) == 0 {
		return
	}
	names := sortedKeys(ls)
	l := ls[names[f.g.r.IntN(len(names))]]
	next, ok := f.byID(l.OperationID)
	if !ok {
		return
	}
	var answer any
	json.Unmarshal(call.Answer, &answer)
	vals := map[string]any{}
	for k, expr := range l.Parameters {
		v, ok := resolve(fmt.Sprint(expr), rq, answer)
		if !ok {
			return
		}
		vals[k] = v
	}
	if body, ok := l.RequestBody.(map[string]any); ok {
		b := map[string]any{}
		for k, expr := range body {
			v, ok := resolve(fmt.Sprint(expr), rq, answer)
			if !ok {
				return
			}
			b[k] = v
		}
		vals["body"] = b
	}
	f.mu.Lock()
	f.rep.Links++
	f.mu.Unlock()
	f.chain(ctx, next, vals, depth-1)
}

func (f *fuzzer) byID(id string) (op, bool) {
	for _, o := range f.ops {
		if o.id == id {
			return o, true
		}
	}
	return op{}, false
}

func links(o *openapi3.Operation) map[string]*openapi3.Link {
	out := map[string]*openapi3.Link{}
	for code, r := range o.Responses.Map() {
		if !strings.HasPrefix(code, "2") || r.Value == nil {
			continue
		}
		for name, l := range r.Value.Links {
			if l.Value != nil {
				out[name] = l.Value
			}
		}
	}
	return out
}

// resolve evaluates a link's runtime expression: $request.header.X,
// $request.path.x, $request.query.x or $response.body#/json/pointer.
func resolve(expr string, rq *request, answer any) (any, bool) {
	switch {
	case strings.HasPrefix(expr, "$request.header."):
		v := rq.header.Get(strings.TrimPrefix(expr, "$request.header."))
		return v, v != ""
	case strings.HasPrefix(expr, "$request.path."):
		v, ok := rq.path[strings.TrimPrefix(expr, "$request.path.")]
		return v, ok
	case strings.HasPrefix(expr, "$request.query."):
		v := rq.query.Get(strings.TrimPrefix(expr, "$request.query."))
		return v, v != ""
	case strings.HasPrefix(expr, "$response.body#"):
		v := answer
		for _, seg := range strings.Split(strings.TrimPrefix(expr, "$response.body#"), "/")[1:] {
			seg = strings.NewReplacer("~1", "/", "~0", "~").Replace(seg)
			switch x := v.(type) {
			case map[string]any:
				var ok bool
				if v, ok = x[seg]; !ok {
					return nil, false
				}
			case []any:
				i, err := strconv.Atoi(seg)
				if err != nil || i >= len(x) {
					return nil, false
				}
				v = x[i]
			default:
				return nil, false
			}
		}
		return v, v != nil
	}
	return expr, true
}

// send makes the call and counts it.
func (f *fuzzer) send(ctx context.Context, o op, rq *request, kind string) (*Call, *http.Response) {
	u := f.c.BaseURL + fill(o.path, rq.path)
	if len(rq.query) > 0 {
		u += "?" + rq.query.Encode()
	}
	var body io.Reader
	if rq.body != nil {
		body = bytes.NewReader(rq.body)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, o.method, u, body)
	if err != nil {
		return nil, nil
	}
	for k, vs := range rq.header {
		req.Header[k] = vs
	}
	if rq.ctype != "" && rq.body != nil {
		req.Header.Set("Content-Type", rq.ctype)
	}
	call := &Call{Op: o.id, Method: o.method, URL: u, Kind: kind, Why: rq.why, Body: rq.body}
	resp, err := f.c.Client.Do(req)
	if err != nil {
		f.fail("server_error", *call, "no answer: "+err.Error())
		return nil, nil
	}
	defer resp.Body.Close()
	call.Status = resp.StatusCode
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		// A stream lasts as long as its run: the headers are the answer.
		cancel()
	} else {
		call.Answer, _ = io.ReadAll(resp.Body)
	}
	f.mu.Lock()
	f.rep.Requests++
	f.rep.ByClass[fmt.Sprintf("%dxx", call.Status/100)]++
	if f.rep.ByOp[o.id] == nil {
		f.rep.ByOp[o.id] = map[int]int{}
	}
	f.rep.ByOp[o.id][call.Status]++
	f.mu.Unlock()
	if f.c.Observe != nil {
		f.c.Observe(*call)
	}
	if call.Status >= 500 {
		f.fail("server_error", *call, "a 5xx")
	}
	return call, resp
}

// fill puts path parameters into a template, each segment of a value
// percent-encoded (a value may hold slashes: the rest of the path).
func fill(tmpl string, vals map[string]string) string {
	for k, v := range vals {
		segs := strings.Split(v, "/")
		for i, s := range segs {
			segs[i] = url.PathEscape(s)
		}
		tmpl = strings.ReplaceAll(tmpl, "{"+k+"}", strings.Join(segs, "/"))
	}
	return tmpl
}

// conform checks an answer against the document: its status is
// documented, and its body matches the schema of its media type.
func (f *fuzzer) conform(o op, rq *request, call *Call, resp *http.Response) {
	req, _ := http.NewRequest(o.method, call.URL, nil)
	req.Header = rq.header
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: rq.path,
		Route: &routers.Route{Spec: f.c.Doc, Path: o.path, PathItem: o.item, Method: o.method, Operation: o.o}}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	if call.Answer == nil {
		opts.ExcludeResponseBody = true
	}
	err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: call.Status, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(call.Answer)), Options: opts,
	})
	if err != nil {
		f.fail("schema_violation", *call, err.Error())
	}
}

func (f *fuzzer) fail(check string, c Call, detail string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rep.Failures = append(f.rep.Failures, Failure{Check: check, Call: c, Detail: detail})
}
