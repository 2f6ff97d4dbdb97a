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
// Each link is also listed under its run (shares-of/<run>/<id>), so a
// run's live links can be listed and revoked after the page that made
// them is gone.
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
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	// byRunPrefix lists each run's links, newest first:
	// shares-of/<run>/<inverted creation time>-<id>.
	byRunPrefix = "shares-of/"
	secretKey   = "secrets/share"
	idLen       = 16
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
		s, err := tmpfs.StoredSecret(ctx, meta, secretKey, "secret")
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
		// The record is the link; the listing entry only finds it. A link
		// whose entry failed works but is not listed: say so.
		if _, err := s.meta.PutMeta(ctx, byRun(l.Run, s.now(), l.ID), []byte("{}"), tmpfs.Cond{}); err != nil {
			s.meta.DeleteMeta(ctx, recordPrefix+l.ID)
			return Link{}, "", err
		}
		return l, s.Token(l), nil
	}
	return Link{}, "", errors.New("share: could not draw an unused id")
}

// byRun names a link's listing entry: its run, then the time it was made
// counted down (so the newest sorts first, to the nanosecond, where a
// link's record keeps seconds), then its id.
func byRun(run runid.ID, made time.Time, id string) string {
	return fmt.Sprintf("%s%s/%019d-%s", byRunPrefix, run, math.MaxInt64-made.UnixNano(), id)
}

// Token returns the link's token: the same one Create returned, since it
// is made of the link's id and expiry, signed.
func (s *Links) Token(l Link) string {
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
	l, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := s.meta.DeleteMeta(ctx, recordPrefix+id); err != nil {
		if errors.Is(err, tmpfs.ErrNotFound) {
			return ErrNotFound
		}
		return err
	}
	s.mu.Lock()
	delete(s.cache, id)
	s.mu.Unlock()
	// The listing entry goes too (List would drop it anyway).
	keys, err := s.meta.ListMeta(ctx, byRunPrefix+l.Run.String()+"/", "", 0)
	if err != nil {
		return fmt.Errorf("share %s is revoked, but its listing entry remains: %w", id, err)
	}
	for _, k := range keys {
		if strings.HasSuffix(k, "-"+id) {
			if err := s.meta.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
				return fmt.Errorf("share %s is revoked, but its listing entry remains: %w", id, err)
			}
		}
	}
	return nil
}

// RevokeRun revokes every link of the run (a deleted run's): each record
// and listing entry. Revoking again finds nothing to do.
func (s *Links) RevokeRun(ctx context.Context, run runid.ID) error {
	keys, err := s.meta.ListMeta(ctx, byRunPrefix+run.String()+"/", "", 0)
	if err != nil {
		return err
	}
	for _, k := range keys {
		id := k[strings.LastIndexByte(k, '-')+1:]
		if err := s.meta.DeleteMeta(ctx, recordPrefix+id); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return err
		}
		s.mu.Lock()
		delete(s.cache, id)
		s.mu.Unlock()
		if err := s.meta.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// List returns the run's live links, newest first (the listing's order). Entries of links that
// expired or whose record is gone are dropped from the listing as they
// are found.
func (s *Links) List(ctx context.Context, run runid.ID) ([]Link, error) {
	keys, err := s.meta.ListMeta(ctx, byRunPrefix+run.String()+"/", "", 0)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := []Link{}
	for _, k := range keys {
		id := k[strings.LastIndexByte(k, '-')+1:]
		l, err := s.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound) || err == nil && !now.Before(l.Expires):
			s.meta.DeleteMeta(ctx, k)
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}
