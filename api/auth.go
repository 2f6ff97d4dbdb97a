package api

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/internal/fault"
)

// authenticate is the middleware that names the caller: it reads the API
// key from Authorization: Bearer, puts the principal in the request's
// context for the core, and refuses a request whose key is missing,
// malformed, unknown or revoked (401 auth) or whose scope is short of the
// route's (403 forbidden). Public routes pass without a key.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := s.routeOf(r)
		need := auth.Read // a route added around the table still needs a key
		if rt != nil {
			need = rt.Scope
		}
		if need == Public {
			// A public route's handler acts for nobody: were it to call
			// the core, it would be refused.
			next.ServeHTTP(w, r.WithContext(auth.With(r.Context(), auth.Anonymous)))
			return
		}
		p, err := s.principal(r)
		if err == nil && !p.Has(need) {
			err = fault.New(fault.Forbidden, fmt.Sprintf("API key %s (scopes %v) does not have the %s scope %s %s needs", p.KeyID, p.Scopes, need, r.Method, r.URL.Path),
				fmt.Sprintf("use a key with the %s scope; an admin creates one with: triad keys create --name NAME --scope %s", need, need))
		}
		if err != nil {
			s.writeError(w, r, err, 0)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.With(r.Context(), p)))
	})
}

// principal authenticates a request.
func (s *Server) principal(r *http.Request) (auth.Principal, error) {
	if s.keys == nil {
		return auth.Operator, nil // --auth none
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		if s.open {
			any, err := s.keys.Any(r.Context())
			if err != nil {
				return auth.Principal{}, err
			}
			if !any {
				return auth.Operator, nil
			}
		}
		return auth.Principal{}, keys.Missing()
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return auth.Principal{}, fault.New(fault.Auth, "the Authorization header is not Bearer <key>",
			"send Authorization: Bearer trd_<id>_<secret>")
	}
	return s.keys.Authenticate(r.Context(), strings.TrimSpace(tok))
}

// secure sets the security headers every answer carries. API answers are
// JSON that no browser should render, sniff or frame; downloads (files,
// share links) may be HTML a run produced, which the CSP's sandbox keeps
// from running scripts with this origin's rights.
func secure(h http.Header, tls bool) {
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'; sandbox")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if tls {
		h.Set("Strict-Transport-Security", "max-age=31536000; includeSubDomains")
	}
}

type matchedKey struct{}

// matched carries the route a request matched back out of the router, to
// ServeHTTP, which reports the request when it is done.
type matched struct{ path string }

// instrument notes the matched route's template for ServeHTTP.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m, ok := r.Context().Value(matchedKey{}).(*matched); ok {
			if rt := s.routeOf(r); rt != nil {
				m.path = rt.Path
			}
		}
		next.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status; it keeps Flush (server-sent events,
// MCP streams) and Unwrap (http.ResponseController).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps the connection's own ReadFrom reachable, so a file
// served with http.ServeContent still goes out by sendfile.
func (w *statusWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, src)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
