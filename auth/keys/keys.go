// Package keys stores API keys hashed in the store's records (tmpfs.Meta), so every replica sharing a store authenticates the same keys.
//
// A key is trd_<id>_<secret>. The id is public: it names the key in
// listings, audit records and revocations. The secret is 256 random bits
// and is never stored: the record keeps a per-key salt and
// sha256(salt || secret), compared in constant time. A fast hash is enough
// because the secret is random, not a password (see docs/DECISIONS.md,
// "API keys").
//
// Records are cached for a short TTL (2 s by default), so a key revoked on
// one replica is refused by every other within that time plus one request.
// Last use is written at most once a minute per key and replica, to a
// record of its own, so authentication is not a store write per request.
package keys

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Prefix starts every key.
const Prefix = "trd_"

// The lengths of a key's parts, in base32 characters.
const (
	idLen     = 12 // 60 bits: unique among keys, and public
	secretLen = 52 // 260 bits of which 256 random
)

var enc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// The store keys of the records.
const (
	recordPrefix = "keys/"      // keys/<id>: the key's record
	usedPrefix   = "keys-used/" // keys-used/<id>: its last use
)

// Config tunes a Store.
type Config struct {
	// CacheTTL is how long a record read from the store is trusted: a key
	// revoked elsewhere is refused within it. Zero means 2 s.
	CacheTTL time.Duration
	// LastUsedEvery is the least time between two writes of a key's last
	// use by one process. Zero means a minute; negative writes every use.
	LastUsedEvery time.Duration
	Logger        *slog.Logger
}

// Store creates, lists, revokes and checks keys.
type Store struct {
	meta tmpfs.Meta
	ttl  time.Duration
	used time.Duration
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	cache   map[string]cached
	written map[string]time.Time // last-use writes, per key id
	anyAt   time.Time
	anyKeys bool
}

type cached struct {
	rec *record // nil: no such key
	at  time.Time
}

// record is a key as stored: its listing entry, salt and hash.
type record struct {
	wire.Key
	Salt string `json:"salt"`
	Hash string `json:"hash"`
}

// maxCache bounds the cache; past it, it starts over.
const maxCache = 10000

// New returns a Store over meta.
func New(meta tmpfs.Meta, c Config) *Store {
	if c.CacheTTL <= 0 {
		c.CacheTTL = 2 * time.Second
	}
	if c.LastUsedEvery == 0 {
		c.LastUsedEvery = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{meta: meta, ttl: c.CacheTTL, used: c.LastUsedEvery, log: c.Logger, now: time.Now,
		cache: map[string]cached{}, written: map[string]time.Time{}}
}

// Create makes a key and returns it (shown once: only its hash is kept)
// with its listing entry. tenant "" is auth.DefaultTenant; no scopes is
// runs.
func (s *Store) Create(ctx context.Context, name, tenant string, scopes []auth.Scope) (string, wire.Key, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 100 || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return "", wire.Key{}, fault.New(fault.BadInput, "a key's name must be 1-100 printable characters",
			"name the key for who or what uses it, e.g. --name ci-agent")
	}
	if tenant == "" {
		tenant = auth.DefaultTenant
	}
	if err := auth.CheckTenant(tenant); err != nil {
		return "", wire.Key{}, fault.Wrap(fault.BadInput, err, err.Error(), "use lower-case letters, digits and dashes, e.g. --tenant acme")
	}
	if len(scopes) == 0 {
		scopes = []auth.Scope{auth.Runs}
	}
	rec := record{Key: wire.Key{Name: name, Tenant: tenant, Created: s.now().UTC().Truncate(time.Second)}}
	for _, sc := range scopes {
		if _, err := auth.ParseScopes(string(sc)); err != nil {
			return "", wire.Key{}, fault.Wrap(fault.BadInput, err, err.Error(), "scopes are read, runs and admin")
		}
		rec.Scopes = append(rec.Scopes, string(sc))
	}
	secret := make([]byte, 32)
	salt := make([]byte, 16)
	rand.Read(secret)
	rand.Read(salt)
	sec := enc.EncodeToString(secret)
	rec.Salt = hex.EncodeToString(salt)
	rec.Hash = hash(salt, sec)
	for range 5 {
		id := make([]byte, 8)
		rand.Read(id)
		rec.ID = enc.EncodeToString(id)[:idLen]
		b, err := json.Marshal(rec)
		if err != nil {
			return "", wire.Key{}, err
		}
		_, err = s.meta.PutMeta(ctx, recordPrefix+rec.ID, b, tmpfs.Cond{IfAbsent: true})
		if errors.Is(err, tmpfs.ErrPrecondition) {
			continue // an id already taken: draw another
		}
		if err != nil {
			return "", wire.Key{}, storeErr(err)
		}
		s.mu.Lock()
		s.anyKeys, s.anyAt = true, s.now()
		s.mu.Unlock()
		return Prefix + rec.ID + "_" + sec, rec.Key, nil
	}
	return "", wire.Key{}, fault.New(fault.Internal, "could not draw an unused key id", "retry")
}

