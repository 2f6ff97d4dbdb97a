package seal_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/triadhq/triad/auth/seal"
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

func TestSeal(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	a, err := seal.Open(ctx, meta(t, dir), seal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(`{"DB_PASSWORD":"hunter2-very-secret"}`)
	sealed, err := a.Seal(secret, []byte("r-1"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "hunter2") || !strings.HasPrefix(sealed, "v1.") {
		t.Fatalf("sealed value %q shows the secret or lacks its version", sealed)
	}
	// A second process over the same store opens it with the kept key.
	b, err := seal.Open(ctx, meta(t, dir), seal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Open(sealed, []byte("r-1"))
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open on a replica: got %q, %v", got, err)
	}
	if _, err := b.Open(sealed, []byte("r-2")); !errors.Is(err, seal.ErrDamaged) {
		t.Errorf("open for another record: got %v, want ErrDamaged", err)
	}
	flipped := sealed[:len(sealed)-2] + map[bool]string{true: "AA", false: "BB"}[!strings.HasSuffix(sealed, "AA")]
	if _, err := b.Open(flipped, []byte("r-1")); !errors.Is(err, seal.ErrDamaged) {
		t.Errorf("open of a changed value: got %v, want ErrDamaged", err)
	}
	for _, bad := range []string{"", "v1", "v2.x.y", "v1..", "v1." + strings.Split(sealed, ".")[1] + ".!!"} {
		if _, err := b.Open(bad, []byte("r-1")); err == nil {
			t.Errorf("open of %q: got nil error", bad)
		}
	}

	// The operator's key: another key id, so the drawn key's values are
	// told apart from damage.
	op, err := seal.Open(ctx, meta(t, dir), seal.Config{Secret: []byte("the operator's own secret")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Open(sealed, []byte("r-1")); !errors.Is(err, seal.ErrWrongKey) {
		t.Errorf("open under another key: got %v, want ErrWrongKey", err)
	}
	s2, err := op.Seal(secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := op.Open(s2, nil); err != nil || !bytes.Equal(got, secret) {
		t.Errorf("round trip under the operator's key: %q, %v", got, err)
	}
	if _, err := seal.New([]byte("short")); err == nil {
		t.Error("a secret under 16 bytes was accepted")
	}
}
