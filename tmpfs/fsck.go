package tmpfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// Ref is a run's path that points at a blob.
type Ref struct {
	Run  runid.ID `json:"run"`
	Path string   `json:"path"`
}

// Bad is a blob whose stored bytes failed their check.
type Bad struct {
	SHA256 Digest `json:"sha256"`
	Size   int64  `json:"size"`
	// Reason says what was wrong, for people.
	Reason string `json:"reason"`
	// Refs are the runs and paths that pointed at the blob when it was
	// found bad.
	Refs []Ref `json:"refs"`
	// Quarantined reports whether the blob was moved aside (not in a dry
	// run, and not if a good copy replaced it meanwhile).
	Quarantined bool      `json:"quarantined"`
	FoundAt     time.Time `json:"found_at"`
}

// FsckOptions tune a pass of Fsck.
type FsckOptions struct {
	// Rate bounds the bytes hashed per second; 0 means as fast as the
	// store reads.
	Rate int64
	// DryRun finds bad blobs and their references but moves nothing.
	DryRun bool
	// OnBad, if set, is called for each bad blob as it is found.
	OnBad func(Bad)
}

// FsckReport sums up a pass of Fsck.
type FsckReport struct {
	Blobs int   // blobs checked
	Bytes int64 // bytes hashed
	Bad   []Bad
	// Swept counts leftovers of crashed writes that were removed
	// (Sweeper).
	Swept int
	// Unreadable lists blobs that could not be read to the end (I/O
	// errors): they were left in place, neither trusted nor quarantined.
	Unreadable []string
}

// ErrNoScrub means the store cannot list its blobs, so it cannot be
// checked (every store Triad ships can).
var ErrNoScrub = errors.New("tmpfs: this store cannot list its blobs")

// Fsck re-hashes every blob, whatever its fingerprint says, and
// quarantines each one whose bytes do not match its sha256: it is moved
// aside (Scrubbable.Quarantine), never served again, and reported with the
// runs and paths that referenced it. A blob that passes has its
// fingerprint recorded afresh. Appended blobs (every version of a journal)
// are checked too, when the store can list them (AppendScrubbable), each
// group of versions in one read of its bytes.
func (s *Store) Fsck(ctx context.Context, opts FsckOptions) (FsckReport, error) {
	var rep FsckReport
	sc, ok := unwrapBlobs[Scrubbable](s.blobs)
	if !ok {
		return rep, ErrNoScrub
	}
	f := &fsck{s: s, opts: opts, rep: &rep, p: newPacer(opts.Rate)}
	err := sc.Walk(ctx, func(d Digest, _ int64) error {
		version, size, err := s.check(ctx, d, f.p)
		switch {
		case err == nil:
			rep.Blobs++
			rep.Bytes += size
			return nil
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrQuarantined):
			return nil // deleted or quarantined since the listing
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, ErrDigestMismatch):
			f.unreadable(ctx, d, err)
			return nil
		}
		rep.Blobs++
		rep.Bytes += size
		return f.bad(ctx, d, size, "stored bytes do not match their sha256", func(report []byte) error {
			return sc.Quarantine(ctx, d, version, report)
		})
	})
	if as, ok := unwrapBlobs[AppendScrubbable](s.blobs); ok && err == nil {
		f.buf = make([]byte, chunkSize)
		err = as.WalkAppended(ctx, func(g AppendedGroup) error { return f.group(ctx, as, g) })
	}
	if err != nil || opts.DryRun {
		return rep, err
	}
	if sw, ok := unwrapBlobs[Sweeper](s.blobs); ok {
		n, err := sw.Sweep(ctx, sweepAge)
		rep.Swept = n
		if err != nil {
			return rep, fmt.Errorf("sweep: %w", err)
		}
	}
	return rep, nil
}

// sweepAge is how old a leftover of a write must be before Fsck removes
// it: far longer than any write takes.
const sweepAge = 24 * time.Hour

// check hashes blob d whole and returns the version and size it checked.
func (s *Store) check(ctx context.Context, d Digest, p *pacer) (string, int64, error) {
	b, err := s.blobs.Open(ctx, d)
	if err != nil {
		return "", 0, err
	}
	defer b.Close()
	v, n := b.Version(), b.Size()
	if err := s.hashBlobPaced(ctx, b, d, p); err != nil {
		return v, n, err
	}
	s.markVerified(ctx, b, d)
	return v, n, nil
}

// forget drops d from the verification cache.
func (s *Store) forget(d Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.verified {
		if k.d == d {
			delete(s.verified, k)
		}
	}
}

// refs maps every blob that some run's file points at to those files.
func (s *Store) refs(ctx context.Context) (map[Digest][]Ref, error) {
	rl, ok := unwrapIndex[RunLister](s.index)
	if !ok {
		return nil, errors.New("the index cannot list its runs")
	}
	runs, err := rl.Runs(ctx)
	if err != nil {
		return nil, err
	}
	m := map[Digest][]Ref{}
	for _, run := range runs {
		files, err := s.index.List(ctx, run, "")
		if err != nil {
			return nil, fmt.Errorf("list run %s: %w", run, err)
		}
		for _, f := range files {
			m[f.SHA256] = append(m[f.SHA256], Ref{Run: run, Path: f.Path})
		}
	}
	return m, nil
}

// scrubPause separates the scrub's passes, so a small store is not listed
// in a tight loop.
const scrubPause = time.Minute

// Scrub runs Fsck over and over in the background of a server, hashing at
// most rate bytes per second, until ctx ends. Bad blobs are quarantined
// and logged with the runs and paths that held them; each pass is logged
// when it ends.
func (s *Store) Scrub(ctx context.Context, rate int64) {
	for {
		start := time.Now()
		rep, err := s.Fsck(ctx, FsckOptions{Rate: rate})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.ErrorContext(ctx, "scrub pass failed", "err", err)
		} else {
			s.log.InfoContext(ctx, "scrub pass done", "blobs", rep.Blobs, "bytes", rep.Bytes, "bad", len(rep.Bad),
				"unreadable", len(rep.Unreadable), "took", time.Since(start).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(scrubPause):
		}
	}
}

// pacer spreads reads over time so that they average at most rate bytes
// per second across a whole pass.
type pacer struct {
	rate  int64
	start time.Time
	n     int64
}

func newPacer(rate int64) *pacer { return &pacer{rate: rate, start: time.Now()} }

// wait accounts for n more bytes and sleeps until they are due.
func (p *pacer) wait(ctx context.Context, n int) error {
	if p == nil || p.rate <= 0 {
		return nil
	}
	p.n += int64(n)
	due := time.Duration(float64(p.n) / float64(p.rate) * float64(time.Second))
	if d := due - time.Since(p.start); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// reader reads r, stopping when ctx ends, no faster than p allows (a nil
// p, or a rate of 0: as fast as r answers).
func (p *pacer) reader(ctx context.Context, r io.Reader) io.Reader {
	src := io.Reader(ctxReader{ctx, r})
	if p != nil && p.rate > 0 {
		src = &pacedReader{ctx: ctx, r: src, p: p}
	}
	return src
}

type pacedReader struct {
	ctx context.Context
	r   io.Reader
	p   *pacer
}

func (r *pacedReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if werr := r.p.wait(r.ctx, n); werr != nil && err == nil {
		err = werr
	}
	return n, err
}