func hash(salt []byte, secret string) string {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte(secret))
	return hex.EncodeToString(h.Sum(nil))
}

// Errors Authenticate answers with; each is fault.Auth (401) with a
// suggestion.
var (
	errMissing = fault.New(fault.Auth, "no API key was sent",
		"send the header Authorization: Bearer trd_<id>_<secret>; an operator creates keys with: triad keys create --name NAME")
	errMalformed = fault.New(fault.Auth, "the API key is malformed",
		"send the whole key as triad keys create printed it: trd_, a 12-character id, _, and a 52-character secret")
	errUnknown = fault.New(fault.Auth, "the API key is not known to this server",
		"check that the key was copied whole; triad keys list shows the keys that exist, and triad keys create makes a new one")
)

// Missing is the error for a request that carries no key.
func Missing() error { return errMissing }

// Parse splits a key into its id and secret, or fails with a fault that
// says how a key looks.
func Parse(token string) (id, secret string, err error) {
	rest, ok := strings.CutPrefix(token, Prefix)
	if !ok {
		return "", "", errMalformed
	}
	id, secret, ok = strings.Cut(rest, "_")
	if !ok || len(id) != idLen || len(secret) != secretLen || !isBase32(id) || !isBase32(secret) {
		return "", "", errMalformed
	}
	return id, secret, nil
}

func isBase32(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// Authenticate checks a key and returns its principal. Every failure is
// fault.Auth with a suggestion: malformed, unknown (or a wrong secret,
// which is answered the same way), or revoked.
func (s *Store) Authenticate(ctx context.Context, token string) (auth.Principal, error) {
	if token == "" {
		return auth.Principal{}, errMissing
	}
	id, secret, err := Parse(token)
	if err != nil {
		return auth.Principal{}, err
	}
	rec, err := s.lookup(ctx, id)
	if err != nil {
		return auth.Principal{}, err
	}
	salt, _ := hex.DecodeString(rec.Salt)
	want, _ := hex.DecodeString(rec.Hash)
	got, _ := hex.DecodeString(hash(salt, secret))
	if subtle.ConstantTimeCompare(got, want) != 1 || len(want) == 0 {
		return auth.Principal{}, errUnknown
	}
	return s.Principal(ctx, id)
}

// Principal returns the principal of the key with this id, as
// Authenticate would for the key itself, for a caller who authenticated
// the key earlier and kept only its id (a console session). A revoked or
// unknown key is fault.Auth, within the cache's TTL of its revocation.
func (s *Store) Principal(ctx context.Context, id string) (auth.Principal, error) {
	rec, err := s.lookup(ctx, id)
	if err != nil {
		return auth.Principal{}, err
	}
	if rec.Revoked != nil {
		return auth.Principal{}, fault.New(fault.Auth, fmt.Sprintf("API key %s was revoked at %s", rec.ID, rec.Revoked.Format(time.RFC3339)),
			"ask an admin for a new key (triad keys create)")
	}
	s.touch(ctx, id)
	p := auth.Principal{KeyID: rec.ID, Name: rec.Name, Tenant: rec.Tenant}
	for _, sc := range rec.Scopes {
		p.Scopes = append(p.Scopes, auth.Scope(sc))
	}
	return p, nil
}

// lookup returns a key's record, from the cache while it is fresh.
func (s *Store) lookup(ctx context.Context, id string) (*record, error) {
	now := s.now()
	s.mu.Lock()
	c, ok := s.cache[id]
	s.mu.Unlock()
	if ok && now.Sub(c.at) < s.ttl {
		if c.rec == nil {
			return nil, errUnknown
		}
		return c.rec, nil
	}
	rec, err := s.get(ctx, id)
	if err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return nil, storeErr(err)
	}
	s.mu.Lock()
	if len(s.cache) >= maxCache {
		clear(s.cache)
	}
	s.cache[id] = cached{rec: rec, at: now}
	s.mu.Unlock()
	if rec == nil {
		return nil, errUnknown
	}
	return rec, nil
}

