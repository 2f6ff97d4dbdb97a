package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/triadhq/triad/tmpfs"
)

// The Index keeps the store's records outside runs (tmpfs.Meta) as files
// under <data>/meta/, one per key, named <key>! so that a key and a key
// below it ("a" and "a/b") never clash as file and directory (the same
// naming as tmpfs/s3; see there). Mutations
// hold an flock on meta/.lock, so the server and a `triad keys` command on
// the same data directory never interleave a conditional write. A record's
// version is a hash of its bytes.
var _ tmpfs.Meta = (*Index)(nil)

const recExt = "!"

func (x *Index) metaDir() string { return filepath.Join(filepath.Dir(x.dir), "meta") }

func (x *Index) metaPath(key string) string {
	return filepath.Join(x.metaDir(), filepath.FromSlash(key)+recExt)
}

func version(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// lockMeta takes the namespace's mutation lock.
func (x *Index) lockMeta() (func(), error) {
	if err := os.MkdirAll(x.metaDir(), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(x.metaDir(), ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock meta: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// GetMeta implements tmpfs.Meta.
func (x *Index) GetMeta(ctx context.Context, key string) ([]byte, string, error) {
	b, err := os.ReadFile(x.metaPath(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: meta %s", tmpfs.ErrNotFound, key)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read meta %s: %w", key, err)
	}
	return b, version(b), nil
}

// PutMeta implements tmpfs.Meta: the record is written to a temp file,
// fsynced and renamed into place under the lock.
func (x *Index) PutMeta(ctx context.Context, key string, value []byte, cond tmpfs.Cond) (string, error) {
	unlock, err := x.lockMeta()
	if err != nil {
		return "", err
	}
	defer unlock()
	p := x.metaPath(key)
	if cond.IfAbsent || cond.IfVersion != "" {
		old, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if cond.IfVersion != "" {
				return "", fmt.Errorf("%w: meta %s does not exist", tmpfs.ErrPrecondition, key)
			}
		case err != nil:
			return "", err
		case cond.IfAbsent:
			return "", fmt.Errorf("%w: meta %s exists", tmpfs.ErrPrecondition, key)
		case version(old) != cond.IfVersion:
			return "", fmt.Errorf("%w: meta %s changed", tmpfs.ErrPrecondition, key)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".put-*")
	if err != nil {
		return "", err
	}
	_, err = tmp.Write(value)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("write meta %s: %w", key, err)
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		return "", err
	}
	return version(value), nil
}

// DeleteMeta implements tmpfs.Meta.
func (x *Index) DeleteMeta(ctx context.Context, key string) error {
	unlock, err := x.lockMeta()
	if err != nil {
		return err
	}
	defer unlock()
	err = os.Remove(x.metaPath(key))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: meta %s", tmpfs.ErrNotFound, key)
	}
	return err
}

// ListMeta implements tmpfs.Meta. It walks the directory the prefix
// names (or its parent, for a prefix that ends inside a segment).
func (x *Index) ListMeta(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	dirKey := prefix
	if i := strings.LastIndexByte(dirKey, '/'); i >= 0 {
		dirKey = dirKey[:i]
	} else {
		dirKey = ""
	}
	root := x.metaDir()
	start := filepath.Join(root, filepath.FromSlash(dirKey))
	var keys []string
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipAll
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, recExt) || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		k := strings.TrimSuffix(filepath.ToSlash(rel), recExt)
		if strings.HasPrefix(k, prefix) && k > after {
			keys = append(keys, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list meta %s: %w", prefix, err)
	}
	sort.Strings(keys)
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	return keys, nil
}
