// Package metarecords keeps the E2B surface's sandbox records in the store's records outside runs (tmpfs.Meta), beside API keys and share links, where no tool can read or write them.
//
// Every replica sharing the store, and every restart, knows the
// sandboxes. A record holds no access token (only digests) and no env in
// plain text (they are sealed; see e2b.Sandbox).
package metarecords

import (
	"context"
	"errors"
	"fmt"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// prefix starts every record's key: e2b/sandboxes/<sandbox id>.
const prefix = "e2b/sandboxes/"

// Records implements e2b.Records over tmpfs.Meta.
type Records struct {
	meta tmpfs.Meta
}

var _ e2b.Records = (*Records)(nil)

// New returns Records kept in meta.
func New(meta tmpfs.Meta) *Records { return &Records{meta: meta} }

func key(id runid.ID) string { return prefix + id.String() }

// Put implements e2b.Records.
func (r *Records) Put(ctx context.Context, id runid.ID, b []byte) error {
	_, err := r.meta.PutMeta(ctx, key(id), b, tmpfs.Cond{})
	return err
}

// Get implements e2b.Records.
func (r *Records) Get(ctx context.Context, id runid.ID) ([]byte, error) {
	b, _, err := r.meta.GetMeta(ctx, key(id))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, e2b.ErrNoRecord
	}
	return b, err
}

// Delete implements e2b.Records.
func (r *Records) Delete(ctx context.Context, id runid.ID) error {
	err := r.meta.DeleteMeta(ctx, key(id))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil
	}
	return err
}

// All implements e2b.Records.
func (r *Records) All(ctx context.Context) ([][]byte, error) {
	keys, err := r.meta.ListMeta(ctx, prefix, "", 0)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, 0, len(keys))
	for _, k := range keys {
		b, _, err := r.meta.GetMeta(ctx, k)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		out = append(out, b)
	}
	return out, nil
}
