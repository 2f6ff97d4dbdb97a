// Package session keeps the web console's sign-in sessions on the server, in the store's records, so a browser holds a random session id in a cookie and never the API key.
//
// A session is made when a person signs in with an API key. It records
// the key's id (never the key), a CSRF token and an expiry, under
// sessions/<sha256 of the session id>: the id itself is not stored, so
// whoever reads the store's records cannot take over a session. Every
// request resolves the session to the key's principal afresh, so a
// revoked key ends its sessions within the key cache's TTL. Replicas
// sharing a store share the sessions. See docs/DECISIONS.md, "The web
// console".
package session

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
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/tmpfs"
)

// CookieName is the session cookie's name.
const CookieName = "triad_session"

// CSRFHeader carries the session's CSRF token on every state-changing
// request a signed-in browser makes.
const CSRFHeader = "X-CSRF-Token"

const (
	recordPrefix = "sessions/"
	idBytes      = 32
)

var enc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Keys resolves a key id to its principal, refusing a revoked key
// (auth/keys.Store does).
type Keys interface {
	Principal(ctx context.Context, keyID string) (auth.Principal, error)
}

// Config tunes a Store.
type Config struct {
	// TTL is a session's lifetime from sign-in (default 12 h).
	TTL time.Duration
	// CacheTTL is how long a session read from the store is trusted: a
	// sign-out on another replica takes effect within it (default 2 s).
	CacheTTL time.Duration
	Logger   *slog.Logger
}

// Session is one sign-in.
type Session struct {
	// ID is the cookie's value. Only its hash is stored.
	ID string `json:"-"`
	// KeyID is the API key the person signed in with.
	KeyID string `json:"key_id"`
	// CSRF is the token state-changing requests must carry in CSRFHeader
	// (or a form's csrf field).
	CSRF    string    `json:"csrf"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// CheckCSRF reports whether tok is the session's CSRF token, in constant
// time.
func (s Session) CheckCSRF(tok string) bool {
	return s.CSRF != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.CSRF)) == 1
}

// Store creates, resolves and ends sessions.
type Store struct {
	meta  tmpfs.Meta
	keys  Keys
	ttl   time.Duration
	cache time.Duration
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	cached map[string]cached // by stored key
	swept  time.Time
}

type cached struct {
	s  *Session // nil: none
	at time.Time
}

// maxCache bounds the cache; past it, it starts over.
const maxCache = 10000

// New returns a Store over meta that resolves keys with keys.
func New(meta tmpfs.Meta, keys Keys, c Config) *Store {
	if c.TTL <= 0 {
		c.TTL = 12 * time.Hour
	}
	if c.CacheTTL <= 0 {
		c.CacheTTL = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{meta: meta, keys: keys, ttl: c.TTL, cache: c.CacheTTL, log: c.Logger, now: time.Now, cached: map[string]cached{}}
}

// TTL is a session's lifetime.
func (s *Store) TTL() time.Duration { return s.ttl }

// ErrNoSession is the answer for a cookie that names no live session:
// never made, expired, or signed out.
var ErrNoSession = fault.New(fault.Auth, "your console session has expired or was signed out",
	"sign in again with your API key")

func storedKey(id string) string {
	h := sha256.Sum256([]byte(id))
	return recordPrefix + hex.EncodeToString(h[:])
}

// Create starts a session for p, a principal authenticated by an API key.
func (s *Store) Create(ctx context.Context, p auth.Principal) (Session, error) {
	if p.KeyID == "" {
		return Session{}, errors.New("session: only an API key's principal signs in")
	}
	s.sweep(ctx)
	raw := make([]byte, idBytes)
	csrf := make([]byte, idBytes)
	rand.Read(raw)
	rand.Read(csrf)
	now := s.now().UTC()
	sess := Session{ID: enc.EncodeToString(raw), KeyID: p.KeyID, CSRF: enc.EncodeToString(csrf),
		Created: now, Expires: now.Add(s.ttl)}
	b, _ := json.Marshal(sess)
	if _, err := s.meta.PutMeta(ctx, storedKey(sess.ID), b, tmpfs.Cond{IfAbsent: true}); err != nil {
		return Session{}, storeErr(err)
	}
	s.remember(storedKey(sess.ID), &sess)
	return sess, nil
}

// Resolve returns the live session a cookie names and the principal it
// acts as: its key's, as the key is now. A session that does not exist,
// has expired, or whose key was revoked is fault.Auth.
func (s *Store) Resolve(ctx context.Context, id string) (Session, auth.Principal, error) {
	if len(id) != enc.EncodedLen(idBytes) {
		return Session{}, auth.Principal{}, ErrNoSession
	}
	k := storedKey(id)
	now := s.now()
	s.mu.Lock()
	c, ok := s.cached[k]
	s.mu.Unlock()
	if !ok || now.Sub(c.at) >= s.cache {
		b, _, err := s.meta.GetMeta(ctx, k)
		switch {
		case errors.Is(err, tmpfs.ErrNotFound):
			c.s = nil
		case err != nil:
			return Session{}, auth.Principal{}, storeErr(err)
		default:
			var sess Session
			if err := json.Unmarshal(b, &sess); err != nil {
				return Session{}, auth.Principal{}, fmt.Errorf("session: corrupt record: %w", err)
			}
			c.s = &sess
		}
		s.remember(k, c.s)
	}
	if c.s == nil {
		return Session{}, auth.Principal{}, ErrNoSession
	}
	sess := *c.s
	sess.ID = id
	if !now.Before(sess.Expires) {
		s.Delete(context.WithoutCancel(ctx), id)
		return Session{}, auth.Principal{}, ErrNoSession
	}
	p, err := s.keys.Principal(ctx, sess.KeyID)
	if err != nil {
		return Session{}, auth.Principal{}, err
	}
	return sess, p, nil
}

// Delete ends a session (sign-out). Ending one that does not exist is
// not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	k := storedKey(id)
	s.remember(k, nil)
	if err := s.meta.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return storeErr(err)
	}
	return nil
}

func (s *Store) remember(k string, sess *Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cached) >= maxCache {
		clear(s.cached)
	}
	s.cached[k] = cached{s: sess, at: s.now()}
}

// sweep deletes expired sessions, at most once an hour per process, so
// sessions nobody signed out of do not pile up in the store.
func (s *Store) sweep(ctx context.Context) {
	s.mu.Lock()
	if s.now().Sub(s.swept) < time.Hour {
		s.mu.Unlock()
		return
	}
	s.swept = s.now()
	s.mu.Unlock()
	keys, err := s.meta.ListMeta(ctx, recordPrefix, "", 0)
	if err != nil {
		s.log.WarnContext(ctx, "list sessions to sweep", "err", err)
		return
	}
	for _, k := range keys {
		b, _, err := s.meta.GetMeta(ctx, k)
		if err != nil {
			continue
		}
		var sess Session
		if json.Unmarshal(b, &sess) == nil && s.now().After(sess.Expires) {
			s.meta.DeleteMeta(ctx, k)
		}
	}
}

func storeErr(err error) error {
	return fault.Wrap(fault.StoreUnavailable, err, "the console's sessions could not be read or written",
		"retry in a few seconds; GET /healthz shows the store's state")
}
