// Package mcp serves Triad's tools to MCP clients, over stdio and streamable HTTP, through the one orchestration path.
//
// Every tool call goes to orchestrator exactly as an HTTP call
// does, so CEL.md, the evaluator and the trace cover MCP too. The tools'
// argument and answer types are the HTTP API's own types; their JSON
// schemas are inferred from them (see schemaFor). An MCP session is one
// run, unless a call's run_id argument names another.
package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	mcpauth "github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes/runner"
)

// Config configures a Server.
type Config struct {
	Orchestrator *orchestrator.Orchestrator
	// Recipes runs recipes; nil makes recipe_run answer not_configured.
	Recipes *runner.Runner
	Logger  *slog.Logger
	// SessionTimeout closes an HTTP session that has had no request for
	// this long (default 1 h; negative never). Its run, files and journal
	// stay; its kernel is reaped by the kernel manager's idle timer.
	SessionTimeout time.Duration
	// MaxImageBytes caps each image inlined as image content (default
	// 8 MiB); a larger image is only referenced, by path and sha256.
	MaxImageBytes int64
}

// Server is the MCP surface.
type Server struct {
	orch     *orchestrator.Orchestrator
	recipes  *runner.Runner
	log      *slog.Logger
	maxImage int64
	mcp      *sdk.Server
	http     *sdk.StreamableHTTPHandler

	mu     sync.Mutex
	anon   map[*sdk.ServerSession]runid.ID // runs of sessions without an id (stdio)
	closed bool
}

// instructions tell the client's model how the tools fit together.
const instructions = `Triad gives you three tools: a persistent Python sandbox (sandbox_exec), web search (browser_search) and run-scoped files (tmp_write, tmp_read, tmp_list, tmp_delete).
Everything you do in this MCP session is one run: the kernel keeps its variables between sandbox_exec calls, and files you write are in the cell's working directory. Pass run_id to work in another run instead.
After every call Triad appends a Step Block to the run's journal, CEL.md, with an evaluator's verdict; read it with journal_read and add a note with journal_note.
Failures come back as results with isError and a JSON body {"error":{"kind","message","suggestion"}}: follow the suggestion. A cell that raises also comes back with isError, with the full sandbox.exec answer (ok:false, error, traceback) as structured content.`

// New returns a Server with every tool registered.
func New(c Config) *Server {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = time.Hour
	}
	if c.MaxImageBytes == 0 {
		c.MaxImageBytes = 8 << 20
	}
	s := &Server{orch: c.Orchestrator, recipes: c.Recipes, log: c.Logger, maxImage: c.MaxImageBytes,
		anon: map[*sdk.ServerSession]runid.ID{}}
	s.mcp = sdk.NewServer(&sdk.Implementation{Name: "triad", Title: "Triad", Version: version.String()}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       c.Logger,
		// Tools only: the list never changes, and logging goes to the
		// server's own log, not to clients.
		Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}},
	})
	s.mcp.AddReceivingMiddleware(s.refusedArguments, s.startSession)
	s.addTools()
	timeout := c.SessionTimeout
	if timeout < 0 {
		timeout = 0
	}
	s.http = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.mcp }, &sdk.StreamableHTTPOptions{
		Logger:         c.Logger,
		SessionTimeout: timeout,
		// Inline file content is base64 inside JSON-RPC: allow the same
		// room as the HTTP API's JSON bodies.
		MaxRequestBodyBytes: s.maxBody(),
	})
	return s
}

func (s *Server) maxBody() int64 {
	return s.orch.Limits().JSONBody*4/3 + 64<<10
}

// Handler serves MCP over streamable HTTP; mount it at /mcp behind the
// HTTP API's authentication (api.Server.Mount), which puts the caller in
// the request's context. Each session (Mcp-Session-Id) is one run, bound
// to the key that opened it: a request for the session with another key
// is refused. A request that carries a key the API did not authenticate
// (the handler mounted without the API in front) is refused too.
func (s *Server) Handler() http.Handler {
	bearer := mcpauth.RequireBearerToken(func(ctx context.Context, _ string, r *http.Request) (*mcpauth.TokenInfo, error) {
		p := auth.From(r.Context())
		if p.IsOperator() {
			return nil, fmt.Errorf("%w: the key was not authenticated", mcpauth.ErrInvalidToken)
		}
		return &mcpauth.TokenInfo{UserID: p.KeyID, Scopes: scopeNames(p), Extra: map[string]any{principalKey: p}}, nil
	}, &mcpauth.RequireBearerTokenOptions{AllowMissingExpiration: true})(s.http)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ew := &errorBodies{ResponseWriter: w}
		defer ew.finish()
		if r.Header.Get("Authorization") == "" {
			// No key: the API let the request through as the operator (a
			// server with authentication off, or open on loopback).
			s.http.ServeHTTP(ew, r)
			return
		}
		bearer.ServeHTTP(ew, r)
	})
}

