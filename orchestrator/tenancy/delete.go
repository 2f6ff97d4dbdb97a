package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Deleting a run (orchestrator.DeleteRun) starts here and ends here:
//
//	owners/<run>      rewritten with Deleted set: a tombstone, kept, so the
//	                  run is not found from then on and its id never made a
//	                  run again (every replica reads owners from the store)
//	deleting/<run>    the deletion in progress, removed when it is done: a
//	                  crash midway leaves it, and the next pass (Pending)
//	                  finishes the work, which is idempotent
//
// See docs/DECISIONS.md, "Deleting runs and collecting blobs".

const deletingPrefix = "deleting/"

// MarkDeleted writes the run's tombstone and records the deletion as in
// progress. From its return the run is not found.
func (t *Tenancy) MarkDeleted(ctx context.Context, ow Owner) error {
	now := time.Now().UTC()
	b, _ := json.Marshal(ow)
	if _, err := t.meta.PutMeta(ctx, deletingPrefix+ow.Run.String(), b, tmpfs.Cond{}); err != nil {
		return err
	}
	ow.Deleted = &now
	b, _ = json.Marshal(ow)
	_, err := t.meta.PutMeta(ctx, ownerKey(ow.Run), b, tmpfs.Cond{})
	return err
}

// FinishDelete removes the run's entry in its tenant's index (taking its
// bytes off the tenant's usage) and the record of the deletion in
// progress. The tombstone stays.
func (t *Tenancy) FinishDelete(ctx context.Context, ow Owner) error {
	t.mu.Lock()
	delete(t.index, ow.Run)
	t.mu.Unlock()
	var sum Summary
	if b, _, err := t.meta.GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &sum) == nil && sum.Bytes > 0 {
		if err := t.addUsage(ctx, ow.Tenant, usageRec{Bytes: -sum.Bytes}); err != nil {
			t.log.WarnContext(ctx, "take a deleted run's bytes off its tenant's usage", "run", ow.Run, "err", err)
		}
	}
	for _, k := range []string{indexKey(ow), deletingPrefix + ow.Run.String()} {
		if err := t.meta.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// Pending returns the owners of runs whose deletion a crash interrupted.
func (t *Tenancy) PendingDeletes(ctx context.Context) ([]Owner, error) {
	keys, err := t.meta.ListMeta(ctx, deletingPrefix, "", 0)
	if err != nil {
		return nil, err
	}
	var out []Owner
	for _, k := range keys {
		b, _, err := t.meta.GetMeta(ctx, k)
		if errors.Is(err, tmpfs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var ow Owner
		if err := json.Unmarshal(b, &ow); err != nil || ow.Run.String() != strings.TrimPrefix(k, deletingPrefix) {
			return nil, fmt.Errorf("record %s: not a run's owner", k)
		}
		out = append(out, ow)
	}
	return out, nil
}

// Stale returns the owners of the runs, of every tenant, whose last
// activity (their index entry's updated time) is before before: what a
// retention deletes. A run with no index entry counts from its creation.
func (t *Tenancy) Stale(ctx context.Context, before time.Time) ([]Owner, error) {
	t.Flush(ctx)
	var out []Owner
	after := ""
	for {
		keys, err := t.meta.ListMeta(ctx, "owners/", after, 500)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			after = k
			run, err := runid.Parse(strings.TrimPrefix(k, "owners/"))
			if err != nil || run.Reserved() {
				continue
			}
			ow, ok, err := t.Lookup(ctx, run)
			if errors.Is(err, ErrDeleted) || err == nil && !ok {
				continue
			}
			if err != nil {
				return nil, err
			}
			last := ow.Created
			var sum Summary
			if b, _, err := t.meta.GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &sum) == nil && sum.Updated.After(last) {
				last = sum.Updated
			}
			if last.Before(before) {
				out = append(out, ow)
			}
		}
		if len(keys) < 500 {
			return out, nil
		}
	}
}
