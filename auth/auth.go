// Package auth names who is calling: a Principal (key id, tenant, scopes) that a surface authenticates and the core reads from the context.
//
// It is a leaf: surfaces (api, api/mcp) put the caller in the context with
// With, and the orchestration path reads it with From to decide which runs
// the caller may see and to record who made each call. The keys
// themselves live in auth/keys, share links in auth/share.
package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Scope is what a key may do. Scopes nest: admin includes runs, and runs
// includes read.
type Scope string

// The scopes.
const (
	// Read allows reading a tenant's runs: tmp.read and tmp.list, the
	// journal, run views and listings, downloads.
	Read Scope = "read"
	// Runs allows everything Read does plus the tools and recipes that
	// change runs: sandbox.exec, browser.search, tmp.write and tmp.delete,
	// notes, recipe runs, share links.
	Runs Scope = "runs"
	// Admin allows everything, across every tenant, and managing keys.
	Admin Scope = "admin"
)

// Scopes lists every scope, weakest first.
var Scopes = []Scope{Read, Runs, Admin}

func rank(s Scope) int { return slices.Index(Scopes, s) }

// DefaultTenant is the tenant of keys created without one, and of runs
// made before keys existed or with authentication off.
const DefaultTenant = "default"

// Principal is an authenticated caller.
type Principal struct {
	// KeyID is the API key's public id; empty for the operator (a server
	// with authentication off, MCP over stdio, the CLI). Never the secret.
	KeyID string
	// Name is the key's name, for people reading audit records.
	Name string
	// Tenant owns the runs the principal creates and is the only tenant
	// whose runs it sees, unless it has the admin scope.
	Tenant string
	// Scopes are the key's scopes.
	Scopes []Scope
}

// Operator is the process's own authority: a server with authentication
// off (--auth none, or loopback with no keys), MCP over stdio, and the
// CLI act as the operator, who may do anything.
var Operator = Principal{Name: "operator", Tenant: DefaultTenant, Scopes: []Scope{Admin}}

// Anonymous is a caller without a key on a route that needs none (a share
// link, /healthz): it has no scope, so the core refuses it everything.
var Anonymous = Principal{Name: "anonymous"}

// IsOperator reports whether p is the operator rather than a key (or an
// anonymous caller).
func (p Principal) IsOperator() bool { return p.KeyID == "" && p.Admin() }

// Has reports whether p's scopes include s.
func (p Principal) Has(s Scope) bool {
	for _, have := range p.Scopes {
		if rank(have) >= rank(s) && rank(s) >= 0 {
			return true
		}
	}
	return false
}

// Admin reports whether p may act across tenants.
func (p Principal) Admin() bool { return p.Has(Admin) }

// CanSee reports whether p may see a run owned by tenant.
func (p Principal) CanSee(tenant string) bool { return p.Admin() || p.Tenant == tenant }

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal ctx carries, and the Operator when it
// carries none: code that runs in the process on its own account (the CLI,
// MCP over stdio, a test of the core) is the operator. Every network
// surface puts the authenticated caller in the context before it calls
// the core (see docs/DECISIONS.md, "Who may call").
func From(ctx context.Context) Principal {
	if p, ok := ctx.Value(ctxKey{}).(Principal); ok {
		return p
	}
	return Operator
}

// ParseScopes parses a comma-separated list of scopes ("runs,read").
func ParseScopes(s string) ([]Scope, error) {
	var out []Scope
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if rank(Scope(f)) < 0 {
			return nil, fmt.Errorf("scope %q: want read, runs or admin", f)
		}
		if !slices.Contains(out, Scope(f)) {
			out = append(out, Scope(f))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scope given: want read, runs or admin")
	}
	return out, nil
}

// CheckTenant validates a tenant name: 1-63 characters from [a-z0-9-],
// starting with a letter or digit, as tenant names appear in store keys.
func CheckTenant(t string) error {
	if t == "" || len(t) > 63 {
		return fmt.Errorf("tenant %q: want 1-63 characters from [a-z0-9-]", t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0) {
			return fmt.Errorf("tenant %q: want 1-63 characters from [a-z0-9-], starting with a letter or digit", t)
		}
	}
	return nil
}
