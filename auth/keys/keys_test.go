package keys_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/s3"
)

func TestMain(m *testing.M) {
	code := m.Run()
	miniotest.StopShared()
	os.Exit(code)
}

func localMeta(t *testing.T, dir string) tmpfs.Meta {
	t.Helper()
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

func wantAuth(t *testing.T, err error, msg string) {
	t.Helper()
	fe := fault.As(err)
	if fe == nil || fe.Kind != fault.Auth || fault.Status(fe.Kind) != 401 || fe.Suggestion == "" || !strings.Contains(fe.Message, msg) {
		t.Fatalf("got %v, want a 401 auth fault with a suggestion, saying %q", err, msg)
	}
}

func TestLifecycle(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := keys.New(localMeta(t, dir), keys.Config{LastUsedEvery: -1})
	if any, err := s.Any(ctx); err != nil || any {
		t.Fatalf("fresh store: Any got %v, %v, want false", any, err)
	}
	tok, k, err := s.Create(ctx, "ci agent", "acme", []auth.Scope{auth.Runs})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "trd_"+k.ID+"_") || len(tok) != 4+12+1+52 || k.Tenant != "acme" || k.Name != "ci agent" {
		t.Fatalf("got key %q %+v", tok, k)
	}
	if any, _ := s.Any(ctx); !any {
		t.Fatal("Any after Create: got false")
	}
	// The secret is not stored anywhere in the data directory.
	secret := tok[len(tok)-52:]
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("%s holds the key's secret", p)
			}
		}
		return nil
	})

	// A second Store over the same directory (another process) sees it.
	s2 := keys.New(localMeta(t, dir), keys.Config{LastUsedEvery: -1})
	p, err := s2.Authenticate(ctx, tok)
	if err != nil || p.KeyID != k.ID || p.Tenant != "acme" || !p.Has(auth.Runs) || p.Has(auth.Admin) || p.IsOperator() {
		t.Fatalf("authenticate: got %+v, %v", p, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != k.ID || list[0].LastUsed == nil || list[0].Revoked != nil {
		t.Fatalf("list after use: got %+v, %v, want the key with a last use", list, err)
	}

	wantAuth(t, authErr(s, ""), "no API key")
	for _, bad := range []string{"nope", "Bearer " + tok, tok + "x", strings.Replace(tok, "trd_", "trx_", 1), tok[:20], strings.ToUpper(tok)} {
		wantAuth(t, authErr(s, bad), "malformed")
	}
	// Right shape, unknown id; known id, wrong secret: the same answer.
	wantAuth(t, authErr(s, "trd_aaaaaaaaaaaa_"+strings.Repeat("a", 52)), "not known")
	wantAuth(t, authErr(s, tok[:len(tok)-52]+strings.Repeat("b", 52)), "not known")

	if _, err := s.Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	wantAuth(t, authErr(s, tok), "revoked")
	if _, err := s.Revoke(ctx, "nosuchkeyabc"); fault.As(err) == nil || fault.As(err).Kind != fault.NotFound {
		t.Fatalf("revoke of an unknown id: got %v, want not_found", err)
	}
	if list, _ := s.List(ctx); len(list) != 1 || list[0].Revoked == nil {
		t.Fatalf("list after revoke: got %+v, want the key marked revoked", list)
	}
	if any, _ := s2.Any(ctx); !any {
		t.Fatal("a revoked key still counts for Any: a server must not fall back to open")
	}
}

func authErr(s *keys.Store, tok string) error {
	_, err := s.Authenticate(context.Background(), tok)
	return err
}

// Last use is written at most once per interval, not per request.
func TestLastUsedIsThrottled(t *testing.T) {
	ctx := t.Context()
	s := keys.New(localMeta(t, t.TempDir()), keys.Config{LastUsedEvery: time.Hour})
	tok, _, err := s.Create(ctx, "k", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, tok); err != nil {
		t.Fatal(err)
	}
	l1, _ := s.List(ctx)
	for range 5 {
		if _, err := s.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	l2, _ := s.List(ctx)
	if l1[0].LastUsed == nil || !l1[0].LastUsed.Equal(*l2[0].LastUsed) {
		t.Fatalf("last used moved within the interval: %v then %v", l1[0].LastUsed, l2[0].LastUsed)
	}
	if l1[0].Tenant != auth.DefaultTenant || len(l1[0].Scopes) != 1 || l1[0].Scopes[0] != "runs" {
		t.Fatalf("defaults: got %+v, want tenant default and scope runs", l1[0])
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	s := keys.New(localMeta(t, t.TempDir()), keys.Config{})
	for _, tc := range []struct {
		name, tenant string
		scopes       []auth.Scope
	}{
		{"", "", nil},
		{"x\x00y", "", nil},
		{"ok", "Bad Tenant", nil},
		{"ok", "", []auth.Scope{"root"}},
	} {
		if _, _, err := s.Create(t.Context(), tc.name, tc.tenant, tc.scopes); fault.As(err) == nil || fault.As(err).Kind != fault.BadInput {
			t.Errorf("Create(%q, %q, %v): got %v, want bad_input", tc.name, tc.tenant, tc.scopes, err)
		}
	}
}

// Two replicas over one MinIO bucket: a key made on one works on the
// other, and a key revoked on one is refused by the other within 5 s.
func TestRevocationAcrossReplicas(t *testing.T) {
	srv := miniotest.Shared(t)
	open := func() *keys.Store {
		b, x, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket,
			AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close(); b.Close() })
		return keys.New(tmpfs.New(b, x, nil).Meta(), keys.Config{})
	}
	a, b := open(), open()
	ctx := t.Context()
	tok, k, err := a.Create(ctx, "shared", "", []auth.Scope{auth.Read})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := b.Authenticate(ctx, tok); err != nil || p.KeyID != k.ID {
		t.Fatalf("replica b: got %+v, %v", p, err)
	}
	if _, err := a.Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := b.Authenticate(ctx, tok)
		if err != nil {
			wantAuth(t, err, "revoked")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica b still accepts the key 5 s after replica a revoked it")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
