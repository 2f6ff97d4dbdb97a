package local

import (
	"bytes"
	"testing"
	"time"

	"github.com/triadhq/triad/tmpfs"
)

// On a file system whose ctime may stay put within a clock tick, a
// fingerprint recorded within the racy window is not trusted: the next
// read hashes, and records it once the window has passed.
func TestRacyFingerprintIsNotTrusted(t *testing.T) {
	dir := t.TempDir()
	b, err := NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	b.fps.racy = 200 * time.Millisecond // as if the probe had found coarse timestamps
	ctx := t.Context()
	d, _, err := b.Put(ctx, bytes.NewReader([]byte("racy")), 0)
	if err != nil {
		t.Fatal(err)
	}
	verified := func() bool {
		bl, err := b.Open(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		defer bl.Close()
		return bl.(tmpfs.Fingerprinted).Verified()
	}
	if verified() {
		t.Fatal("right after the write: got the blob trusted, want its fingerprint held back as racy")
	}
	time.Sleep(300 * time.Millisecond) // past the window, by construction
	bl, err := b.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := bl.(tmpfs.Fingerprinted).MarkVerified(); err != nil {
		t.Fatal(err)
	}
	bl.Close()
	if !verified() {
		t.Fatal("after a verification past the window: got the blob untrusted")
	}
}
