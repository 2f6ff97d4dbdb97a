package tmpfs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Blobs are shared by every run that holds the same bytes, so deleting a
// run deletes only its index; the bytes go when no run holds them, in a
// collection (Store.Collect): mark every blob some run's index names,
// then sweep what is stored but unmarked and was last stored or touched
// before a cutoff (the grace period). See docs/DECISIONS.md, "Deleting
// runs and collecting blobs".

// Collectable is the optional ability of a Blobs that Store.Collect
// needs. Its writes (Put, Append) and Touch record when each blob was last
// stored, durably (a file's mtime, an object's LastModified: a dedup hit
// refreshes it), and in memory for this process (Pins), so a blob that a
// write in progress is about to link is never swept.
type Collectable interface {
	// WalkStored calls fn for each stored blob, ordinary and appended.
	WalkStored(ctx context.Context, fn func(StoredBlob) error) error
	// Needs returns the other blobs the stored form of blob d reads (an
	// S3 appended blob reads its base); d was reported Appended.
	Needs(ctx context.Context, d Digest) ([]Digest, error)
	// Remove deletes blob d unless it was stored or touched after before
	// (in this process, or as its stored timestamp says), and reports
	// whether it did. A blob that is gone already is not an error.
	Remove(ctx context.Context, d Digest, before time.Time) (bool, error)
	// Touch records that blob d is about to be linked again, as a write
	// of its bytes would: Store.Link calls it for a blob it did not store.
	// A blob that is not stored is ErrNotFound.
	Touch(ctx context.Context, d Digest) error
	// Tidy removes what the removals left that no blob needs any more
	// (local: extents no ref names), stored before before.
	Tidy(ctx context.Context, before time.Time) (int, error)
}

// StoredBlob is one blob as WalkStored finds it.
type StoredBlob struct {
	Digest Digest
	// Stored is when its bytes were last stored or touched, as the store
	// records it (a file's mtime, an object's LastModified).
	Stored time.Time
	// Appended reports an appended blob (Appender), whose stored form may
	// need other blobs (Collectable.Needs).
	Appended bool
}

// CollectOptions tune a collection.
type CollectOptions struct {
	// Before is the cutoff: only blobs last stored or touched before it
	// are collected. The zero value means now; a server passes now minus
	// its grace period.
	Before time.Time
	// Roots are more blobs to keep besides those the runs' indexes name.
	Roots []Digest
	// Crash, when set, is called at each point of the collection (after
	// the mark: "marked"; after each removal: "removed") and ends it with
	// its error, as a crash there would: tests use it to prove that a
	// collection stopped anywhere loses nothing.
	Crash func(point string) error
}

// CollectReport sums up a collection.
type CollectReport struct {
	Stored  int // blobs found stored
	Live    int // blobs some run (or a root) holds
	Removed int // blobs removed
	Bytes   int64
	Tidied  int // leftovers removed by Tidy
}

// ErrNoCollect means the store cannot list or remove its blobs (every
// store Triad ships can).
var ErrNoCollect = errors.New("tmpfs: this store cannot collect its blobs")

