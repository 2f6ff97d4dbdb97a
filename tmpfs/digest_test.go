package tmpfs_test

import (
	"crypto/rand"
	"testing"

	"github.com/triadhq/triad/tmpfs"
)

// AsyncHasher's digest is sha256's of everything written, whatever the
// sizes of the writes: small ones first (its buffers are made as large as
// the first writes need), then larger than a buffer, then small again; and
// it copies what it is given, so changing a slice after Write changes
// nothing.
func TestAsyncHasher(t *testing.T) {
	h := tmpfs.NewAsyncHasher()
	var all []byte
	for _, n := range []int{0, 1, 100, 4 << 10, 300 << 10, 1 << 20, 7, 256 << 10, 3} {
		p := make([]byte, n)
		rand.Read(p)
		all = append(all, p...)
		if k, err := h.Write(p); k != n || err != nil {
			t.Fatalf("Write(%d bytes) = %d, %v", n, k, err)
		}
		rand.Read(p)
	}
	if got, want := h.Digest(), tmpfs.DigestOf(all); got != want {
		t.Fatalf("digest %s, want %s", got, want)
	}
}
