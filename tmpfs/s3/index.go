package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Index keeps each run's index in the bucket, one JSON object per entry
// under runs/<run>/index/, and serves reads from a per-run cache loaded on
// the run's first use (see the package comment for the single-process
// assumption). Like tmpfs/local, it keeps every run it has seen in memory.
type Index struct {
	c *conn

	mu   sync.Mutex
	runs map[runid.ID]*runIndex

	// stripes serialize mutations of one path, across the object write and
	// the cache update, so the cache ends in the same state as the bucket
	// when two writers race on a path. Different paths rarely share a stripe.
	seed    maphash.Seed
	stripes [64]sync.Mutex
}

var _ tmpfs.Index = (*Index)(nil)

type runIndex struct {
	load   sync.Mutex // held while the run is read from the bucket
	loaded bool       // under load

	mu    sync.Mutex // guards files
	files map[string]tmpfs.File
}

func newIndex(c *conn) *Index {
	return &Index{c: c, runs: map[runid.ID]*runIndex{}, seed: maphash.MakeSeed()}
}

func runPrefix(run runid.ID) string { return "runs/" + run.String() + "/index/" }

// entryKey names path's entry. Hashing the path keeps keys short and free of
// the path's structure (see the package comment).
func entryKey(run runid.ID, path string) string {
	sum := sha256.Sum256([]byte(path))
	return runPrefix(run) + hex.EncodeToString(sum[:])
}

func (x *Index) stripe(run runid.ID, path string) *sync.Mutex {
	var h maphash.Hash
	h.SetSeed(x.seed)
	h.WriteString(run.String())
	h.WriteByte(0)
	h.WriteString(path)
	return &x.stripes[h.Sum64()%uint64(len(x.stripes))]
}

// Forget implements tmpfs.Forgetter: the run's cache goes, and its next use
// loads it from the bucket again. Several replicas writing one bucket call
// it whenever another replica may have written the run (orchestrator's run
// lock says when).
func (x *Index) Forget(run runid.ID) {
	x.mu.Lock()
	delete(x.runs, run)
	x.mu.Unlock()
}

var _ tmpfs.Forgetter = (*Index)(nil)

// run returns the run's cache, loading it from the bucket on first use. A
// failed load is not cached: the next call tries again.
func (x *Index) run(ctx context.Context, run runid.ID) (*runIndex, error) {
	x.mu.Lock()
	r, ok := x.runs[run]
	if !ok {
		r = &runIndex{}
		x.runs[run] = r
	}
	x.mu.Unlock()
	r.load.Lock()
	defer r.load.Unlock()
	if r.loaded {
		return r, nil
	}
	files, err := x.fetch(ctx, run)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.files = files
	r.mu.Unlock()
	r.loaded = true
	return r, nil
}

