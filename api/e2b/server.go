package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/triadhq/triad/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/seal"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// Headers the SDKs send to the data plane (docs/e2b-protocol.md §1, §2).
const (
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
	HeaderAccessToken = "X-Access-Token"
	// HeaderTrafficToken carries the sandbox's token on the code
	// interpreter's context calls, which send no X-Access-Token.
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
	HeaderAPIKey       = "X-Api-Key"
)

// The in-sandbox ports the data plane serves.
const (
	EnvdPort        = "49983"
	InterpreterPort = "49999"
)

// EnvdVersion is the envd version the control plane reports. It gates
// features in the SDKs (docs/e2b-protocol.md §5): 0.6.4 turns on streamed
// octet-stream uploads, recursive watches, entries in watch events (0.6.3)
// and watches with allowNetworkMounts (0.6.4, which Triad serves as any
// watch: a run's files are on no network mount) and file metadata (0.6.2,
// X-Metadata-* headers on files.write, kept as filemeta.go says).
const EnvdVersion = "0.6.4"

// Config configures a Server.
type Config struct {
	Core Core
	// Records persists sandbox records; nil keeps them in memory only.
	Records Records
	// Sealer seals the envs records keep; nil seals them under a key drawn
	// for this process, which suits records kept in memory only.
	Sealer Sealer
	// Legacy, when set, holds records as Triad kept them before they moved
	// out of the runs; New moves them into Records (see migrate).
	Legacy Legacy
	// APIKey is the X-API-Key the control plane demands; empty leaves it
	// open, as Triad's own API is on loopback. The SDKs insist on sending
	// some key, so an open server accepts any. Used when Authorize is nil.
	APIKey string
	// Authorize, when set, decides who a control-plane request is from
	// (its X-API-Key: a Triad key, or the operator's --e2b-api-key) and
	// whether it may go on. The sandbox then belongs to that principal's
	// tenant, and its data plane acts as that principal.
	Authorize func(r *http.Request) (auth.Principal, bool)
	// DefaultTimeout is a sandbox's lifetime when create names none (300 s).
	DefaultTimeout time.Duration
	// MaxTimeout caps the lifetime create, connect and setTimeout may ask
	// for; 0 means no cap.
	MaxTimeout time.Duration
	// ExpiryInterval is how often sandboxes past their end are paused (1 s).
	ExpiryInterval time.Duration
	// Limits are the kernels' limits (--memory, --cpus, --disk), which
	// getInfo and list report as cpuCount, memoryMB and diskSizeMB.
	Limits sandbox.Limits
	// WatchInterval is how often a files.watchDir watcher looks at the
	// sandbox's files (200 ms).
	WatchInterval time.Duration
	// Domain is what getHost(port) builds <port>-<sandboxID>.<domain>
	// under (create's domain): a wildcard name that reaches this
	// listener. Empty means the request's own host, 127.0.0.1 and ::1
	// named localhost (browsers and curl resolve *.localhost to loopback).
	Domain string
	// Body sets the deadlines an upload's body is read under (its
	// progress and its whole; see internal/bodyread).
	Body   bodyread.Config
	Logger *slog.Logger
}

// Server is the E2B surface.
type Server struct {
	c     Config
	log   *slog.Logger
	reg   *registry
	ctl   http.Handler
	data  http.Handler
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	procs *processes
	watch *watchers
}

// New returns a Server and starts its expiry loop; Close stops it.
func New(ctx context.Context, c Config) (*Server, error) {
	if c.Core == nil {
		return nil, errors.New("e2b: Config.Core is required")
	}
	if c.Records == nil {
		c.Records = &MemRecords{}
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = 300 * time.Second
	}
	if c.MaxTimeout > 0 && c.DefaultTimeout > c.MaxTimeout {
		c.DefaultTimeout = c.MaxTimeout
	}
	if c.WatchInterval <= 0 {
		c.WatchInterval = 200 * time.Millisecond
	}
	if c.ExpiryInterval <= 0 {
		c.ExpiryInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Sealer == nil {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		s, err := seal.New(key)
		if err != nil {
			return nil, err
		}
		c.Sealer = s
	}
	if c.Legacy != nil {
		if err := migrate(ctx, c); err != nil {
			return nil, err
		}
	}
	reg, err := newRegistry(ctx, c.Records, c.Sealer, c.Logger)
	if err != nil {
		return nil, err
	}
	s := &Server{c: c, log: c.Logger, reg: reg, stop: make(chan struct{}), done: make(chan struct{}), procs: newProcesses(), watch: newWatchers()}
	s.ctl = s.controlRoutes()
	s.data = s.dataRoutes()
	go s.expire()
	return s, nil
}

// Close stops the expiry loop and every watcher. It is safe to call twice.
func (s *Server) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	s.watch.close()
	return nil
}

