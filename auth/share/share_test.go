package share_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func meta(t *testing.T, dir string) tmpfs.Meta {
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

func TestLinks(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	a, err := share.Open(ctx, meta(t, dir), share.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run := runid.New()
	l, tok, err := a.Create(ctx, share.Link{Run: run, Tenant: "acme", Prefix: "artifacts/", Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	// A second process over the same store draws no secret of its own.
	b, err := share.Open(ctx, meta(t, dir), share.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Resolve(ctx, tok)
	if err != nil || got.ID != l.ID || got.Run != run || got.Tenant != "acme" {
		t.Fatalf("resolve on a replica: got %+v, %v", got, err)
	}
	if !got.Allows("artifacts/report.md") || got.Allows("secret.txt") || got.Allows("artifacts") {
		t.Fatal("prefix link: Allows is wrong")
	}

	parts := strings.Split(tok, ".")
	flip := func(s string) string {
		c := "a"
		if s[len(s)-1] == 'a' {
			c = "b"
		}
		return s[:len(s)-1] + c
	}
	other, err := share.Open(ctx, meta(t, t.TempDir()), share.Config{Secret: []byte("another server's secret")})
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"signature":     strings.Join([]string{parts[0], parts[1], parts[2], flip(parts[3])}, "."),
		"id":            strings.Join([]string{parts[0], flip(parts[1]), parts[2], parts[3]}, "."),
		"longer expiry": strings.Join([]string{parts[0], parts[1], "9999999999", parts[3]}, "."),
		"garbage":       "v1.x.y.z",
		"empty":         "",
	} {
		if _, err := a.Resolve(ctx, bad); !errors.Is(err, share.ErrNotFound) {
			t.Errorf("%s tampered: got %v, want ErrNotFound", name, err)
		}
	}
	if _, err := other.Resolve(ctx, tok); !errors.Is(err, share.ErrNotFound) {
		t.Errorf("another secret: got %v, want ErrNotFound", err)
	}

	_, expired, err := a.Create(ctx, share.Link{Run: run, Tenant: "acme", Path: "a.txt", Expires: time.Now().Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resolve(ctx, expired); !errors.Is(err, share.ErrNotFound) {
		t.Errorf("expired: got %v, want ErrNotFound", err)
	}

	if err := b.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resolve(ctx, tok); !errors.Is(err, share.ErrNotFound) {
		t.Errorf("revoked: got %v, want ErrNotFound", err)
	}
	if err := b.Revoke(ctx, l.ID); !errors.Is(err, share.ErrNotFound) {
		t.Errorf("second revoke: got %v, want ErrNotFound", err)
	}
	if _, _, err := a.Create(ctx, share.Link{Run: run, Path: "a", Prefix: "b/", Expires: time.Now().Add(time.Hour)}); err == nil {
		t.Error("a link with both path and prefix was made")
	}
}

// A run's live links are listed newest first, with the tokens Create
// gave; revoked and expired links leave the list, and another run's links
// are not in it.
func TestList(t *testing.T) {
	ctx := t.Context()
	a, err := share.Open(ctx, meta(t, t.TempDir()), share.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run, other := runid.New(), runid.New()
	var ids, toks []string
	for i := range 4 {
		exp := time.Now().Add(time.Hour)
		if i == 3 {
			exp = time.Now().Add(-time.Second) // made expired
		}
		l, tok, err := a.Create(ctx, share.Link{Run: run, Tenant: "acme", Path: "a.txt", Expires: exp})
		if err != nil {
			t.Fatal(err)
		}
		ids, toks = append(ids, l.ID), append(toks, tok)
	}
	if _, _, err := a.Create(ctx, share.Link{Run: other, Tenant: "acme", Path: "a.txt", Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	got, err := a.List(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != ids[2] || got[1].ID != ids[0] || a.Token(got[0]) != toks[2] || a.Token(got[1]) != toks[0] {
		t.Fatalf("List: got %+v, want links 3 then 1 with their tokens", got)
	}
}
