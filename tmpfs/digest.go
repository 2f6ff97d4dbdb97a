package tmpfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strings"
)

// Digest is the sha256 content address of a blob. The zero Digest is invalid
// and means "no content"; ParseDigest never returns it.
type Digest struct {
	sum [sha256.Size]byte
	ok  bool
}

// ParseDigest parses a lower- or upper-case 64-digit hex sha256, optionally
// prefixed "sha256:".
func ParseDigest(s string) (Digest, error) {
	h := strings.TrimPrefix(s, "sha256:")
	if len(h) != 2*sha256.Size {
		return Digest{}, fmt.Errorf("%w: %q is not a sha256 (want 64 hex digits)", ErrBadDigest, trim(s))
	}
	var d Digest
	if _, err := hex.Decode(d.sum[:], []byte(strings.ToLower(h))); err != nil {
		return Digest{}, fmt.Errorf("%w: %q is not hex", ErrBadDigest, trim(s))
	}
	d.ok = true
	return d, nil
}

// MustParseDigest is ParseDigest for constants in tests and examples; it panics on error.
func MustParseDigest(s string) Digest {
	d, err := ParseDigest(s)
	if err != nil {
		panic(err)
	}
	return d
}

// DigestOf returns the digest of b.
func DigestOf(b []byte) Digest {
	return Digest{sum: sha256.Sum256(b), ok: true}
}

// NewHasher returns a hash.Hash whose Sum can be turned into a Digest with DigestFromHash.
func NewHasher() hash.Hash { return sha256.New() }

// DigestFromHash returns the digest accumulated in h, which must come from NewHasher.
func DigestFromHash(h hash.Hash) Digest {
	var d Digest
	copy(d.sum[:], h.Sum(nil))
	d.ok = true
	return d
}

// IsZero reports whether d is the zero (invalid) Digest.
func (d Digest) IsZero() bool { return !d.ok }

// String returns the 64-digit lower-case hex form, or "" for the zero Digest.
func (d Digest) String() string {
	if !d.ok {
		return ""
	}
	return hex.EncodeToString(d.sum[:])
}

// Short returns the first 12 hex digits, for journals and logs.
func (d Digest) Short() string {
	s := d.String()
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// MarshalText encodes d as hex.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses hex (optionally "sha256:"-prefixed) into d. Empty
// text decodes to the zero Digest, the inverse of MarshalText.
func (d *Digest) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*d = Digest{}
		return nil
	}
	p, err := ParseDigest(string(b))
	if err != nil {
		return err
	}
	*d = p
	return nil
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// AsyncHasher hashes bytes on its own goroutine, so hashing overlaps with
// whatever the writer does next (receiving, writing to disk). Write copies
// p; Digest waits for the hash of everything written.
type AsyncHasher struct {
	ch   chan []byte
	pool chan []byte
	done chan Digest
	n    int64
}

const asyncChunk = 256 << 10

// NewAsyncHasher starts a hashing goroutine; call Digest exactly once to
// end it.
func NewAsyncHasher() *AsyncHasher {
	a := &AsyncHasher{ch: make(chan []byte, 8), pool: make(chan []byte, 10), done: make(chan Digest, 1)}
	// The buffers are made on first use, and grown, as large as the
	// writes that need them (at most asyncChunk): a small file costs one
	// small buffer, not 2.5 MiB of zeroed memory, and a write is still one
	// hand-off at most per asyncChunk.
	for range cap(a.pool) {
		a.pool <- nil
	}
	go func() {
		h := NewHasher()
		for b := range a.ch {
			h.Write(b)
			a.pool <- b[:0]
		}
		a.done <- DigestFromHash(h)
	}()
	return a
}

// Write implements io.Writer. It never fails.
func (a *AsyncHasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		b := <-a.pool
		if want := min(len(p), asyncChunk); cap(b) < want {
			b = make([]byte, 0, want) // first use, or a larger write than before
		}
		k := min(len(p), cap(b))
		b = append(b, p[:k]...)
		a.ch <- b
		p = p[k:]
	}
	a.n += int64(n)
	return n, nil
}

// Digest waits for the hash of everything written and returns it.
func (a *AsyncHasher) Digest() Digest {
	close(a.ch)
	return <-a.done
}
