package tmpfs

import (
	"context"
	"errors"
	"sync"

	"github.com/triadhq/triad/internal/runid"
)

// usageTable holds, per run whose usage was asked for, the bytes its
// files hold, kept up to date by the store's own index changes so that
// asking again costs nothing (a run's files are never listed per call).
type usageTable struct {
	mu sync.Mutex
	m  map[runid.ID]int64
}

// maxUsage bounds the table; past it, it starts over (a miss lists the
// run once). One entry per run asked about, so it grows with runs.
const maxUsage = 1 << 14

// Usage returns the bytes the run's files hold, each file counted at its
// size (a blob two paths share counts twice). The first call for a run
// lists it; later ones are kept up to date by this store's writes,
// links, appends and deletes, so they cost nothing.
func (s *Store) Usage(ctx context.Context, run runid.ID) (int64, error) {
	s.usage.mu.Lock()
	n, ok := s.usage.m[run]
	s.usage.mu.Unlock()
	if ok {
		return n, nil
	}
	unlock := s.lock(run)
	defer unlock()
	files, err := s.index.List(ctx, run, "")
	if err != nil {
		return 0, err
	}
	n = 0
	for _, f := range files {
		n += f.Size
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	if s.usage.m == nil || len(s.usage.m) >= maxUsage {
		s.usage.m = map[runid.ID]int64{}
	}
	s.usage.m[run] = n
	return n, nil
}

func (s *Store) tracked(run runid.ID) bool {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	_, ok := s.usage.m[run]
	return ok
}

func (s *Store) addUsage(run runid.ID, delta int64) {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	if _, ok := s.usage.m[run]; ok {
		s.usage.m[run] += delta
	}
}

// putIndex puts f in the run's index and keeps the run's usage. Called
// with the run locked.
func (s *Store) putIndex(ctx context.Context, run runid.ID, f File) error {
	var old int64
	tracked := s.tracked(run)
	if tracked {
		if cur, err := s.index.Get(ctx, run, f.Path); err == nil {
			old = cur.Size
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	if err := s.index.Put(ctx, run, f); err != nil {
		return err
	}
	if tracked {
		s.addUsage(run, f.Size-old)
	}
	return nil
}

// deleteIndex removes path from the run's index and keeps the run's
// usage. Called with the run locked.
func (s *Store) deleteIndex(ctx context.Context, run runid.ID, p string) error {
	var old int64
	tracked := s.tracked(run)
	if tracked {
		cur, err := s.index.Get(ctx, run, p)
		if err != nil {
			return err
		}
		old = cur.Size
	}
	if err := s.index.Delete(ctx, run, p); err != nil {
		return err
	}
	if tracked {
		s.addUsage(run, -old)
	}
	return nil
}

// putAllIndex puts files in the run's index as one group (Batcher, when
// the index has it) and keeps the run's usage. Called with the run
// locked.
func (s *Store) putAllIndex(ctx context.Context, run runid.ID, files []File) error {
	b, ok := unwrapIndex[Batcher](s.index)
	if !ok {
		for _, f := range files {
			if err := s.putIndex(ctx, run, f); err != nil {
				return err
			}
		}
		return nil
	}
	var old int64
	tracked := s.tracked(run)
	if tracked {
		for _, f := range files {
			if cur, err := s.index.Get(ctx, run, f.Path); err == nil {
				old += cur.Size
			} else if !errors.Is(err, ErrNotFound) {
				return err
			}
		}
	}
	if err := b.PutAll(ctx, run, files); err != nil {
		return err
	}
	if tracked {
		var n int64
		for _, f := range files {
			n += f.Size
		}
		s.addUsage(run, n-old)
	}
	return nil
}