// Handler serves the E2B routes and hands every other request to next:
// requests naming a sandbox in E2b-Sandbox-Id are data plane, /sandboxes
// and /v2/sandboxes are control plane, the rest is Triad's own API.
func (s *Server) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if port, id, ok := portHost(r.Host); ok {
			s.servePortHost(w, r, port, id)
			return
		}
		switch {
		case r.Header.Get(HeaderSandboxID) != "", isSigned(r):
			// A signed files URL names no sandbox: its signature
			// does (signing.go).
			s.data.ServeHTTP(w, r)
		case isControlPath(r):
			s.ctl.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func isControlPath(r *http.Request) bool {
	p := r.URL.Path
	for _, pre := range []string{"/sandboxes", "/v2/sandboxes", "/snapshots"} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	// deleteSnapshot: E2B deletes a snapshot as a template. Triad's own
	// API has no DELETE there, and sends Authorization, not X-API-Key.
	return r.Method == http.MethodDelete && strings.HasPrefix(p, "/templates/") && r.Header.Get(HeaderAPIKey) != ""
}

// expire pauses sandboxes past their end: their kernels stop, their files
// stay.
func (s *Server) expire() {
	defer close(s.done)
	t := time.NewTicker(s.c.ExpiryInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			for _, id := range s.reg.expired(now) {
				s.pause(context.Background(), id, now)
			}
		}
	}
}

// pause stops a sandbox's kernel and marks it paused, if it is still
// running and past its end at now.
func (s *Server) pause(ctx context.Context, id runid.ID, now time.Time) {
	errSkip := errors.New("skip")
	_, err := s.reg.update(ctx, id, func(sb *Sandbox) error {
		if sb.State != StateRunning || sb.EndAt.After(now) {
			return errSkip
		}
		sb.State = StatePaused
		return nil
	})
	if errors.Is(err, errSkip) || errors.Is(err, ErrNoRecord) {
		return
	}
	if err != nil {
		s.log.ErrorContext(ctx, "pause sandbox past its timeout", "sandbox", id, "err", err)
		return
	}
	s.procs.killAll(id)
	s.watch.endAll(id, errSandboxGone(id, "paused after its timeout"))
	if err := s.c.Core.Stop(ctx, id); err != nil {
		s.log.ErrorContext(ctx, "stop kernel of paused sandbox", "sandbox", id, "err", err)
	}
	s.log.InfoContext(ctx, "sandbox paused after its timeout; its files stay", "sandbox", id)
}

// handlerFunc is a handler that returns its error for writeError.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle adapts a handlerFunc: errors are written by writeError, the one
// place that turns them into E2B answers, and a panic becomes a 500 that
// keeps the server up.
func (s *Server) handle(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "panic in E2B handler", "path", r.URL.Path, "panic", fmt.Sprint(v))
				s.writeError(w, r, fault.New(fault.Internal, "the server hit a bug handling this request", "retry; if it persists, report it with the server log"), 0)
			}
		}()
		if err := h(w, r); err != nil {
			s.writeError(w, r, err, 0)
		}
	})
}

// methods dispatches on the request method, so that a wrong one gets a
// structured 405 instead of the mux's plain text.
func (s *Server) methods(m map[string]handlerFunc) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		if h, ok := m[r.Method]; ok {
			return h(w, r)
		}
		allowed := make([]string, 0, len(m))
		for k := range m {
			allowed = append(allowed, k)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		return statusError{http.StatusMethodNotAllowed, fault.New(fault.BadInput,
			fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path), "see docs/e2b-protocol.md for the methods E2B's SDKs use")}
	})
}

// statusError carries a status that differs from the kind's usual one.
type statusError struct {
	status int
	err    *fault.Error
}

func (e statusError) Error() string { return e.err.Error() }
func (e statusError) Unwrap() error { return e.err }

// errorBody is the JSON of every error answer outside the Connect services:
// E2B's {code, message}, which the SDKs read (docs/e2b-protocol.md §3),
// beside Triad's {error: {kind, message, suggestion}}.
type errorBody struct {
	Code    int         `json:"code"`
	Message string      `json:"message"`
	Error   errorDetail `json:"error"`
}

type errorDetail struct {
	Kind       fault.Kind `json:"kind"`
	Message    string     `json:"message"`
	Suggestion string     `json:"suggestion"`
}

// writeError writes err as an errorBody. status 0 derives the status from
// the error.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error, status int) {
	fe, st := classify(err)
	if status == 0 {
		status = st
	}
	lvl := slog.LevelInfo
	if status >= 500 && status != http.StatusBadGateway && status != http.StatusNotImplemented {
		lvl = slog.LevelError
	}
	s.log.Log(r.Context(), lvl, "E2B request failed", "method", r.Method, "path", r.URL.Path, "status", status, "kind", fe.Kind, "err", err)
	writeJSON(w, status, errorBody{Code: status, Message: sdkMessage(fe),
		Error: errorDetail{Kind: fe.Kind, Message: fe.Message, Suggestion: fe.Suggestion}})
}

