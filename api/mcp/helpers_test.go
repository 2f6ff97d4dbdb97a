package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// stack is a real Triad behind both surfaces: a local store in a temp
// directory, the journal, the real Tavily client against the Tavily fake,
// optionally the Docker sandbox, one orchestrator, the HTTP API with the
// MCP handler mounted at /mcp as triad serve mounts it, and the MCP server
// itself for stdio.
type stack struct {
	orch   *orchestrator.Orchestrator
	store  *tmpfs.Store
	runner *runner.Runner // nil unless stackOptions.recipes
	mcp    *Server
	url    string // base URL of the HTTP API; MCP is at url+"/mcp"
	// key is an API key (tenant default, scope runs) that every HTTP
	// request sends, so the suite runs with authentication on.
	key  string
	keys *keys.Store
}

// client is an HTTP client that sends the stack's key.
func (s *stack) client() *http.Client { return &http.Client{Transport: bearer{s.key}} }

// bearer adds Authorization: Bearer to every request.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

type stackOptions struct {
	sandbox bool
	// recipes adds the real recipe runner with the standard recipes and
	// testdata/*.md; it needs the sandbox.
	recipes bool
	// kernels is the tenants' kernel quota (0: none).
	kernels int
}

func newStack(t testing.TB, o stackOptions) *stack {
	t.Helper()
	dir := t.TempDir()
	blobs, err := local.NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := local.NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	store := tmpfs.New(blobs, idx, nil)
	var km *kernels.Manager
	if o.sandbox {
		b := dockerBackend(t)
		km = kernels.New(kernels.Config{Backend: b, Store: store, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
		t.Cleanup(func() { km.Close() })
	}
	fake := tavilytest.NewServer(t)
	search, err := tavily.New(tavily.Config{APIKey: fake.Key, BaseURL: fake.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { search.Close() })
	orch := orchestrator.New(orchestrator.Config{Store: store, Kernels: km, Journal: cel.New(store), Search: search,
		Quotas: orchestrator.Quotas{Kernels: o.kernels}})
	t.Cleanup(func() { orch.Close() })
	var rn *runner.Runner
	var recipeRunner *runner.Runner
	if o.recipes {
		user, err := recipes.LoadDir("testdata")
		if err != nil {
			t.Fatal(err)
		}
		cat, err := recipes.NewCatalog(user...)
		if err != nil {
			t.Fatal(err)
		}
		rn = runner.New(runner.Config{Orchestrator: orch, Catalog: cat, Backend: km.Backend()})
		t.Cleanup(func() { rn.Close() })
		recipeRunner = rn
	}
	srv := New(Config{Orchestrator: orch, Recipes: recipeRunner})
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Server.Close: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("second Server.Close: %v", err)
		}
	})
	ks := keys.New(store.Meta(), keys.Config{})
	tok, _, err := ks.Create(context.Background(), "mcp suite", auth.DefaultTenant, []auth.Scope{auth.Runs})
	if err != nil {
		t.Fatal(err)
	}
	h := api.New(api.Config{Orchestrator: orch, Runner: rn, Keys: ks})
	h.Mount("/mcp", "MCP over streamable HTTP", srv.Handler())
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return &stack{orch: orch, store: store, runner: rn, mcp: srv, url: hs.URL, key: tok, keys: ks}
}

// sandboxImage returns the sandbox image's tag (see orchestratortest.Image).
func sandboxImage(t testing.TB) string {
	t.Helper()
	return orchestratortest.Image(t)
}

// dockerBackend starts the real Docker sandbox on the real image.
func dockerBackend(t testing.TB) *docker.Backend {
	t.Helper()
	tag := sandboxImage(t)
	b, err := docker.New(context.Background(), docker.Config{Image: tag, WorkRoot: filepath.Join(t.TempDir(), "work"), Runtime: testenv.DockerRuntime()})
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("docker Backend.Close: %v", err)
		}
	})
	return b
}

// transport connects an SDK client to the stack one way.
type transport struct {
	name    string
	connect func(t testing.TB, s *stack) *sdk.ClientSession
}

var transports = []transport{
	{"http", connectHTTP},
	{"stdio", connectStdio},
}

func newClient() *sdk.Client {
	return sdk.NewClient(&sdk.Implementation{Name: "triad-test", Version: "0"}, nil)
}

