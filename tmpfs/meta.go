package tmpfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Meta holds Triad's own small records that belong to no run: API keys,
// share links, the server's signing secret, run owners and each tenant's
// run index. It is a namespace of its own beside the runs' indexes: no run
// path reaches it, so no tool (tmp.*, files_in, a cell) can read or write
// it.
//
// Unlike a run's index, Meta is never cached: every call reads through to
// the backing store, so replicas that share a store see each other's
// writes at once (a key revoked on one is refused by the others). Writes
// may be conditional (Cond), which is how replicas agree without a lock
// service: the first to create a record wins, and a read-modify-write
// retries when another writer got there first.
type Meta interface {
	// GetMeta returns the record at key and its version, or ErrNotFound.
	GetMeta(ctx context.Context, key string) ([]byte, string, error)
	// PutMeta writes value at key if cond holds, else returns
	// ErrPrecondition, and returns the record's new version.
	PutMeta(ctx context.Context, key string, value []byte, cond Cond) (string, error)
	// DeleteMeta removes the record at key, or returns ErrNotFound.
	DeleteMeta(ctx context.Context, key string) error
	// ListMeta returns, in byte order, up to limit keys that start with
	// prefix and sort after after ("" for the first page); limit <= 0
	// means all of them.
	ListMeta(ctx context.Context, prefix, after string, limit int) ([]string, error)
}

// Cond is the condition of a PutMeta. The zero Cond always writes.
type Cond struct {
	// IfAbsent writes only if no record exists at the key.
	IfAbsent bool
	// IfVersion, when set, writes only if the record's version is this
	// one (as GetMeta or PutMeta returned it).
	IfVersion string
}

// ErrPrecondition means a conditional write found the record in another
// state than its Cond asked for: someone else wrote it first. Read it
// again and retry, or give up if it was a create.
var ErrPrecondition = errors.New("tmpfs: conditional write lost to another writer")

// MaxMetaKey bounds a Meta key.
const MaxMetaKey = 512

// MaxMetaValue bounds a Meta record: records are small JSON documents.
const MaxMetaValue = 1 << 20

// CheckMetaKey validates a Meta key: segments of [A-Za-z0-9._-] (run ids
// appear in keys as they are) joined by
// "/", none empty, none "." or "..". Keys are built by Triad, never taken
// from a caller whole, so a bad key is a bug; the check keeps a bug from
// reaching outside the namespace on disk.
func CheckMetaKey(key string) error {
	if key == "" || len(key) > MaxMetaKey {
		return fmt.Errorf("tmpfs: meta key %q: want 1-%d bytes", key, MaxMetaKey)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("tmpfs: meta key %q: empty, . or .. segment", key)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("tmpfs: meta key %q: byte %q outside [A-Za-z0-9._-/]", key, c)
			}
		}
	}
	return nil
}

// checkMetaPrefix validates a listing prefix: a key, or a key and a
// trailing "/", or "".
func checkMetaPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return CheckMetaKey(strings.TrimSuffix(prefix, "/"))
}

// Meta returns the store's namespace for Triad's own records. Every index
// Triad ships (tmpfs/local, tmpfs/s3) keeps one beside the runs; an index
// that does not yields a Meta whose every call fails with ErrUnavailable.
func (s *Store) Meta() Meta { return s.meta }

// checkedMeta validates keys before they reach an implementation.
type checkedMeta struct{ m Meta }

func (c checkedMeta) GetMeta(ctx context.Context, key string) ([]byte, string, error) {
	if err := CheckMetaKey(key); err != nil {
		return nil, "", err
	}
	return c.m.GetMeta(ctx, key)
}

func (c checkedMeta) PutMeta(ctx context.Context, key string, value []byte, cond Cond) (string, error) {
	if err := CheckMetaKey(key); err != nil {
		return "", err
	}
	if len(value) > MaxMetaValue {
		return "", fmt.Errorf("%w: meta record %s is %d bytes, over %d", ErrTooLarge, key, len(value), MaxMetaValue)
	}
	return c.m.PutMeta(ctx, key, value, cond)
}

func (c checkedMeta) DeleteMeta(ctx context.Context, key string) error {
	if err := CheckMetaKey(key); err != nil {
		return err
	}
	return c.m.DeleteMeta(ctx, key)
}

func (c checkedMeta) ListMeta(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if err := checkMetaPrefix(prefix); err != nil {
		return nil, err
	}
	return c.m.ListMeta(ctx, prefix, after, limit)
}

// noMeta is the Meta of an index that keeps none.
type noMeta struct{}

var errNoMeta = fmt.Errorf("%w: this store's index keeps no records outside runs", ErrUnavailable)

func (noMeta) GetMeta(context.Context, string) ([]byte, string, error) { return nil, "", errNoMeta }
func (noMeta) PutMeta(context.Context, string, []byte, Cond) (string, error) {
	return "", errNoMeta
}
func (noMeta) DeleteMeta(context.Context, string) error { return errNoMeta }
func (noMeta) ListMeta(context.Context, string, string, int) ([]string, error) {
	return nil, errNoMeta
}

// StoredSecret returns the 32 random bytes kept hex-encoded in the JSON
// field named field of the record at key, drawing and storing them if
// there is none. Replicas starting at once agree: each tries to create
// the record (IfAbsent), and the losers read the winner's. The share
// links' secret and the records' sealing key are drawn this way.
func StoredSecret(ctx context.Context, meta Meta, key, field string) ([]byte, error) {
	for range 3 {
		b, _, err := meta.GetMeta(ctx, key)
		if err == nil {
			var r map[string]string
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			return hex.DecodeString(r[field])
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		s := make([]byte, 32)
		if _, err := rand.Read(s); err != nil {
			return nil, err
		}
		nb, err := json.Marshal(map[string]string{field: hex.EncodeToString(s)})
		if err != nil {
			return nil, err
		}
		if _, err := meta.PutMeta(ctx, key, nb, Cond{IfAbsent: true}); err == nil {
			return s, nil
		} else if !errors.Is(err, ErrPrecondition) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%s: could not read or create the secret", key)
}