func (s *Store) get(ctx context.Context, id string) (*record, error) {
	b, _, err := s.meta.GetMeta(ctx, recordPrefix+id)
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("key %s: corrupt record: %w", id, err)
	}
	return &rec, nil
}

// touch records the key's use, at most once per LastUsedEvery.
func (s *Store) touch(ctx context.Context, id string) {
	now := s.now().UTC()
	s.mu.Lock()
	last, ok := s.written[id]
	if ok && s.used > 0 && now.Sub(last) < s.used {
		s.mu.Unlock()
		return
	}
	if len(s.written) >= maxCache {
		clear(s.written)
	}
	s.written[id] = now
	s.mu.Unlock()
	b, _ := json.Marshal(now)
	if _, err := s.meta.PutMeta(context.WithoutCancel(ctx), usedPrefix+id, b, tmpfs.Cond{}); err != nil {
		s.log.WarnContext(ctx, "record a key's last use", "key", id, "err", err)
	}
}

// List returns every key, revoked ones included, oldest first, with when
// each was last used.
func (s *Store) List(ctx context.Context) ([]wire.Key, error) {
	ids, err := s.meta.ListMeta(ctx, recordPrefix, "", 0)
	if err != nil {
		return nil, storeErr(err)
	}
	out := []wire.Key{}
	for _, k := range ids {
		id := strings.TrimPrefix(k, recordPrefix)
		rec, err := s.get(ctx, id)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, storeErr(err)
		}
		key := rec.Key
		if b, _, err := s.meta.GetMeta(ctx, usedPrefix+id); err == nil {
			var t time.Time
			if json.Unmarshal(b, &t) == nil {
				key.LastUsed = &t
			}
		}
		out = append(out, key)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// Revoke revokes a key: every replica refuses it within the cache TTL.
// Revoking a revoked key is not an error.
func (s *Store) Revoke(ctx context.Context, id string) (wire.Key, error) {
	notFound := fault.New(fault.NotFound, fmt.Sprintf("no key %q", id), "triad keys list (GET /keys) shows the keys' ids")
	if len(id) != idLen || !isBase32(id) {
		return wire.Key{}, notFound
	}
	for range 10 {
		b, v, err := s.meta.GetMeta(ctx, recordPrefix+id)
		if errors.Is(err, tmpfs.ErrNotFound) {
			return wire.Key{}, notFound
		}
		if err != nil {
			return wire.Key{}, storeErr(err)
		}
		var rec record
		if err := json.Unmarshal(b, &rec); err != nil {
			return wire.Key{}, fmt.Errorf("key %s: corrupt record: %w", id, err)
		}
		if rec.Revoked != nil {
			return rec.Key, nil
		}
		now := s.now().UTC().Truncate(time.Second)
		rec.Revoked = &now
		nb, _ := json.Marshal(rec)
		if _, err := s.meta.PutMeta(ctx, recordPrefix+id, nb, tmpfs.Cond{IfVersion: v}); errors.Is(err, tmpfs.ErrPrecondition) {
			continue
		} else if err != nil {
			return wire.Key{}, storeErr(err)
		}
		s.mu.Lock()
		delete(s.cache, id)
		s.mu.Unlock()
		return rec.Key, nil
	}
	return wire.Key{}, fault.New(fault.Conflict, "the key changed under every attempt to revoke it", "retry")
}

// Any reports whether any key was ever created (revoked ones count), read
// through at most once per cache TTL. A server on loopback runs open
// only while there is none.
func (s *Store) Any(ctx context.Context) (bool, error) {
	now := s.now()
	s.mu.Lock()
	if s.anyKeys || now.Sub(s.anyAt) < s.ttl {
		v := s.anyKeys
		s.mu.Unlock()
		return v, nil
	}
	s.mu.Unlock()
	ids, err := s.meta.ListMeta(ctx, recordPrefix, "", 1)
	if err != nil {
		return false, storeErr(err)
	}
	s.mu.Lock()
	s.anyKeys, s.anyAt = len(ids) > 0, now
	s.mu.Unlock()
	return len(ids) > 0, nil
}

func storeErr(err error) error {
	if fault.As(err) != nil {
		return err
	}
	if errors.Is(err, tmpfs.ErrUnavailable) {
		return fault.Wrap(fault.StoreUnavailable, err, "the store that keeps the API keys does not answer",
			"retry in a few seconds; GET /healthz shows the store's state")
	}
	return fault.Wrap(fault.Internal, err, "API key store error", "retry; if it persists, report it with the server log")
}