// Collect removes the blobs no run's index names, which were last stored
// or touched before opts.Before. It lists the stored blobs first and then
// marks from every run's index, so a blob stored after the listing is
// never a candidate, and one listed but linked before the mark is marked;
// a blob linked after the mark was stored or touched then (a write's dedup
// hit refreshes the blob's timestamp, Store.Link touches it), so Remove,
// which checks again, keeps it. A collection that stops anywhere (a crash)
// has removed only unreferenced blobs; what it did not remove the next
// one finds.
func (s *Store) Collect(ctx context.Context, opts CollectOptions) (CollectReport, error) {
	var rep CollectReport
	c, ok := unwrapBlobs[Collectable](s.blobs)
	if !ok {
		return rep, ErrNoCollect
	}
	rl, ok := unwrapIndex[RunLister](s.index)
	if !ok {
		return rep, fmt.Errorf("%w: the index cannot list its runs", ErrNoCollect)
	}
	before := opts.Before
	if before.IsZero() {
		before = s.now()
	}
	crash := func(p string) error {
		if opts.Crash == nil {
			return nil
		}
		return opts.Crash(p)
	}
	var old []Digest
	appended := map[Digest]bool{}
	err := c.WalkStored(ctx, func(b StoredBlob) error {
		rep.Stored++
		if b.Appended {
			appended[b.Digest] = true
		}
		if b.Stored.Before(before) {
			old = append(old, b.Digest)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("list blobs: %w", err)
	}
	live := map[Digest]bool{}
	for _, d := range opts.Roots {
		live[d] = true
	}
	runs, err := rl.Runs(ctx)
	if err != nil {
		return rep, fmt.Errorf("list runs: %w", err)
	}
	for _, run := range runs {
		files, err := s.index.List(ctx, run, "")
		if err != nil {
			return rep, fmt.Errorf("list run %s: %w", run, err)
		}
		for _, f := range files {
			live[f.SHA256] = true
		}
	}
	// An appended blob's stored form may read others (its base), which
	// are live with it; a base is an ordinary blob, so one level is all.
	for d := range live {
		if !appended[d] {
			continue
		}
		needs, err := c.Needs(ctx, d)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return rep, fmt.Errorf("read what blob %s needs: %w", d.Short(), err)
		}
		for _, n := range needs {
			live[n] = true
		}
	}
	rep.Live = len(live)
	if err := crash("marked"); err != nil {
		return rep, err
	}
	for _, d := range old {
		if live[d] {
			continue
		}
		n, _ := s.blobs.Stat(ctx, d)
		removed, err := c.Remove(ctx, d, before)
		if err != nil {
			return rep, fmt.Errorf("remove blob %s: %w", d.Short(), err)
		}
		if removed {
			rep.Removed++
			rep.Bytes += n
			s.forget(d)
			if err := crash("removed"); err != nil {
				return rep, err
			}
		}
	}
	n, err := c.Tidy(ctx, before)
	rep.Tidied = n
	if err != nil {
		return rep, fmt.Errorf("tidy: %w", err)
	}
	return rep, nil
}

// touch records that blob d is about to be linked, when the store
// collects (Collectable).
func (s *Store) touch(ctx context.Context, d Digest) error {
	if c, ok := unwrapBlobs[Collectable](s.blobs); ok {
		return c.Touch(ctx, d)
	}
	return nil
}

// Pins is what a Collectable keeps in memory so that its Remove never
// races a write of this process: writes hold the gate shared while they
// store a blob and note it (Note), and Remove holds it alone while it
// checks and deletes, so a blob is either removed before a write looks
// for it (which then stores it afresh) or noted, and kept. The zero value
// is ready to use.
type Pins struct {
	gate sync.RWMutex
	mu   sync.Mutex
	at   map[Digest]time.Time
}

// maxPins bounds the notes kept; past it they start over, and Removes
// with a cutoff before then rely on the stored timestamps alone.
const maxPins = 1 << 16

// Write marks a write in progress; call the function it returns when the
// write has noted its blob.
func (p *Pins) Write() func() {
	p.gate.RLock()
	return p.gate.RUnlock
}

// Note records that blob d was stored or touched now. Call it inside Write.
func (p *Pins) Note(d Digest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil || len(p.at) >= maxPins {
		p.at = map[Digest]time.Time{}
	}
	p.at[d] = time.Now()
}

// Removing takes the gate alone for a Remove of d with cutoff before, and
// reports whether this process stored or touched d since before (then
// keep it). Call done when the removal is over.
func (p *Pins) Removing(d Digest, before time.Time) (recent bool, done func()) {
	p.gate.Lock()
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.at[d]
	return ok && !at.Before(before), p.gate.Unlock
}

// FreshenAge is how old a blob's stored timestamp may be before a write
// that finds the blob stored already (or a touch) refreshes it: a
// collection's grace period must be longer (a server's is hours).
const FreshenAge = time.Minute

// Noted reports whether this process noted blob d within FreshenAge, so
// a touch need not refresh its stored timestamp.
func (p *Pins) Noted(d Digest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.at[d]
	return ok && time.Since(at) < FreshenAge
}
