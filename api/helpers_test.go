package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/gorilla/mux"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

func TestMain(m *testing.M) {
	// Text answers (CEL.md, event streams) are validated as opaque bodies
	// of their documented media type.
	openapi3filter.RegisterBodyDecoder("text/markdown", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.FileBodyDecoder)
	code := m.Run()
	miniotest.StopShared()
	if code == 0 && validated.Load() == 0 && flag.Lookup("test.bench").Value.String() == "" {
		// A suite whose responses were never checked against the document
		// proves nothing about it. (A benchmark run times raw requests.)
		os.Stderr.WriteString("no response was validated against the OpenAPI document\n")
		code = 1
	}
	os.Exit(code)
}

// client calls one server. It sends its key (Authorization: Bearer) with
// every request, so every test of the API runs with authentication on, and
// it checks every answer against the server's OpenAPI document.
type client struct {
	t   testing.TB
	url string
	// key is sent as Authorization: Bearer; empty sends none.
	key  string
	h    *api.Server
	keys *keys.Store
}

// apiServer serves cfg with authentication on: a key store and share
// links (over a store's records of their own, unless cfg gives them), and
// one key with the runs scope in tenant "acme", which the client sends by
// default.
func apiServer(t testing.TB, cfg api.Config) *client {
	t.Helper()
	ctx := context.Background()
	var meta tmpfs.Meta
	if cfg.Keys == nil || cfg.Shares == nil {
		dir := t.TempDir()
		b, err := local.NewBlobs(dir)
		if err != nil {
			t.Fatal(err)
		}
		x, err := local.NewIndex(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		meta = tmpfs.New(b, x, nil).Meta()
	}
	if cfg.Keys == nil {
		cfg.Keys = keys.New(meta, keys.Config{})
	}
	if cfg.Shares == nil {
		sh, err := share.Open(ctx, meta, share.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Shares = sh
	}
	tok, _, err := cfg.Keys.Create(ctx, "test suite", "acme", []auth.Scope{auth.Runs})
	if err != nil {
		t.Fatal(err)
	}
	h := api.New(cfg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	if c, ok := cfg.Orchestrator.(io.Closer); ok {
		t.Cleanup(func() { c.Close() })
	}
	return &client{t: t, url: srv.URL, key: tok, h: h, keys: cfg.Keys}
}

// as returns a client that sends key instead ("" for none).
func (c *client) as(key string) *client {
	cp := *c
	cp.key = key
	return &cp
}

// newKey creates a key on c's server.
func (c *client) newKey(tenant string, scopes ...auth.Scope) string {
	c.t.Helper()
	tok, _, err := c.keys.Create(context.Background(), "key of "+tenant, tenant, scopes)
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

func (c *client) do(method, path, run string, body io.Reader, hdr ...string) answer {
	c.t.Helper()
	ctx := context.Background()
	if tt, ok := c.t.(*testing.T); ok {
		ctx = tt.Context()
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if run != "" {
		req.Header.Set(api.RunHeader, run)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	a := answer{status: resp.StatusCode, body: b, header: resp.Header}
	if c.h != nil {
		c.validate(req, a)
	}
	return a
}

var (
	docs      sync.Map // *api.Server -> *openapi3.T
	validated atomic.Int64
)

// document returns the server's OpenAPI document as a client would load
// it: fetched from GET /openapi.json, parsed and validated.
func (c *client) document() *openapi3.T {
	c.t.Helper()
	if d, ok := docs.Load(c.h); ok {
		return d.(*openapi3.T)
	}
	resp, err := http.Get(c.url + "/openapi.json")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("GET /openapi.json: %d %s", resp.StatusCode, b)
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		c.t.Fatalf("load /openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		c.t.Fatalf("/openapi.json is not a valid OpenAPI document: %v", err)
	}
	docs.Store(c.h, doc)
	return doc
}

// validate checks an answer against the operation the request matched:
// its status must be documented (or be an error, under "default") and its
// body must match the schema for its media type.
func (c *client) validate(req *http.Request, a answer) {
	c.t.Helper()
	var m mux.RouteMatch
	if !c.h.Router().Match(req, &m) || m.Route == nil {
		// No route: the one error body, and nothing else.
		var e wire.ErrorBody
		dec := json.NewDecoder(bytes.NewReader(a.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Error.Kind == "" || a.status < 400 {
			c.t.Errorf("%s %s matched no route, and answered %d %s, not an error body", req.Method, req.URL.Path, a.status, a.body)
		}
		validated.Add(1)
		return
	}
	tmpl, _ := m.Route.GetPathTemplate()
	doc := c.document()
	p := api.DocPath(tmpl)
	item := doc.Paths.Value(p)
	if item == nil || item.GetOperation(req.Method) == nil {
		c.t.Errorf("%s %s is served but not in the OpenAPI document", req.Method, p)
		return
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: m.Vars,
		Route: &routers.Route{Spec: doc, Path: p, PathItem: item, Method: req.Method, Operation: item.GetOperation(req.Method)}}
	err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: a.status, Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
	if err != nil {
		body := a.body
		if len(body) > 400 {
			body = body[:400]
		}
		c.t.Errorf("%s %s answered %d, which does not match the OpenAPI document: %v\nbody: %s", req.Method, req.URL.Path, a.status, err, body)
	}
	validated.Add(1)
}
