// Package seal keeps small secrets sealed at rest: AES-256-GCM under a key the operator gives, or one drawn once and kept in the store.
//
// A surface that must keep a caller's secret (the envs of an E2B sandbox)
// stores only its sealed form, so a copy of the store's records does not
// show it in plain text. A sealed value is v1.<key id>.<base64url(nonce |
// ciphertext)>; the key id names the key that sealed it, so a value sealed
// under another key fails with ErrWrongKey rather than as damage.
//
// The key comes from configuration (the operator's secret, from which the
// AES key is derived with HKDF-SHA256), or is drawn once and kept in the
// store (secrets/seal), where every replica finds the same one. Only the
// first keeps the secrets from someone who copies the whole store: with a
// drawn key the copy holds the key too. See docs/DECISIONS.md, "Sealed
// secrets".
package seal

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/triadhq/triad/tmpfs"
)

// secretKey is where a drawn key is kept.
const secretKey = "secrets/seal"

// MinSecret is the shortest secret the operator may give.
const MinSecret = 16

// ErrWrongKey means a value was sealed under another key than this
// Sealer's: the operator changed the key (or the store was moved to a
// server with another). The value cannot be opened; seal it again.
var ErrWrongKey = errors.New("seal: sealed under another key")

// ErrDamaged means a sealed value is malformed or fails its
// authentication: it was changed after it was sealed, or was sealed for
// another record (the additional data differs).
var ErrDamaged = errors.New("seal: sealed value is damaged or not for this record")

// Config configures a Sealer.
type Config struct {
	// Secret is the operator's key material, at least MinSecret bytes.
	// Empty draws a key once and keeps it in the store.
	Secret []byte
}

// Sealer seals and opens secrets. It is safe for concurrent use.
type Sealer struct {
	aead cipher.AEAD
	id   string
}

// Open returns a Sealer with the configured secret, or with the key kept
// in meta (drawn on first use).
func Open(ctx context.Context, meta tmpfs.Meta, c Config) (*Sealer, error) {
	secret := c.Secret
	if len(secret) == 0 {
		s, err := tmpfs.StoredSecret(ctx, meta, secretKey, "key")
		if err != nil {
			return nil, fmt.Errorf("the seal key: %w", err)
		}
		secret = s
	}
	return New(secret)
}

// New returns a Sealer whose key is derived from secret (at least
// MinSecret bytes): for tests, and for a key kept elsewhere.
func New(secret []byte) (*Sealer, error) {
	if len(secret) < MinSecret {
		return nil, fmt.Errorf("the seal secret must be at least %d bytes", MinSecret)
	}
	key, err := hkdf.Key(sha256.New, secret, nil, "triad seal v1", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(append([]byte("triad seal key id\x00"), key...))
	return &Sealer{aead: aead, id: hex.EncodeToString(sum[:4])}, nil
}

// Seal seals plain for the record ad names (its id, say): Open of the
// result with other additional data fails, so a sealed value cannot be
// moved to another record.
func (s *Sealer) Seal(plain, ad []byte) (string, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal: draw a nonce: %w", err)
	}
	out := s.aead.Seal(nonce, nonce, plain, ad)
	return "v1." + s.id + "." + base64.RawURLEncoding.EncodeToString(out), nil
}

// Open opens a value Seal sealed with the same additional data.
func (s *Sealer) Open(sealed string, ad []byte) ([]byte, error) {
	parts := strings.Split(sealed, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		return nil, ErrDamaged
	}
	if parts[1] != s.id {
		return nil, ErrWrongKey
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(b) < s.aead.NonceSize() {
		return nil, ErrDamaged
	}
	plain, err := s.aead.Open(nil, b[:s.aead.NonceSize()], b[s.aead.NonceSize():], ad)
	if err != nil {
		return nil, ErrDamaged
	}
	return plain, nil
}