// connectHTTP opens a streamable HTTP session at /mcp of the HTTP API.
func connectHTTP(t testing.TB, s *stack) *sdk.ClientSession {
	t.Helper()
	cs, err := newClient().Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: s.url + "/mcp", DisableStandaloneSSE: true, HTTPClient: s.client()}, nil)
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// connectStdio serves one stdio session over a pair of pipes, the way
// triad mcp serves its stdin and stdout.
func connectStdio(t testing.TB, s *stack) *sdk.ClientSession {
	t.Helper()
	c2sR, c2sW := io.Pipe()
	s2cR, s2cW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.mcp.ServeIO(context.Background(), c2sR, s2cW) }()
	cs, err := newClient().Connect(t.Context(), &sdk.IOTransport{Reader: s2cR, Writer: c2sW}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v", err)
	}
	t.Cleanup(func() {
		cs.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeIO: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("ServeIO did not return after the client closed")
		}
	})
	return cs
}

// call makes a tool call that must not fail at the protocol level: every
// failure Triad knows of is a result.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v; want a result", tool, err)
	}
	return res
}

// ok requires a successful result and decodes its structured content into
// T strictly: a field the HTTP type does not have fails the test.
func ok[T any](t *testing.T, res *sdk.CallToolResult) T {
	t.Helper()
	if res.IsError {
		t.Fatalf("got isError with %s, want success", text(res))
	}
	return decode[T](t, res)
}

func decode[T any](t *testing.T, res *sdk.CallToolResult) T {
	t.Helper()
	var v T
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("structured content %s does not decode into %T: %v", b, v, err)
	}
	return v
}

// failed requires an error result in the one error shape and returns it.
func failed(t *testing.T, res *sdk.CallToolResult) wire.ErrorDetail {
	t.Helper()
	if !res.IsError {
		t.Fatalf("got success %s, want isError", text(res))
	}
	if len(res.Content) != 1 {
		t.Fatalf("got %d content blocks in an error result, want 1", len(res.Content))
	}
	var body wire.ErrorBody
	dec := json.NewDecoder(strings.NewReader(text(res)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		t.Fatalf("error text %q is not {\"error\":{kind,message,suggestion}}: %v", text(res), err)
	}
	if body.Error.Kind == "" || body.Error.Message == "" || body.Error.Suggestion == "" {
		t.Errorf("got error %+v, want kind, message and suggestion all set", body.Error)
	}
	return body.Error
}

// text is the first content block's text.
func text(res *sdk.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*sdk.TextContent); ok {
		return tc.Text
	}
	return fmt.Sprintf("(%T)", res.Content[0])
}

func runOf(t *testing.T, res *sdk.CallToolResult) string {
	t.Helper()
	id, _ := res.Meta[metaRunID].(string)
	if id == "" {
		t.Fatalf("result has no _meta %q: %v", metaRunID, res.Meta)
	}
	return id
}

// httpGet calls the HTTP API and returns its JSON body as a generic value.
func (s *stack) httpDo(t *testing.T, method, path, run string, body any) (int, any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(api.RunHeader, run)
	resp, err := s.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s %s: body is not JSON: %v", method, path, err)
	}
	return resp.StatusCode, v
}

// generic turns a structured result into the generic JSON value a client
// sees.
func generic(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var g any
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// jsonFields lists the JSON object keys a Go struct type marshals to,
// embedded structs flattened, as encoding/json does.
func jsonFields(rt reflect.Type) []string {
	var out []string
	for _, f := range reflect.VisibleFields(rt) {
		if f.Anonymous || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// schemaProps lists the property names of a schema as a client sees it.
func schemaProps(t *testing.T, schema any) []string {
	t.Helper()
	m, ok := generic(t, schema).(map[string]any)
	if !ok {
		t.Fatalf("schema %v is not an object", schema)
	}
	if m["type"] != "object" {
		t.Errorf("got schema type %v, want object", m["type"])
	}
	if ap, ok := m["additionalProperties"]; !ok || ap == true {
		t.Errorf("got additionalProperties %v, want unknown properties refused", ap)
	}
	props, _ := m["properties"].(map[string]any)
	var out []string
	for k := range props {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// match checks got against an abridged worked example: "…" matches any
// value, objects match when every key of want matches, arrays when got
// has at least want's elements and they match in order.
func match(want, got any, at string) error {
	if s, ok := want.(string); ok && s == "…" {
		return nil
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: got %v, want an object", at, got)
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s.%s: missing", at, k)
			}
			if err := match(wv, gv, at+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) < len(w) {
			return fmt.Errorf("%s: got %v, want an array of at least %d", at, got, len(w))
		}
		for i := range w {
			if err := match(w[i], g[i], fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
		return nil
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("%s: got %#v, want %#v", at, got, want)
		}
		return nil
	}
}

// matchText checks text against an abridged example whose "…" match any
// run of characters.
func matchText(want, got string) error {
	parts := strings.Split(want, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	re := regexp.MustCompile("(?s)^" + strings.Join(parts, ".*") + "$")
	if !re.MatchString(got) {
		return fmt.Errorf("got text\n%s\nwant it to match the example\n%s", got, want)
	}
	return nil
}