const principalKey = "triad/principal"

func scopeNames(p auth.Principal) []string {
	out := make([]string, 0, len(p.Scopes))
	for _, sc := range p.Scopes {
		out = append(out, string(sc))
	}
	return out
}

// principal is the caller of a tool call: the key that authenticated the
// HTTP request, or the operator (stdio, or a server without keys).
func principal(req *sdk.CallToolRequest) auth.Principal {
	if req != nil && req.Extra != nil && req.Extra.TokenInfo != nil {
		if p, ok := req.Extra.TokenInfo.Extra[principalKey].(auth.Principal); ok {
			return p
		}
	}
	return auth.Operator
}

// ServeStdio serves one MCP session over the process's stdin and stdout
// until the client closes stdin or ctx ends. The session is one fresh run.
// Nothing else may write to stdout meanwhile: it is the protocol channel.
func (s *Server) ServeStdio(ctx context.Context) error {
	return s.serve(ctx, &sdk.StdioTransport{MaxLineLength: int(s.maxBody())})
}

// ServeIO is ServeStdio over any pair of streams (newline-delimited
// JSON-RPC, as on stdio): r carries the client's messages, w the server's.
func (s *Server) ServeIO(ctx context.Context, r io.ReadCloser, w io.WriteCloser) error {
	return s.serve(ctx, &sdk.IOTransport{Reader: r, Writer: w, MaxLineLength: int(s.maxBody())})
}

func (s *Server) serve(ctx context.Context, t sdk.Transport) error {
	err := s.mcp.Run(ctx, t)
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		// The client hung up or we were told to stop: both are the
		// normal end of a stdio session.
		return nil
	}
	return err
}

// Close ends every open session, HTTP and stdio; their runs stay. It is
// safe to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for ss := range s.mcp.Sessions() {
		if err := ss.Close(); err != nil && !errors.Is(err, sdk.ErrConnectionClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startSession creates a session's run when the session starts
// (initialize), as a run of the caller who opened it, so that the run is
// that caller's tenant's before its id can be named anywhere
// (docs/DECISIONS.md, "One owner per run"). A run that cannot be created
// then (the runs-per-hour quota) is created at the session's first call,
// the way any fresh id is, and that call says why it cannot.
func (s *Server) startSession(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "initialize" {
			return res, err
		}
		ss, ok := req.GetSession().(*sdk.ServerSession)
		if !ok {
			return res, nil
		}
		p := auth.Operator
		if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil {
			if tp, ok := ex.TokenInfo.Extra[principalKey].(auth.Principal); ok {
				p = tp
			}
		}
		run := s.sessionRunOf(ss)
		if err := s.orch.Create(auth.With(context.WithoutCancel(ctx), p), run); err != nil {
			s.log.WarnContext(ctx, "create an MCP session's run; its first call will", "run", run, "err", err)
		}
		return res, nil
	}
}

// run resolves the run a call works in: the run_id argument when given,
// else the session's run.
func (s *Server) run(req *sdk.CallToolRequest, arg string) (runid.ID, error) {
	if arg != "" {
		id, err := runid.Parse(arg)
		if err != nil {
			fe := fault.As(err)
			return runid.ID{}, fault.Wrap(fe.Kind, err, "run_id: "+fe.Message,
				"omit run_id to work in this session's run, or send 1-64 characters from [A-Za-z0-9._-] starting with a letter or digit")
		}
		return id, nil
	}
	return s.sessionRunOf(req.Session), nil
}

// sessionRunOf is a session's run.
func (s *Server) sessionRunOf(ss *sdk.ServerSession) runid.ID {
	if id := ss.ID(); id != "" {
		return sessionRun(id)
	}
	// A session without an id is a stdio (or in-memory) connection: one
	// connection, one fresh run, for as long as it lasts.
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.anon[ss]; ok {
		return id
	}
	id := runid.Must("mcp-" + uuid.NewString())
	s.anon[ss] = id
	go func() {
		ss.Wait()
		s.mu.Lock()
		delete(s.anon, ss)
		s.mu.Unlock()
	}()
	s.log.Info("mcp session started", "run", id)
	return id
}

// sessionRun derives a session's run id from its Mcp-Session-Id: the same
// session always maps to the same run, distinct sessions to distinct runs.
// An id that is not already a short run-id-safe string is hashed rather
// than cut or rewritten, which could make two sessions collide.
func sessionRun(session string) runid.ID {
	if len(session) <= runid.MaxLen-len("mcp-") {
		if id, err := runid.Parse("mcp-" + session); err == nil {
			return id
		}
	}
	sum := sha256.Sum256([]byte(session))
	return runid.Must("mcp-" + hex.EncodeToString(sum[:16]))
}
