// Package share makes and checks share links: URLs signed with the server's secret that download a run's files without an API key until they expire or are revoked.
//
// A link's token is v1.<id>.<expiry>.<signature>, the signature an
// HMAC-SHA256 of the rest under the server's secret. The link's record
// (which run, which path or prefix, whose) is kept in the store's records
// under shares/<id>, so replicas agree on it and revoking deletes it. A
// link is good only while all of these hold: the signature matches, the
// expiry has not passed, and the record exists with that expiry. Every
// other case is ErrNotFound, and surfaces answer 404 with one body.
//
// The secret comes from configuration, or is drawn once and kept in the
// store (secrets/share), where every replica finds the same one.
package share

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// ErrNotFound means a token names no live link: malformed, tampered,
// expired, revoked, or never made.
var ErrNotFound = errors.New("share: no such link")

const (
	recordPrefix = "shares/"
	secretKey    = "secrets/share"
	idLen        = 16
)

var enc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Link is a share link's record.
type Link struct {
	ID     string   `json:"id"`
	Run    runid.ID `json:"run"`
	Tenant string   `json:"tenant"`
	// KeyID is the key that made the link (empty for the operator).
	KeyID string `json:"key_id,omitempty"`
	// Exactly one of Path and Prefix is set.
	Path    string    `json:"path,omitempty"`
	Prefix  string    `json:"prefix,omitempty"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// Allows reports whether the link covers the run path p.
func (l Link) Allows(p string) bool {
	if l.Path != "" {
		return p == l.Path
	}
	return strings.HasPrefix(p, l.Prefix)
}

// Config configures Links.
type Config struct {
	// Secret signs the links. Empty draws one on first use and keeps it
	// in the store, so every replica uses the same.
	Secret []byte
	// CacheTTL is how long a record read from the store is trusted: a link
	// revoked on another replica stops working within it. Zero means 2 s.
	CacheTTL time.Duration
	// Now is the clock links are made and checked by; nil is time.Now.
	// Tests move it to see a link expire without waiting.
	Now func() time.Time
}

// Now is the time by the links' clock (Config.Now).
func (s *Links) Now() time.Time { return s.now() }

// Links makes and checks share links.
type Links struct {
	meta   tmpfs.Meta
	secret []byte
	ttl    time.Duration
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	l  *Link
	at time.Time
}

// Open returns Links over meta, loading or creating the secret.
func Open(ctx context.Context, meta tmpfs.Meta, c Config) (*Links, error) {
	if c.CacheTTL <= 0 {
		c.CacheTTL = 2 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	l := &Links{meta: meta, secret: c.Secret, ttl: c.CacheTTL, now: c.Now, cache: map[string]cached{}}
	if len(l.secret) == 0 {
		s, err := storedSecret(ctx, meta)
		if err != nil {
			return nil, fmt.Errorf("share links' secret: %w", err)
		}
		l.secret = s
	}
	if len(l.secret) < 16 {
		return nil, fmt.Errorf("the share secret must be at least 16 bytes")
	}
	return l, nil
}

// storedSecret reads the store's secret, drawing it if there is none. Two
// replicas starting at once both try to create it; the loser reads the
// winner's.
func storedSecret(ctx context.Context, meta tmpfs.Meta) ([]byte, error) {
	type rec struct {
		Secret string `json:"secret"`
	}
	for range 3 {
		b, _, err := meta.GetMeta(ctx, secretKey)
		if err == nil {
			var r rec
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, err
			}
			return hex.DecodeString(r.Secret)
		}
		if !errors.Is(err, tmpfs.ErrNotFound) {
			return nil, err
		}
		s := make([]byte, 32)
		rand.Read(s)
		nb, _ := json.Marshal(rec{Secret: hex.EncodeToString(s)})
		if _, err := meta.PutMeta(ctx, secretKey, nb, tmpfs.Cond{IfAbsent: true}); err == nil {
			return s, nil
		} else if !errors.Is(err, tmpfs.ErrPrecondition) {
			return nil, err
		}
	}
	return nil, errors.New("could not read or create the secret")
}

// Create stores l (its ID and Created are filled in) and returns it with
// its token.
func (s *Links) Create(ctx context.Context, l Link) (Link, string, error) {
	if (l.Path == "") == (l.Prefix == "") {
		return Link{}, "", errors.New("share: exactly one of path and prefix")
	}
	l.Created = s.now().UTC().Truncate(time.Second)
	l.Expires = l.Expires.UTC().Truncate(time.Second)
	for range 5 {
		id := make([]byte, 10)
		rand.Read(id)
		l.ID = enc.EncodeToString(id)[:idLen]
		b, err := json.Marshal(l)
		if err != nil {
			return Link{}, "", err
		}
		_, err = s.meta.PutMeta(ctx, recordPrefix+l.ID, b, tmpfs.Cond{IfAbsent: true})
		if errors.Is(err, tmpfs.ErrPrecondition) {
			continue
		}
		if err != nil {
			return Link{}, "", err
		}
		return l, s.token(l), nil
	}
	return Link{}, "", errors.New("share: could not draw an unused id")
}

func (s *Links) token(l Link) string {
	payload := "v1." + l.ID + "." + strconv.FormatInt(l.Expires.Unix(), 10)
	return payload + "." + s.sign(payload)
}

func (s *Links) sign(payload string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Resolve checks a token and returns its link, or ErrNotFound.
func (s *Links) Resolve(ctx context.Context, token string) (Link, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 4 || parts[0] != "v1" || len(parts[1]) != idLen {
		return Link{}, ErrNotFound
	}
	payload := strings.Join(parts[:3], ".")
	if !hmac.Equal([]byte(s.sign(payload)), []byte(parts[3])) {
		return Link{}, ErrNotFound
	}
	exp, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || !s.now().Before(time.Unix(exp, 0)) {
		return Link{}, ErrNotFound
	}
	l, err := s.lookup(ctx, parts[1])
	if err != nil {
		return Link{}, err
	}
	if l.Expires.Unix() != exp {
		return Link{}, ErrNotFound
	}
	return l, nil
}

func (s *Links) lookup(ctx context.Context, id string) (Link, error) {
	now := s.now()
	s.mu.Lock()
	c, ok := s.cache[id]
	s.mu.Unlock()
	if !ok || now.Sub(c.at) >= s.ttl {
		l, err := s.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			c = cached{at: now}
		case err != nil:
			return Link{}, err
		default:
			c = cached{l: &l, at: now}
		}
		s.mu.Lock()
		if len(s.cache) >= 10000 {
			clear(s.cache)
		}
		s.cache[id] = c
		s.mu.Unlock()
	}
	if c.l == nil {
		return Link{}, ErrNotFound
	}
	return *c.l, nil
}

// Get returns a link's record by id, read through, or ErrNotFound.
func (s *Links) Get(ctx context.Context, id string) (Link, error) {
	if len(id) != idLen || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz234567") != "" {
		return Link{}, ErrNotFound
	}
	b, _, err := s.meta.GetMeta(ctx, recordPrefix+id)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return Link{}, ErrNotFound
	}
	if err != nil {
		return Link{}, err
	}
	var l Link
	if err := json.Unmarshal(b, &l); err != nil {
		return Link{}, fmt.Errorf("share %s: corrupt record: %w", id, err)
	}
	return l, nil
}

// Revoke deletes a link: it stops working here at once and on other
// replicas within the cache TTL.
func (s *Links) Revoke(ctx context.Context, id string) error {
	if err := s.meta.DeleteMeta(ctx, recordPrefix+id); err != nil {
		if errors.Is(err, tmpfs.ErrNotFound) {
			return ErrNotFound
		}
		return err
	}
	s.mu.Lock()
	delete(s.cache, id)
	s.mu.Unlock()
	return nil
}
