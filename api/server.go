// Package api serves Triad's tools over HTTP: thin handlers over the orchestrator, with one place that writes errors.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

// RunHeader is the header that selects the run, as the spec's implicit
// run/session id.
const RunHeader = "X-Run-Id"

// Server is the HTTP surface.
type Server struct {
	orch   *orchestrator.Orchestrator
	runner *runner.Runner
	log    *slog.Logger
	router *mux.Router
}

// Config configures a Server.
type Config struct {
	Orchestrator *orchestrator.Orchestrator
	// Runner runs recipes (POST /run); nil answers not_configured.
	Runner *runner.Runner
	Logger *slog.Logger
}

// New returns a Server with every route registered.
func New(c Config) *Server {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{orch: c.Orchestrator, runner: c.Runner, log: c.Logger}
	r := mux.NewRouter()
	// Paths are validated, not cleaned: "/tmp/files/../x" must be refused
	// with a structured 400, not redirected somewhere else.
	r.SkipClean(true)
	r.UseEncodedPath()
	r.NotFoundHandler = s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return fault.New(fault.NotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path),
			"see the API section of the README for the endpoints")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &fault.Error{Kind: fault.BadInput,
			Message:    fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path),
			Suggestion: "see the API section of the README for the methods each endpoint takes"}, http.StatusMethodNotAllowed)
	})
	s.router = r

	r.Handle("/healthz", s.handle(s.healthz)).Methods(http.MethodGet, http.MethodHead)
	r.Handle("/version", s.handle(s.version)).Methods(http.MethodGet)
	r.Handle("/runs", s.handle(s.newRun)).Methods(http.MethodPost)
	r.Handle("/runs/{id}", s.handle(s.runGet)).Methods(http.MethodGet)
	r.Handle("/runs/{id}/events", s.handle(s.runEvents)).Methods(http.MethodGet)
	r.Handle("/run", s.handle(s.postRun)).Methods(http.MethodPost)
	r.Handle("/recipes", s.handle(s.recipesList)).Methods(http.MethodGet)
	r.Handle("/recipes/{name}", s.handle(s.recipeGet)).Methods(http.MethodGet)

	r.Handle("/cel", s.handle(s.celGet)).Methods(http.MethodGet)
	r.Handle("/cel/note", s.handle(s.celNote)).Methods(http.MethodPost)
	r.Handle("/cel/finalize", s.handle(s.celFinalize)).Methods(http.MethodPost)

	r.Handle("/tmp/write", s.handle(jsonTool(s, s.orch.Write))).Methods(http.MethodPost)
	r.Handle("/tmp/read", s.handle(queryTool(s, "path", true, s.orch.Read))).Methods(http.MethodGet)
	r.Handle("/tmp/list", s.handle(queryTool(s, "prefix", false, s.orch.List))).Methods(http.MethodGet)
	r.Handle("/tmp/delete", s.handle(jsonTool(s, func(ctx context.Context, id runid.ID, in wire.PathRequest) (wire.OK, error) {
		return s.orch.Delete(ctx, id, in.Path)
	}))).Methods(http.MethodPost)
	r.Handle("/tmp/files/{path:.+}", s.handle(s.filePut)).Methods(http.MethodPut)
	r.Handle("/tmp/files/{path:.+}", s.handle(s.fileGet)).Methods(http.MethodGet, http.MethodHead)
	r.Handle("/blobs/{sha256}", s.handle(s.blobGet)).Methods(http.MethodGet, http.MethodHead)

	r.Handle("/browser/search", s.handle(s.browserSearch)).Methods(http.MethodPost)
	r.Handle("/sandbox/exec", s.handle(jsonTool(s, s.orch.Exec))).Methods(http.MethodPost)
	r.Handle("/sandbox/restart", s.handle(s.sandboxRestart)).Methods(http.MethodPost)
	return s
}

// Router exposes the router so later surfaces (MCP at /mcp) mount beside the tools.
func (s *Server) Router() *mux.Router { return s.router }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

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
	body := wire.Error(err)
	if status == 0 {
		status = fault.Status(body.Error.Kind)
	}
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	s.log.Log(r.Context(), lvl, "request failed", "method", r.Method, "path", r.URL.Path, "status", status, "kind", body.Error.Kind, "err", err)
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// decode reads a strict JSON body: bounded, no unknown fields, one value.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	limit := s.orch.Limits().JSONBody
	// Inline content is base64 in JSON: allow for its 4/3 growth.
	body := http.MaxBytesReader(w, r.Body, limit*4/3+64<<10)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return fault.New(fault.BadInput, "the request body is empty", "send a JSON object; see the README's API section")
		}
		return fault.Wrap(fault.BadInput, err, "the request body is not valid JSON for this endpoint: "+err.Error(),
			"send a JSON object with the documented fields; see the README's API section")
	}
	if dec.More() {
		return fault.New(fault.BadInput, "the request body has data after the JSON object", "send exactly one JSON object")
	}
	return nil
}

// run reads and validates the X-Run-Id header.
func run(r *http.Request) (runid.ID, error) {
	return runid.Parse(r.Header.Get(RunHeader))
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.orch.Store().Ping(ctx); err != nil {
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
// recorded citations (its own, or copied from another run).
func (s *Server) newRun(w http.ResponseWriter, r *http.Request) error {
	var in wire.NewRunRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &in); err != nil {
			return err
		}
	}
	id := runid.New()
	replay := in.Replay != nil && *in.Replay
	if in.ReplayFrom != "" {
		src, err := runid.Parse(in.ReplayFrom)
		if err != nil {
			return err
		}
		if err := s.orch.ReplayFrom(r.Context(), id, src); err != nil {
			return err
		}
		replay = true
	} else if replay {
		s.orch.SetReplay(id, true)
	}
	return writeJSON(w, http.StatusCreated, wire.NewRunResponse{RunID: id.String(), Replay: replay})
}
