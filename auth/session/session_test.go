package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func localMeta(t *testing.T) tmpfs.Meta {
	t.Helper()
	dir := t.TempDir()
	b, err := local.NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err := local.NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil).Meta()
}

func wantAuth(t *testing.T, err error) {
	t.Helper()
	if fe := fault.As(err); fe == nil || fe.Kind != fault.Auth {
		t.Fatalf("got %v, want an auth fault", err)
	}
}

// A session acts as its key's principal, keeps only a hash of its id in
// the store, ends at sign-out, at its expiry and when its key is revoked,
// and is seen by a second store over the same records (a replica).
func TestLifecycle(t *testing.T) {
	ctx := t.Context()
	meta := localMeta(t)
	ks := keys.New(meta, keys.Config{CacheTTL: time.Millisecond})
	tok, k, err := ks.Create(ctx, "analyst", "acme", []auth.Scope{auth.Read})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ks.Authenticate(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	ss := session.New(meta, ks, session.Config{TTL: time.Hour, CacheTTL: time.Millisecond})
	if _, err := ss.Create(ctx, auth.Operator); err == nil {
		t.Error("the operator (no key) got a session")
	}
	s, err := ss.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ID) < 40 || len(s.CSRF) < 40 || s.ID == s.CSRF || s.KeyID != k.ID {
		t.Fatalf("got session %+v", s)
	}
	stored, err := meta.ListMeta(ctx, "sessions/", "", 0)
	if err != nil || len(stored) != 1 || strings.Contains(stored[0], s.ID) {
		t.Fatalf("stored records %v (%v): want one, not named by the session id", stored, err)
	}
	b, _, _ := meta.GetMeta(ctx, stored[0])
	if strings.Contains(string(b), s.ID) || strings.Contains(string(b), tok) {
		t.Fatalf("the record holds the session id or the key: %s", b)
	}

	replica := session.New(meta, ks, session.Config{CacheTTL: time.Millisecond})
	for name, st := range map[string]*session.Store{"same": ss, "replica": replica} {
		got, gp, err := st.Resolve(ctx, s.ID)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if gp.KeyID != k.ID || gp.Tenant != "acme" || !gp.Has(auth.Read) || gp.Has(auth.Runs) {
			t.Errorf("%s: principal %+v, want the key's", name, gp)
		}
		if !got.CheckCSRF(s.CSRF) || got.CheckCSRF("") || got.CheckCSRF(s.CSRF[:len(s.CSRF)-1]+"x") {
			t.Errorf("%s: CSRF check is wrong", name)
		}
	}
	for _, bad := range []string{"", "x", strings.Repeat("a", len(s.ID)), s.CSRF} {
		_, _, err := ss.Resolve(ctx, bad)
		wantAuth(t, err)
	}

	// Sign-out ends it everywhere (the replica after its cache TTL).
	if err := ss.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	for _, st := range []*session.Store{ss, replica} {
		_, _, err := st.Resolve(ctx, s.ID)
		wantAuth(t, err)
	}

	// A revoked key ends its sessions.
	s2, _ := ss.Create(ctx, p)
	if _, err := ks.Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	_, _, err = ss.Resolve(ctx, s2.ID)
	wantAuth(t, err)
}

// An expired session is refused and removed.
func TestExpiry(t *testing.T) {
	ctx := context.Background()
	meta := localMeta(t)
	ks := keys.New(meta, keys.Config{})
	tok, _, _ := ks.Create(ctx, "a", "", nil)
	p, _ := ks.Authenticate(ctx, tok)
	ss := session.New(meta, ks, session.Config{TTL: 50 * time.Millisecond, CacheTTL: time.Millisecond})
	s, err := ss.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ss.Resolve(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	_, _, err = ss.Resolve(ctx, s.ID)
	wantAuth(t, err)
	if left, _ := meta.ListMeta(ctx, "sessions/", "", 0); len(left) != 0 {
		t.Errorf("an expired session's record stayed: %v", left)
	}
}
