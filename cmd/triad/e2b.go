package main

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/seal"
)

// openE2B starts the E2B surface over the stack. Its control plane takes
// E2B's X-API-Key as Triad's API takes a Bearer key: a Triad key acts as
// its principal (the sandbox is its tenant's); the operator's own
// --e2b-api-key acts as the operator; and a server that runs open (--auth
// none, or loopback before the first key exists) with no --e2b-api-key
// takes any key as the operator.
func openE2B(ctx context.Context, c *config, st *stack, ks *keys.Store, open bool, log *slog.Logger) (*e2b.Server, error) {
	ec, err := e2bRecords(ctx, c, st, log)
	if err != nil {
		return nil, err
	}
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
	ec.Authorize, ec.DefaultTimeout, ec.MaxTimeout = authorize, c.E2B.DefaultTimeout, c.E2B.MaxTimeout
	ec.Limits, ec.Body, ec.Domain = c.Sandbox.limits(), c.body(), c.E2B.Domain
	return e2b.New(ctx, ec)
}

// e2bRecords is where the E2B surface keeps its records: in the store's
// records outside runs, the envs sealed, with the records Triad kept in a
// reserved run before issue 23 to move there once.
func e2bRecords(ctx context.Context, c *config, st *stack, log *slog.Logger) (e2b.Config, error) {
	sealer, err := seal.Open(ctx, st.store.Meta(), seal.Config{Secret: []byte(c.SealSecret)})
	if err != nil {
		return e2b.Config{}, err
	}
	return e2b.Config{Core: st.orch, Records: metarecords.New(st.store.Meta()), Sealer: sealer, Legacy: tmpfsrecords.New(st.store),
		Logger: log.With("surface", "e2b")}, nil
}
