// Package api serves Triad's tools over HTTP: thin handlers over the orchestrator, with one place that writes errors.
package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

// RunHeader is the header that selects the run, as the spec's implicit
// run/session id.
const RunHeader = "X-Run-Id"

// Core is what the HTTP surface calls of the orchestrator: every tool,
// through the one orchestration path; runs, created for the caller and
// read with the access checks of every read; and what a replay and a run
// view call (replay.Core, runner.View). *orchestrator.Orchestrator
// implements it.
type Core interface {
	replay.Core
	ExecStream(ctx context.Context, run runid.ID, in wire.ExecRequest, on func(orchestrator.ExecEvent), opts ...orchestrator.CallOption) (wire.ExecResponse, error)
	Status(ctx context.Context, run runid.ID) (wire.RunView, error)
	// Snapshot and Fork: a run's files kept by reference as a read-only
	// snapshot, and a new run made from a run or a snapshot.
	Snapshot(ctx context.Context, run runid.ID, in wire.SnapshotRequest) (wire.Snapshot, error)
	Fork(ctx context.Context, from, into runid.ID) (wire.Fork, error)
	Subscribe(ctx context.Context, run runid.ID) (<-chan orchestrator.Update, func(), error)
	Runs(ctx context.Context, q orchestrator.RunsQuery) (wire.RunList, error)
	// SetLabels names and tags a run (PATCH /runs/{id}).
	SetLabels(ctx context.Context, run runid.ID, in wire.RunLabels) (wire.RunSummary, error)
	// DeleteRun deletes a run (DELETE /runs/{id}).
	DeleteRun(ctx context.Context, run runid.ID) error
	// TenantUsage is what a tenant's runs used and store (GET /usage).
	TenantUsage(ctx context.Context, tenant string) (wire.TenantUsage, error)
	Limits() orchestrator.Limits
	Ping(ctx context.Context) error
	// CheckSetup checks a run's setup before the run is made (POST /runs).
	CheckSetup(ctx context.Context, run runid.ID, s wire.RunSetup) error
	// Offer is what the sandbox offers runs: GET /templates and the
	// OpenAPI document state it.
	Offer() orchestrator.Offer
	// Kernels lists the caller's live kernels and its kernel quota's use
	// (GET /kernels); KernelAction interrupts, restarts or stops one.
	Kernels(ctx context.Context) (wire.KernelList, error)
	KernelAction(ctx context.Context, run runid.ID, action string) (wire.KernelAction, error)
}

var _ Core = (*orchestrator.Orchestrator)(nil)

// Server is the HTTP surface.
type Server struct {
	orch    Core
	runner  *runner.Runner
	log     *slog.Logger
	router  *mux.Router
	keys    *keys.Store
	open    bool
	shares  *share.Links
	c       Config
	routes  []*route
	byRoute map[*mux.Route]*route
	doc     docCache

	closing   chan struct{} // closed by Close: event streams end
	closeOnce sync.Once
}

// Config configures a Server.
type Config struct {
	Orchestrator Core
	// Runner runs recipes (POST /run); nil answers not_configured.
	Runner *runner.Runner
	Logger *slog.Logger
	// Keys authenticates callers by their API keys. Nil turns
	// authentication off (--auth none): every request is the operator.
	Keys *keys.Store
	// OpenWithoutKeys serves requests that carry no key as the operator
	// while no key exists at all (a server on loopback before its first
	// key). Once a key exists, every request needs one.
	OpenWithoutKeys bool
	// Shares makes and checks share links; nil answers not_configured.
	Shares *share.Links
	// ShareTTL is a share link's lifetime when the request names none
	// (default 24 h); MaxShareTTL the longest allowed (default 30 days).
	ShareTTL, MaxShareTTL time.Duration
	// PublicURL is the server's address as callers reach it (for share
	// links), e.g. https://triad.example.com; empty uses the request's.
	PublicURL string
	// TLS says the server is reached over HTTPS: answers carry HSTS.
	TLS bool
	// Metrics receives each request's route, status and latency.
	Metrics Metrics
	// MetricsHandler serves GET /metrics when set (nil: /metrics is on
	// its own listener, or off). MetricsNeedKey makes it need an admin
	// key; by default it needs none.
	MetricsHandler http.Handler
	MetricsNeedKey bool
	// Body sets the deadlines a request body is read under (its progress
	// and its whole; see internal/bodyread); the zero value has none.
	Body bodyread.Config
	// Sessions resolves the web console's session cookies: a signed-in
	// browser calls the API as its key's principal, with a CSRF token on
	// every state-changing request. Nil accepts no cookie.
	Sessions *session.Store
}

// Metrics receives one finished request: its route template (never the
// path itself, which may hold run ids and file names), method, status and
// latency.
type Metrics interface {
	Request(route, method string, status int, d time.Duration)
}

// New returns a Server with every route registered.
func New(c Config) *Server {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ShareTTL <= 0 {
		c.ShareTTL = 24 * time.Hour
	}
	if c.MaxShareTTL <= 0 {
		c.MaxShareTTL = 30 * 24 * time.Hour
	}
	s := &Server{orch: c.Orchestrator, runner: c.Runner, log: c.Logger, keys: c.Keys, open: c.OpenWithoutKeys,
		shares: c.Shares, c: c, byRoute: map[*mux.Route]*route{}, closing: make(chan struct{})}
	r := mux.NewRouter()
	// Paths are validated, not cleaned: "/tmp/files/../x" must be refused
	// with a structured 400, not redirected somewhere else.
	r.SkipClean(true)
	r.UseEncodedPath()
	r.NotFoundHandler = s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return fault.New(fault.NotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path),
			"see docs/api.md for the endpoints, or GET /openapi.json")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allow := s.allowed(r)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, fault.New(fault.MethodNotAllowed,
			fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path),
			fmt.Sprintf("use %s; GET /openapi.json lists each endpoint's methods", strings.Join(allow, " or "))), 0)
	})
	r.Use(s.instrument, s.authenticate)
	s.router = r
	for _, rt := range s.table() {
		s.add(rt)
	}
	return s
}