// classify turns any error into a fault and the status it is answered with.
func classify(err error) (*fault.Error, int) {
	var se statusError
	if errors.As(err, &se) {
		return se.err, se.status
	}
	var mbe *http.MaxBytesError
	fe := fault.As(err)
	switch {
	case fe != nil:
	case errors.As(err, &mbe):
		fe = fault.Wrap(fault.TooLarge, err, fmt.Sprintf("the request body is over the %d-byte limit", mbe.Limit), "send less per call")
	case errors.Is(err, context.Canceled):
		fe = fault.Wrap(fault.Timeout, err, "the request was cancelled", "retry the call")
	default:
		fe = fault.Wrap(fault.Internal, err, "internal error", "retry; if it persists, report it with the server log")
	}
	if fe.Kind == fault.BodyTimeout {
		// E2B's spec documents 400, not 408, for an upload it refuses.
		return fe, http.StatusBadRequest
	}
	return fe, fault.Status(fe.Kind)
}

// sdkMessage is the message the SDKs show in their exception: Triad's
// message and what to do about it.
func sdkMessage(fe *fault.Error) string {
	if fe.Suggestion == "" {
		return fe.Message
	}
	return fe.Message + " (" + fe.Suggestion + ")"
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// authorize decides who a control-plane request is from: Config.Authorize,
// or by default the operator when the X-API-Key matches Config.APIKey (or
// none is configured).
func (s *Server) authorize(r *http.Request) (auth.Principal, bool) {
	if s.c.Authorize != nil {
		return s.c.Authorize(r)
	}
	if s.c.APIKey == "" {
		return auth.Operator, true
	}
	return auth.Operator, subtle.ConstantTimeCompare([]byte(r.Header.Get(HeaderAPIKey)), []byte(s.c.APIKey)) == 1
}

// visible reports whether the caller may see sandbox sb: the core, which
// owns the sandbox's run, decides (its own tenant's, or any for an admin).
func (s *Server) visible(ctx context.Context, sb Sandbox) bool {
	return s.c.Core.Visible(ctx, sb.ID) == nil
}

func authError(what string) statusError {
	return statusError{http.StatusUnauthorized, fault.New(fault.Auth, what,
		"set E2B_API_KEY to the key triad serve was started with (--e2b-api-key, TRIAD_E2B_API_KEY)")}
}

// connectPath reports whether p is a Connect method of envd's services.
func connectPath(p string) bool {
	return strings.HasPrefix(p, "/"+filesystemconnect.FilesystemName+"/") || strings.HasPrefix(p, "/"+processconnect.ProcessName+"/")
}

// writeConnectError answers a Connect request the middleware refused
// before the service saw it: a unary call reads the JSON error body, a
// streaming one the status (docs/e2b-protocol.md §3).
func (s *Server) writeConnectError(w http.ResponseWriter, r *http.Request, err error) {
	fe, status := classify(err)
	code := connectCode(fe.Kind)
	switch status {
	case http.StatusUnauthorized:
		code = connect.CodeUnauthenticated
	case http.StatusBadGateway:
		code = connect.CodeUnavailable
	}
	s.log.InfoContext(r.Context(), "E2B Connect request refused", "path", r.URL.Path, "status", status, "code", code.String(), "err", err)
	writeJSON(w, status, map[string]string{"code": code.String(), "message": sdkMessage(fe)})
}

// recoverInterceptor turns a panic in a Connect handler into an internal
// error that keeps the server up, as handle does for the REST routes.
func recoverInterceptor(s *Server) connect.Interceptor {
	return &recoverer{s: s}
}

type recoverer struct{ s *Server }

func (rc *recoverer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (res connect.AnyResponse, err error) {
		defer rc.recover(ctx, req.Spec().Procedure, &err)
		return next(ctx, req)
	}
}

func (rc *recoverer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (rc *recoverer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) (err error) {
		defer rc.recover(ctx, conn.Spec().Procedure, &err)
		return next(ctx, conn)
	}
}

func (rc *recoverer) recover(ctx context.Context, procedure string, err *error) {
	if v := recover(); v != nil {
		if v == http.ErrAbortHandler {
			panic(v)
		}
		rc.s.log.ErrorContext(ctx, "panic in E2B Connect handler", "procedure", procedure, "panic", fmt.Sprint(v))
		*err = connect.NewError(connect.CodeInternal, errors.New("the server hit a bug handling this request (retry; if it persists, report it with the server log)"))
	}
}

func nowUTC() time.Time { return time.Now().UTC() }

// listed is the file a write reported, as a listing would show it.
func listed(ref wire.FileRef) wire.FileInfo {
	return wire.FileInfo{FileRef: ref, ModifiedAt: nowUTC()}
}