// fetch reads a run's entries from the bucket: one listing, then the entry
// objects with a bounded number of GETs in flight.
func (x *Index) fetch(ctx context.Context, run runid.ID) (map[string]tmpfs.File, error) {
	start := time.Now()
	lctx, cancel := x.c.withTimeout(ctx)
	var keys []string
	var lerr error
	for obj := range x.c.core.ListObjectsIter(lctx, x.c.bucket, minio.ListObjectsOptions{Prefix: runPrefix(run), Recursive: true}) {
		if obj.Err != nil {
			lerr = obj.Err
			break
		}
		keys = append(keys, obj.Key)
	}
	cancel()
	if lerr != nil {
		return nil, x.c.fail(ctx, "list index of run "+run.String(), lerr)
	}

	files := make(map[string]tmpfs.File, len(keys))
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, loadWorkers)
	)
	for _, key := range keys {
		sem <- struct{}{}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f, err := x.getEntry(ctx, run, key)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				files[f.Path] = f
			case errors.Is(err, tmpfs.ErrNotFound):
				// Deleted between the listing and the GET.
			case errors.Is(err, errCorrupt):
				// One damaged entry must not make the whole run unreadable;
				// the file drops out of the listing and the damage is logged.
				x.c.log.ErrorContext(ctx, "skipping a corrupt index entry", "run", run.String(), "key", key, "err", err)
			default:
				if firstErr == nil {
					firstErr = err
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	x.c.log.DebugContext(ctx, "loaded run index", "run", run.String(), "entries", len(files), "took", time.Since(start))
	return files, nil
}

// errCorrupt marks an entry object that does not decode to a file whose
// path hashes to its key.
var errCorrupt = errors.New("corrupt index entry")

// maxEntry bounds an entry object: a path of at most 1 KiB plus a few fields.
const maxEntry = 16 << 10

func (x *Index) getEntry(ctx context.Context, run runid.ID, key string) (tmpfs.File, error) {
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	body, _, _, err := x.c.core.GetObject(tctx, x.c.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return tmpfs.File{}, x.c.fail(ctx, "read index entry "+key, err)
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxEntry+1))
	if err != nil {
		return tmpfs.File{}, x.c.fail(ctx, "read index entry "+key, err)
	}
	var f tmpfs.File
	if err := json.Unmarshal(b, &f); err != nil || len(b) > maxEntry {
		return tmpfs.File{}, fmt.Errorf("%w %s: not a JSON file entry: %v", errCorrupt, key, err)
	}
	if f.SHA256.IsZero() || f.Path == "" || key != entryKey(run, f.Path) {
		return tmpfs.File{}, fmt.Errorf("%w %s: entry for path %q does not belong at this key", errCorrupt, key, f.Path)
	}
	return f, nil
}

// Get implements tmpfs.Index.
func (x *Index) Get(ctx context.Context, run runid.ID, path string) (tmpfs.File, error) {
	r, err := x.run(ctx, run)
	if err != nil {
		return tmpfs.File{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.files[path]
	if !ok {
		return tmpfs.File{}, fmt.Errorf("%w: %q in run %s", tmpfs.ErrNotFound, path, run)
	}
	return f, nil
}

// Put implements tmpfs.Index. It is durable when it returns: the entry is
// an object in the bucket.
func (x *Index) Put(ctx context.Context, run runid.ID, f tmpfs.File) error {
	r, err := x.run(ctx, run)
	if err != nil {
		return err
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	mu := x.stripe(run, f.Path)
	mu.Lock()
	defer mu.Unlock()
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	_, err = x.c.core.PutObject(tctx, x.c.bucket, entryKey(run, f.Path), bytes.NewReader(b), int64(len(b)), "", hex.EncodeToString(sum[:]),
		minio.PutObjectOptions{ContentType: "application/json", DisableContentSha256: true})
	if err != nil {
		return x.c.fail(ctx, fmt.Sprintf("write index entry %q of run %s", f.Path, run), err)
	}
	r.mu.Lock()
	r.files[f.Path] = f
	r.mu.Unlock()
	return nil
}

// Delete implements tmpfs.Index.
func (x *Index) Delete(ctx context.Context, run runid.ID, path string) error {
	r, err := x.run(ctx, run)
	if err != nil {
		return err
	}
	mu := x.stripe(run, path)
	mu.Lock()
	defer mu.Unlock()
	r.mu.Lock()
	_, ok := r.files[path]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q in run %s", tmpfs.ErrNotFound, path, run)
	}
	tctx, cancel := x.c.withTimeout(ctx)
	defer cancel()
	if err := x.c.core.RemoveObject(tctx, x.c.bucket, entryKey(run, path), minio.RemoveObjectOptions{}); err != nil {
		return x.c.fail(ctx, fmt.Sprintf("delete index entry %q of run %s", path, run), err)
	}
	r.mu.Lock()
	delete(r.files, path)
	r.mu.Unlock()
	return nil
}

// List implements tmpfs.Index.
func (x *Index) List(ctx context.Context, run runid.ID, prefix string) ([]tmpfs.File, error) {
	r, err := x.run(ctx, run)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	out := make([]tmpfs.File, 0, len(r.files))
	for p, f := range r.files {
		if strings.HasPrefix(p, prefix) {
			out = append(out, f)
		}
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Close drops the client's idle connections. It is safe to call twice.
func (x *Index) Close() error {
	x.c.closeIdle()
	return nil
}
