// Package tmpfsrecords reads the E2B surface's sandbox records where Triad kept them until issue 23: files of a reserved run, which a key of the default tenant could reach through the tools.
//
// It is the source of the one migration that moves them into the store's
// records outside runs (e2b.Legacy, api/e2b/metarecords), and of the tests
// that write records the way Triad did. Nothing writes here any more.
package tmpfsrecords

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Run is the reserved run that holds the records.
const Run = "triad-e2b-sandboxes"

const dir = "sandboxes/"

// Store is the part of *tmpfs.Store the records use.
type Store interface {
	WriteBytes(ctx context.Context, run runid.ID, path string, b []byte) (tmpfs.File, error)
	ReadAll(ctx context.Context, run runid.ID, path string) ([]byte, tmpfs.File, error)
	Delete(ctx context.Context, run runid.ID, path string) error
	List(ctx context.Context, run runid.ID, prefix string) ([]tmpfs.File, error)
}

var _ Store = (*tmpfs.Store)(nil)

// Records implements e2b.Legacy over a Store.
type Records struct {
	st  Store
	run runid.ID
}

var _ e2b.Legacy = (*Records)(nil)

// Run implements e2b.Legacy: the reserved run that holds the records.
func (r *Records) Run() runid.ID { return r.run }

// New returns Records kept in st.
func New(st Store) *Records {
	run, err := runid.Parse(Run)
	if err != nil {
		panic(err) // Run is a constant valid id
	}
	return &Records{st: st, run: run}
}

func path(id runid.ID) string { return dir + id.String() + ".json" }

// Put implements e2b.Records.
func (r *Records) Put(ctx context.Context, id runid.ID, b []byte) error {
	_, err := r.st.WriteBytes(ctx, r.run, path(id), b)
	return err
}

// Get implements e2b.Records.
func (r *Records) Get(ctx context.Context, id runid.ID) ([]byte, error) {
	b, _, err := r.st.ReadAll(ctx, r.run, path(id))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, e2b.ErrNoRecord
	}
	return b, err
}

// Delete implements e2b.Records.
func (r *Records) Delete(ctx context.Context, id runid.ID) error {
	err := r.st.Delete(ctx, r.run, path(id))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil
	}
	return err
}

// All implements e2b.Records.
func (r *Records) All(ctx context.Context) ([][]byte, error) {
	files, err := r.st.List(ctx, r.run, dir)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, 0, len(files))
	for _, f := range files {
		if !strings.HasSuffix(f.Path, ".json") {
			continue
		}
		b, _, err := r.st.ReadAll(ctx, r.run, f.Path)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.Path, err)
		}
		out = append(out, b)
	}
	return out, nil
}