// Close ends the open event streams (GET /runs/{id}/events), which
// otherwise follow a run until the client leaves, so that a server
// shutting down need not wait for them. Call it before http.Server's
// Shutdown; it is safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	return nil
}

// Router exposes the router so later surfaces (MCP at /mcp) mount beside
// the tools; prefer Mount, which also documents the route.
func (s *Server) Router() *mux.Router { return s.router }

// Mount serves h at path for every method, behind the same
// authentication as the rest of the API (a key with at least the read
// scope; the surface checks finer scopes per call), and documents it.
func (s *Server) Mount(path, summary string, h http.Handler) {
	s.add(&route{Methods: []string{http.MethodGet, http.MethodPost, http.MethodDelete}, Path: path, Scope: auth.Read,
		Summary: summary, raw: h, Mounted: true})
}

// ServeHTTP implements http.Handler: every answer, errors and unknown
// routes included, carries the security headers.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secure(w.Header(), s.c.TLS)
	if s.c.Metrics == nil {
		s.router.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	m := &matched{path: "unmatched"}
	sw := &statusWriter{ResponseWriter: w}
	s.router.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), matchedKey{}, m)))
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	s.c.Metrics.Request(m.path, r.Method, sw.status, time.Since(start))
}

// handlerFunc is a handler that returns its error instead of writing it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle adapts a handlerFunc: errors are written by writeError, the one
// place that turns errors into HTTP answers, and panics become a 500 that
// keeps the server up.
func (s *Server) handle(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic in handler", "path", r.URL.Path, "panic", fmt.Sprint(v))
				s.writeError(w, r, fault.New(fault.Internal, "the server hit a bug handling this request", "retry; if it persists, report it with the server log"), 0)
			}
		}()
		if err := h(w, r); err != nil {
			s.writeError(w, r, err, 0)
		}
	})
}

// writeError writes err as {"error":{kind,message,suggestion}} (wire.Error)
// and logs it. status 0 derives the status from the kind.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error, status int) {
	body, status := s.logError(r, err, status)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="triad"`)
	}
	writeJSON(w, status, body)
}

// logError logs a failed request and returns its body and status (0
// derives the status from the kind): the one place errors are logged, for
// plain answers and for streams that end in an error event.
func (s *Server) logError(r *http.Request, err error, status int) (wire.ErrorBody, int) {
	body := wire.Error(err)
	if status == 0 {
		status = fault.Status(body.Error.Kind)
	}
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	s.log.Log(r.Context(), lvl, "request failed", "method", r.Method, "path", r.URL.Path, "status", status, "kind", body.Error.Kind, "err", err)
	return body, status
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	return writeJSONAs(w, status, "application/json", v)
}

func writeJSONAs(w http.ResponseWriter, status int, mediaType string, v any) error {
	w.Header().Set("Content-Type", mediaType)
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// run reads and validates the X-Run-Id header.
func run(r *http.Request) (runid.ID, error) {
	return runid.Parse(r.Header.Get(RunHeader))
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.orch.Ping(ctx); err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the file store does not answer",
			"check the store: the data directory for --store local, or the S3 endpoint and credentials for --store s3")
	}
	return writeJSON(w, http.StatusOK, wire.Health{Status: "ok", Store: "ok"})
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, wire.Version{Version: version.String()})
}

// newRun mints a run id. The optional body {"replay": true} or
// {"replay_from": "<run id>"} makes the run answer its searches from
// recorded citations (its own, or copied from another run); {"seed": n,
// "as_of": "YYYY-MM-DD"} sets up its kernel (recorded in run.setup.json).
func (s *Server) newRun(w http.ResponseWriter, r *http.Request) error {
	var in wire.NewRunRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	id := runid.New()
	setup, setUp := in.Setup()
	// A refused setup leaves no run behind: it is checked before the run
	// is created.
	if setUp {
		if err := s.orch.CheckSetup(r.Context(), id, setup); err != nil {
			return err
		}
	}
	var opts []orchestrator.RunOption
	if in.ReplayFrom != "" {
		src, err := runid.Parse(in.ReplayFrom)
		if err != nil {
			return err
		}
		opts = append(opts, orchestrator.CopySearches(src))
	} else if in.Replay != nil && *in.Replay {
		opts = append(opts, orchestrator.ReplaySearches(runid.ID{}))
	}
	if err := s.orch.Create(r.Context(), id, opts...); err != nil {
		return err
	}
	out := wire.NewRunResponse{RunID: id.String(), Replay: len(opts) > 0}
	if setUp {
		st, err := s.orch.SetRunSetup(r.Context(), id, setup)
		if err != nil {
			return err
		}
		out.Seed, out.AsOf, out.Template, out.Egress = st.Seed, st.AsOf, st.Template, st.Egress
	}
	return writeJSON(w, http.StatusCreated, out)
}

// templatesList is GET /templates.
func (s *Server) templatesList(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, wire.TemplateList{Templates: s.orch.Offer().Templates})
}
