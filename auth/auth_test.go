package auth_test

import (
	"context"
	"testing"

	"github.com/triadhq/triad/auth"
)

func TestScopesNest(t *testing.T) {
	for _, tc := range []struct {
		have []auth.Scope
		need auth.Scope
		want bool
	}{
		{[]auth.Scope{auth.Read}, auth.Read, true},
		{[]auth.Scope{auth.Read}, auth.Runs, false},
		{[]auth.Scope{auth.Read}, auth.Admin, false},
		{[]auth.Scope{auth.Runs}, auth.Read, true},
		{[]auth.Scope{auth.Runs}, auth.Admin, false},
		{[]auth.Scope{auth.Admin}, auth.Runs, true},
		{nil, auth.Read, false},
		{[]auth.Scope{"bogus"}, auth.Read, false},
		{[]auth.Scope{auth.Admin}, "bogus", false},
	} {
		p := auth.Principal{KeyID: "k", Tenant: "t", Scopes: tc.have}
		if got := p.Has(tc.need); got != tc.want {
			t.Errorf("%v has %s: got %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
}

func TestFromDefaultsToOperator(t *testing.T) {
	if p := auth.From(context.Background()); !p.IsOperator() || !p.Admin() || p.Tenant != auth.DefaultTenant {
		t.Fatalf("got %+v, want the operator", p)
	}
	if a := auth.Anonymous; a.IsOperator() || a.Has(auth.Read) {
		t.Fatalf("anonymous %+v is the operator or has a scope", a)
	}
	p := auth.Principal{KeyID: "abc", Tenant: "acme", Scopes: []auth.Scope{auth.Read}}
	got := auth.From(auth.With(context.Background(), p))
	if got.KeyID != "abc" || got.IsOperator() || got.CanSee("other") || !got.CanSee("acme") {
		t.Fatalf("got %+v, want key abc of acme", got)
	}
}

func TestParse(t *testing.T) {
	if s, err := auth.ParseScopes(" runs, read,runs "); err != nil || len(s) != 2 || s[0] != auth.Runs || s[1] != auth.Read {
		t.Fatalf("got %v, %v, want [runs read]", s, err)
	}
	for _, bad := range []string{"", ",", "write", "runs,root"} {
		if _, err := auth.ParseScopes(bad); err == nil {
			t.Errorf("ParseScopes(%q): got nil error", bad)
		}
	}
	for _, ok := range []string{"default", "acme", "a", "team-7"} {
		if err := auth.CheckTenant(ok); err != nil {
			t.Errorf("CheckTenant(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", "Acme", "a/b", "a_b", "a.b", string(make([]byte, 64))} {
		if err := auth.CheckTenant(bad); err == nil {
			t.Errorf("CheckTenant(%q): got nil error", bad)
		}
	}
}
