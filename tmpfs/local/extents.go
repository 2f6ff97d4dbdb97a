package local

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/triadhq/triad/tmpfs"
)

// Appended blobs (tmpfs.Appender) live in extents: append-only files that
// only ever grow. A blob made by an append is a prefix of its chain's
// extent, named by a small ref file:
//
//	extents/<chain>-<gen>          the bytes, appended in place, never rewritten
//	extents/refs/ab/abcdef…        {"extent","size","state"}: blob abcdef… is the
//	                               first size bytes of extent, and state is the
//	                               sha256 midstate after them
//
// So an append writes its new bytes and one ref, whatever the file's size,
// and every earlier version stays readable as a shorter prefix (journal
// checkpoints are free). An extent is never truncated: when a chain's
// base is not its extent's end (the file was rewritten, or a crash left
// bytes past the last ref), the chain starts a new extent from the base's
// bytes, once. See "Appending to a content-addressed store" in
// docs/DECISIONS.md.

// ref is one appended blob's location.
type ref struct {
	Extent string `json:"extent"`
	Size   int64  `json:"size"`
	State  []byte `json:"state"` // sha256 midstate after Size bytes
}

// chainState is where a chain's last append ended.
type chainState struct {
	extent string
	size   int64
	digest tmpfs.Digest
	state  []byte
}

// maxChains bounds the chains kept in memory; past it they start over. A
// chain not kept resumes from its last ref on disk, at the end of the same
// extent (resume), so forgetting costs one small read, never a copy.
const maxChains = 1 << 12

// extents keeps the chains this process has appended to.
type extents struct {
	mu     sync.Mutex
	chains map[string]*chainState
}

var _ tmpfs.Appender = (*Blobs)(nil)

func (b *Blobs) extentDir() string { return filepath.Join(b.dir, "extents") }

func (b *Blobs) extentPath(id string) string { return filepath.Join(b.extentDir(), id) }

func (b *Blobs) refPath(d tmpfs.Digest) string {
	h := d.String()
	return filepath.Join(b.extentDir(), "refs", h[:2], h)
}

// chainKey names a chain's extents: a hash, since a chain (run and path)
// may be long and hold any byte a path may.
func chainKey(chain string) string {
	sum := sha256.Sum256([]byte(chain))
	return hex.EncodeToString(sum[:16])
}

// Append implements tmpfs.Appender.
func (b *Blobs) Append(ctx context.Context, base tmpfs.Digest, baseSize int64, tail []byte, chain string) (tmpfs.Digest, int64, error) {
	if len(tail) == 0 {
		return tmpfs.Digest{}, 0, fmt.Errorf("%w: nothing to append", errors.ErrUnsupported)
	}
	defer b.pins.Write()()
	key := chainKey(chain)
	b.ext.mu.Lock()
	if b.ext.chains == nil {
		b.ext.chains = map[string]*chainState{}
	}
	st := b.ext.chains[key]
	b.ext.mu.Unlock()
	// A base that fsck quarantined (another process, say `triad fsck`
	// beside a server) is not built upon from this process's memory of
	// the chain: resume finds out whether a true copy came back.
	if st != nil && !base.IsZero() && b.quarantined(base) {
		st = nil
	}
	if st == nil || st.digest != base || st.size != baseSize {
		var err error
		if st, err = b.resume(ctx, key, base, baseSize); err != nil {
			return tmpfs.Digest{}, 0, err
		}
	}
	h, err := tmpfs.ResumeHash(st.state)
	if err != nil {
		return tmpfs.Digest{}, 0, err
	}
	f, err := os.OpenFile(b.extentPath(st.extent), os.O_WRONLY, 0)
	if err != nil {
		return tmpfs.Digest{}, 0, fmt.Errorf("open extent: %w", err)
	}
	_, err = f.WriteAt(tail, st.size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// Bytes past the last ref may have landed: the chain's next
		// append sees a longer extent and starts a new one.
		b.forget(key)
		return tmpfs.Digest{}, 0, fmt.Errorf("append to extent: %w", err)
	}
	h.Write(tail)
	d := tmpfs.DigestFromHash(h)
	state, err := tmpfs.HashState(h)
	if err != nil {
		return tmpfs.Digest{}, 0, err
	}
	next := &chainState{extent: st.extent, size: st.size + int64(len(tail)), digest: d, state: state}
	if err := b.writeRef(d, ref{Extent: next.extent, Size: next.size, State: state}); err != nil {
		b.forget(key)
		return tmpfs.Digest{}, 0, err
	}
	b.ext.mu.Lock()
	if len(b.ext.chains) >= maxChains {
		clear(b.ext.chains)
	}
	b.ext.chains[key] = next
	b.ext.mu.Unlock()
	return d, next.size, nil
}

func (b *Blobs) forget(key string) {
	b.ext.mu.Lock()
	delete(b.ext.chains, key)
	b.ext.mu.Unlock()
}

