package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/tmpfs"
)

// A blob file's fingerprint is what its stat says about its identity and
// its last change: device, inode, size, mtime and ctime. The store records
// it when it writes a blob (whose bytes it hashed as it wrote them) and
// when a read or fsck hashes the file whole and finds it good; a later
// open whose fingerprint is the recorded one is served without hashing.
// See docs/DECISIONS.md, "Verified once: a file's fingerprint", for what
// a fingerprint catches and what it does not.
type fingerprint struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds since the epoch
}

func (f fingerprint) String() string {
	return fmt.Sprintf("%d:%d:%d:%d:%d", f.dev, f.ino, f.size, f.mtime, f.ctime)
}

const fpMagic = "fp1 "

func parseFingerprint(s string) (fingerprint, bool) {
	s, ok := strings.CutPrefix(strings.TrimSuffix(s, "\n"), fpMagic)
	if !ok {
		return fingerprint{}, false
	}
	var f fingerprint
	n, err := fmt.Sscanf(s, "%d:%d:%d:%d:%d", &f.dev, &f.ino, &f.size, &f.mtime, &f.ctime)
	if err != nil || n != 5 || f.String() != s {
		return fingerprint{}, false
	}
	return f, true
}

// fingerprints keeps the fingerprint each blob had when last verified:
// one small file per blob under fingerprints/, so a restart keeps them,
// and a bounded cache of them in memory. The files are not fsynced: one
// lost in a crash costs a re-hash, and a torn one does not parse, so it
// costs the same.
type fingerprints struct {
	dir string // <data>/fingerprints
	tmp string // <data>/tmp
	// racy is how recent a ctime may be and still not be trusted: zero
	// where every change after a stat gets a new ctime (Linux 6.13+
	// multigrain timestamps on ext4, xfs, btrfs and tmpfs, probed at
	// start), else long enough to cover coarse timestamps.
	racy time.Duration

	mu    sync.Mutex
	cache map[tmpfs.Digest]fingerprint
}

// maxFingerprints bounds the in-memory cache; past it the cache starts
// over and the files answer. One entry per blob read, so it grows with
// work: kept small (TestRunMemory), a miss costs one small file read.
const maxFingerprints = 1 << 13

// racyWindow is how old a ctime must be before its fingerprint is trusted
// on a file system whose timestamps may not move on a change made within
// the same tick (a jiffy, or a whole second on some file systems).
const racyWindow = 2 * time.Second

func newFingerprints(dataDir, tmpDir string) (*fingerprints, error) {
	f := &fingerprints{dir: filepath.Join(dataDir, "fingerprints"), tmp: tmpDir, cache: map[tmpfs.Digest]fingerprint{}}
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", f.dir, err)
	}
	if !fineTimestamps(tmpDir) {
		f.racy = racyWindow
	}
	return f, nil
}

func (f *fingerprints) path(d tmpfs.Digest) string {
	h := d.String()
	return filepath.Join(f.dir, h[:2], h)
}

// get returns the fingerprint recorded for d, if any.
func (f *fingerprints) get(d tmpfs.Digest) (fingerprint, bool) {
	f.mu.Lock()
	fp, ok := f.cache[d]
	f.mu.Unlock()
	if ok {
		return fp, true
	}
	b, err := os.ReadFile(f.path(d))
	if err != nil {
		return fingerprint{}, false
	}
	fp, ok = parseFingerprint(string(b))
	if ok {
		f.remember(d, fp)
	}
	return fp, ok
}

func (f *fingerprints) remember(d tmpfs.Digest, fp fingerprint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.cache) >= maxFingerprints {
		clear(f.cache)
	}
	f.cache[d] = fp
}

// put records fp as verified for d, unless its ctime is too recent to be
// trusted on this file system (the next read then hashes again).
func (f *fingerprints) put(d tmpfs.Digest, fp fingerprint) error {
	if f.racy > 0 && time.Since(time.Unix(0, fp.ctime)) < f.racy {
		f.drop(d)
		return nil
	}
	p := f.path(d)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(f.tmp, "fp-*")
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(fpMagic + fp.String() + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		f.drop(d)
		return fmt.Errorf("record fingerprint of %s: %w", d.Short(), err)
	}
	f.remember(d, fp)
	return nil
}

// drop forgets d's fingerprint, so its next read hashes it.
func (f *fingerprints) drop(d tmpfs.Digest) {
	f.mu.Lock()
	delete(f.cache, d)
	f.mu.Unlock()
	if err := os.Remove(f.path(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A stale record is harmless: it names a file that no longer
		// has this fingerprint.
		return
	}
}

// fineTimestamps reports whether a file's ctime changes on every write
// that follows a stat, even within one clock tick, on the file system
// holding dir. It writes the same byte count twice around an fstat, a few
// times: on kernels with multigrain timestamps the second write always
// gets a new ctime; on coarse ones two writes within a tick (microseconds
// apart here) share one. Any failure answers false, the cautious answer.
func fineTimestamps(dir string) bool {
	f, err := os.CreateTemp(dir, "probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(f.Name())
	defer f.Close()
	ctime := func() (int64, bool) {
		st, err := f.Stat()
		if err != nil {
			return 0, false
		}
		fp, ok := fingerprintOf(st)
		return fp.ctime, ok
	}
	for i := range 16 {
		if _, err := f.WriteAt([]byte{byte(i)}, 0); err != nil {
			return false
		}
		a, ok := ctime()
		if !ok {
			return false
		}
		if _, err := f.WriteAt([]byte{byte(i + 1)}, 0); err != nil {
			return false
		}
		b, ok := ctime()
		if !ok || a == b {
			return false
		}
	}
	return true
}
