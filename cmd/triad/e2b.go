package main

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
)

// openE2B starts the E2B surface over the stack. Its control plane takes
// E2B's X-API-Key as Triad's API takes a Bearer key: a Triad key acts as
// its principal (the sandbox is its tenant's); the operator's own
// --e2b-api-key acts as the operator; and a server that runs open (--auth
// none, or loopback before the first key exists) with no --e2b-api-key
// takes any key as the operator.
func openE2B(ctx context.Context, c *config, st *stack, ks *keys.Store, open bool, log *slog.Logger) (*e2b.Server, error) {
	authorize := func(r *http.Request) (auth.Principal, bool) {
		key := r.Header.Get(e2b.HeaderAPIKey)
		if c.E2B.APIKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(c.E2B.APIKey)) == 1 {
			return auth.Operator, true
		}
		if ks == nil { // --auth none
			return auth.Operator, c.E2B.APIKey == ""
		}
		if strings.HasPrefix(key, "trd_") {
			p, err := ks.Authenticate(r.Context(), key)
			return p, err == nil && p.Has(auth.Runs)
		}
		if open && c.E2B.APIKey == "" {
			any, err := ks.Any(r.Context())
			return auth.Operator, err == nil && !any
		}
		return auth.Principal{}, false
	}
	if c.E2B.APIKey == "" && (ks == nil || open) {
		log.Warn("the E2B surface takes any X-API-Key while the server runs without keys: set --e2b-api-key (TRIAD_E2B_API_KEY) or create a Triad key")
	}
	return e2b.New(ctx, e2b.Config{
		Core: st.orch, Records: tmpfsrecords.New(st.store),
		Authorize: authorize, DefaultTimeout: c.E2B.DefaultTimeout, MaxTimeout: c.E2B.MaxTimeout, Limits: c.Sandbox.limits(),
		Body: c.body(), Logger: log.With("surface", "e2b"),
	})
}