// resume finds where a chain continues from base: the end of base's own
// extent when base is its chain's last append (after a restart), or else
// a new extent holding a copy of base's bytes.
func (b *Blobs) resume(ctx context.Context, key string, base tmpfs.Digest, baseSize int64) (*chainState, error) {
	if !base.IsZero() {
		if r, err := b.readRef(base); err == nil && r.Size == baseSize && strings.HasPrefix(r.Extent, key+"-") {
			if fi, err := os.Stat(b.extentPath(r.Extent)); err == nil && fi.Size() == r.Size {
				return &chainState{extent: r.Extent, size: r.Size, digest: base, state: r.State}, nil
			}
		}
	}
	if err := os.MkdirAll(b.extentDir(), 0o700); err != nil {
		return nil, err
	}
	var gen [6]byte
	rand.Read(gen[:])
	id := key + "-" + hex.EncodeToString(gen[:])
	f, err := os.OpenFile(b.extentPath(id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create extent: %w", err)
	}
	st := &chainState{extent: id, digest: base}
	h := tmpfs.NewHasher()
	if !base.IsZero() {
		// Copy base in, hashing as it goes: the one time this chain reads
		// its earlier bytes. A base that does not match its digest is
		// not built upon.
		src, err := b.Open(ctx, base)
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, err
		}
		n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(src, baseSize+1))
		src.Close()
		if err == nil && (n != baseSize || tmpfs.DigestFromHash(h) != base) {
			err = fmt.Errorf("%w: blob %s", tmpfs.ErrDigestMismatch, base)
		}
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, fmt.Errorf("start extent from %s: %w", base.Short(), err)
		}
		st.size = n
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(b.extentDir())
	}
	if err != nil {
		return nil, fmt.Errorf("create extent: %w", err)
	}
	if st.state, err = tmpfs.HashState(h); err != nil {
		return nil, err
	}
	return st, nil
}

// writeRef records where blob d lives, durably, unless d is stored
// already (as a blob file or another ref): content addressing makes any
// stored copy as good as another. The ref is written in place (a ref is
// small, and a torn one, from a crash mid-write, does not parse and is
// written again), then its directory is synced.
func (b *Blobs) writeRef(d tmpfs.Digest, r ref) error {
	b.pins.Note(d)
	if _, err := os.Stat(b.path(d)); err == nil {
		return b.freshen(d)
	}
	p := b.refPath(d)
	if _, err := b.readRef(d); err == nil {
		return b.freshen(d)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if errors.Is(err, fs.ErrExist) {
		// A torn ref (readRef failed on it): replace it. Removing only
		// then spares every new ref two failing syscalls.
		os.Remove(p)
		f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	}
	if err != nil {
		return fmt.Errorf("write ref of %s: %w", d.Short(), err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p)
		return fmt.Errorf("write ref of %s: %w", d.Short(), err)
	}
	return syncDir(filepath.Dir(p))
}

func (b *Blobs) readRef(d tmpfs.Digest) (ref, error) {
	var r ref
	data, err := os.ReadFile(b.refPath(d))
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("%w: blob %s", tmpfs.ErrNotFound, d)
	}
	if err != nil {
		return r, fmt.Errorf("read ref of %s: %w", d.Short(), err)
	}
	if err := json.Unmarshal(data, &r); err != nil || r.Size < 0 || r.Extent == "" || strings.ContainsAny(r.Extent, `/\`) || r.Extent[0] == '.' {
		return r, fmt.Errorf("%w: ref of blob %s is damaged", tmpfs.ErrDigestMismatch, d)
	}
	return r, nil
}

// openExtent opens an appended blob: a prefix of its extent. Its version
// names the extent file as it stands (device, inode, size, change times),
// so a cached verification does not outlive any change to it, appends
// included.
func (b *Blobs) openExtent(d tmpfs.Digest) (tmpfs.Blob, error) {
	r, err := b.readRef(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(b.extentPath(r.Extent))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: extent of blob %s", tmpfs.ErrNotFound, d)
	}
	if err != nil {
		return nil, fmt.Errorf("open extent of %s: %w", d.Short(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.Size() < r.Size {
		f.Close()
		return nil, fmt.Errorf("%w: blob %s: its extent is shorter than the blob", tmpfs.ErrDigestMismatch, d)
	}
	version := fmt.Sprintf("x%d-%d-%d", r.Size, fi.Size(), fi.ModTime().UnixNano())
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		version += fmt.Sprintf("-%d-%d-%d", sys.Dev, sys.Ino, sys.Ctim.Nano())
	}
	return &extentBlob{SectionReader: io.NewSectionReader(f, 0, r.Size), f: f, version: version}, nil
}

type extentBlob struct {
	*io.SectionReader
	f       *os.File
	version string
}

func (e *extentBlob) Version() string { return e.version }
func (e *extentBlob) Close() error    { return e.f.Close() }

// statExtent returns an appended blob's size.
func (b *Blobs) statExtent(d tmpfs.Digest) (int64, error) {
	r, err := b.readRef(d)
	if err != nil {
		return 0, err
	}
	return r.Size, nil
}
