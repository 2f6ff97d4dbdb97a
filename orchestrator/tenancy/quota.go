package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/internal/storeerr"
	"github.com/triadhq/triad/tmpfs"
)

// checkRunsPerHour counts the tenant's runs started in the last hour from
// the newest page of its index.
func (t *Tenancy) checkRunsPerHour(ctx context.Context, p auth.Principal) error {
	limit := t.q.RunsPerHour
	if limit <= 0 || p.IsOperator() {
		return nil
	}
	keys, err := t.meta.ListMeta(ctx, runsPrefix(p.Tenant), "", limit)
	if err != nil {
		return storeerr.Fault(err, runid.ID{}, "")
	}
	since := time.Now().Add(-time.Hour)
	n := 0
	var oldest time.Time
	for _, k := range keys {
		if c, ok := createdOf(k); ok && c.After(since) {
			n++
			oldest = c
		}
	}
	if n < limit {
		return nil
	}
	t.refused("runs_per_hour")
	return fault.New(fault.Quota,
		fmt.Sprintf("tenant %s started %d runs in the last hour, its limit (runs per hour)", p.Tenant, n),
		fmt.Sprintf("keep working in a run you have (its X-Run-Id), or start one after %s; the operator can raise --quota-runs-per-hour (TRIAD_QUOTA_RUNS_PER_HOUR)",
			oldest.Add(time.Hour).UTC().Format(time.RFC3339)))
}

// usageKey names a tenant's usage record.
func usageKey(tenant string) string { return "tenants/" + tenant + "/usage" }

// usageRec is a tenant's usage record: the bytes its runs store now, and
// what they used, summed (wire.TenantUsage). It is also a change to one,
// not yet written.
type usageRec struct {
	Bytes             int64   `json:"bytes"`
	CPUSeconds        float64 `json:"cpu_seconds,omitempty"`
	MemoryByteSeconds float64 `json:"memory_byte_seconds,omitempty"`
	EgressBytesOut    int64   `json:"egress_bytes_out,omitempty"`
	EgressBytesIn     int64   `json:"egress_bytes_in,omitempty"`
}

// plus is u changed by d.
func (u usageRec) plus(d usageRec) usageRec {
	u.Bytes += d.Bytes
	u.CPUSeconds += d.CPUSeconds
	u.MemoryByteSeconds += d.MemoryByteSeconds
	u.EgressBytesOut += d.EgressBytesOut
	u.EgressBytesIn += d.EgressBytesIn
	return u
}

// CheckBytes refuses a call by p that would take the run's tenant (ow's)
// over its stored-bytes quota: already over, or over with add more bytes.
func (t *Tenancy) CheckBytes(ctx context.Context, p auth.Principal, ow Owner, add int64) error {
	limit := t.q.StoredBytes
	if limit <= 0 || p.IsOperator() {
		return nil
	}
	used, err := t.used(ctx, ow.Tenant)
	if err != nil {
		return err
	}
	t.mu.Lock()
	used += t.delta[ow.Tenant].Bytes
	t.mu.Unlock()
	if used < limit && used+add <= limit {
		return nil
	}
	t.refused("stored_bytes")
	return fault.New(fault.Quota,
		fmt.Sprintf("tenant %s stores %d bytes; this call would take it past its stored-bytes quota of %d", ow.Tenant, used+add, limit),
		"delete files you no longer need (tmp.delete), or ask the operator to raise --quota-stored-bytes (TRIAD_QUOTA_STORED_BYTES)")
}

// used reads a tenant's stored bytes, trusted for a second.
func (t *Tenancy) used(ctx context.Context, tenant string) (int64, error) {
	t.mu.Lock()
	u, ok := t.usage[tenant]
	t.mu.Unlock()
	if ok && time.Since(u.at) < time.Second {
		return u.bytes, nil
	}
	rec, err := t.usageOf(ctx, tenant)
	if err != nil {
		return 0, err
	}
	return rec.Bytes, nil
}

// usageOf reads a tenant's usage record as stored.
func (t *Tenancy) usageOf(ctx context.Context, tenant string) (usageRec, error) {
	b, _, err := t.meta.GetMeta(ctx, usageKey(tenant))
	var rec usageRec
	switch {
	case errors.Is(err, tmpfs.ErrNotFound):
	case err != nil:
		return rec, storeerr.Fault(err, runid.ID{}, "")
	default:
		json.Unmarshal(b, &rec)
	}
	t.setUsage(tenant, rec.Bytes)
	return rec, nil
}

func (t *Tenancy) setUsage(tenant string, n int64) {
	t.mu.Lock()
	if len(t.usage) >= maxCached {
		clear(t.usage)
	}
	t.usage[tenant] = usageAt{bytes: n, at: time.Now()}
	t.mu.Unlock()
	if t.m != nil {
		t.m.TenantStored(tenant, n)
	}
}

// addUsage adds delta to a tenant's usage with a conditional write, so
// replicas updating at once lose no update.
func (t *Tenancy) addUsage(ctx context.Context, tenant string, delta usageRec) error {
	for range 20 {
		b, v, err := t.meta.GetMeta(ctx, usageKey(tenant))
		var rec usageRec
		cond := tmpfs.Cond{IfVersion: v}
		switch {
		case errors.Is(err, tmpfs.ErrNotFound):
			cond = tmpfs.Cond{IfAbsent: true}
		case err != nil:
			return err
		default:
			json.Unmarshal(b, &rec)
		}
		bytes := max(rec.Bytes+delta.Bytes, 0)
		rec = rec.plus(delta)
		rec.Bytes = bytes
		nb, _ := json.Marshal(rec)
		if _, err := t.meta.PutMeta(ctx, usageKey(tenant), nb, cond); errors.Is(err, tmpfs.ErrPrecondition) {
			continue
		} else if err != nil {
			return err
		}
		t.setUsage(tenant, rec.Bytes)
		return nil
	}
	return errors.New("usage: too many concurrent writers")
}

// Kernel is one live kernel, as ReserveKernel weighs it.
type Kernel struct {
	Run    runid.ID
	Tenant string
	// Busy is true while a cell or command runs in it: it is in use, and
	// never reclaimed.
	Busy     bool
	LastUsed time.Time
}

// Reclaimed is a kernel ReserveKernel took from its run to make room for
// another run's: the fact is decided once, there, and handed to whoever
// records it in the run's journal.
type Reclaimed struct {
	// Run is the run whose kernel was reclaimed; For, the run whose new
	// kernel it made room for.
	Run, For runid.ID
	Tenant   string
	// Limit is the tenant's kernel quota, which it was at.
	Limit int
	// Idle is how long the kernel had sat unused.
	Idle time.Duration
	At   time.Time
}

// KernelLimit is the most kernels one tenant's runs may have live at once
// (0: no limit). The operator is never limited.
func (t *Tenancy) KernelLimit() int { return max(t.q.Kernels, 0) }

// Starting is how many kernels the tenant's runs are starting now (each
// counts against the quota as a busy kernel until it is live).
func (t *Tenancy) Starting(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.starts[tenant])
}

// ReserveKernel counts a kernel a call of p is about to start for run
// (ow's) against the tenant's concurrent-kernels quota, and returns the
// release to call when the start is over (the live kernel then counts by
// itself). live lists the live kernels; it is called only when the quota
// applies.
//
// Only kernels in use count against the quota: a tenant at its limit
// whose kernels are not all busy gets room by reclaiming the least
// recently used idle one, which take removes from its run if it is still
// idle (take reports false for a kernel that became busy meanwhile, and
// the next one is tried). The reclaimed kernel is returned for the caller
// to stop and record. When every kernel is busy (or starting), the call
// is refused with quota. Reservations are serialized, so two runs of one
// tenant starting at once never both reclaim the same kernel nor go past
// the limit. See docs/DECISIONS.md, "Idle kernels are reclaimed at the
// quota".
func (t *Tenancy) ReserveKernel(p auth.Principal, ow Owner, live func() []Kernel, take func(run runid.ID) bool) (release func(), reclaimed *Reclaimed, err error) {
	limit := t.q.Kernels
	if limit <= 0 || p.IsOperator() {
		return func() {}, nil, nil
	}
	t.kmu.Lock()
	defer t.kmu.Unlock()
	run := ow.Run
	mine := map[runid.ID]bool{} // runs holding a slot
	var idle []Kernel
	for _, k := range live() {
		if k.Tenant != ow.Tenant {
			continue
		}
		mine[k.Run] = true
		if !k.Busy && k.Run != run {
			idle = append(idle, k)
		}
	}
	t.mu.Lock()
	for r := range t.starts[ow.Tenant] {
		mine[r] = true
	}
	t.mu.Unlock()
	if !mine[run] && len(mine) >= limit {
		// Least recently used first; a run still starting holds its slot.
		slices.SortFunc(idle, func(a, b Kernel) int { return a.LastUsed.Compare(b.LastUsed) })
		for _, k := range idle {
			t.mu.Lock()
			starting := t.starts[ow.Tenant][k.Run] > 0
			t.mu.Unlock()
			if starting || !take(k.Run) {
				continue
			}
			now := time.Now()
			reclaimed = &Reclaimed{Run: k.Run, For: run, Tenant: ow.Tenant, Limit: limit, Idle: now.Sub(k.LastUsed), At: now.UTC()}
			delete(mine, k.Run)
			break
		}
		if reclaimed == nil {
			t.refused("kernels")
			return nil, nil, fault.New(fault.Quota,
				fmt.Sprintf("tenant %s has %d kernels in use (a cell or command running, or starting, in each), its limit of concurrent kernels", ow.Tenant, len(mine)),
				"wait for one of them to finish and retry, or interrupt or stop one (GET /kernels lists them; POST /kernels/{run}/interrupt, DELETE /kernels/{run}); the operator can raise --quota-kernels (TRIAD_QUOTA_KERNELS)")
		}
		t.reclaimed()
	}
	t.mu.Lock()
	if t.starts[ow.Tenant] == nil {
		t.starts[ow.Tenant] = map[runid.ID]int{}
	}
	t.starts[ow.Tenant][run]++
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.starts[ow.Tenant][run]--; t.starts[ow.Tenant][run] <= 0 {
			delete(t.starts[ow.Tenant], run)
		}
		if len(t.starts[ow.Tenant]) == 0 {
			delete(t.starts, ow.Tenant)
		}
	}, reclaimed, nil
}

func blobMarker(tenant string, d tmpfs.Digest) string {
	return "tenants/" + tenant + "/blobs/" + d.String()
}

// markBlobs notes that the tenant holds these files' blobs, once each.
func (t *Tenancy) markBlobs(ctx context.Context, tenant string, files []tmpfs.File) {
	for _, f := range files {
		k := blobMarker(tenant, f.SHA256)
		t.mu.Lock()
		_, done := t.marked[k]
		t.mu.Unlock()
		if done {
			continue
		}
		_, err := t.meta.PutMeta(ctx, k, []byte("{}"), tmpfs.Cond{IfAbsent: true})
		if err != nil && !errors.Is(err, tmpfs.ErrPrecondition) {
			t.log.WarnContext(ctx, "mark a tenant's blob", "tenant", tenant, "err", err)
			continue
		}
		t.mu.Lock()
		if len(t.marked) >= maxMarked {
			clear(t.marked)
		}
		t.marked[k] = struct{}{}
		t.mu.Unlock()
	}
}

// Holds reports whether some run of the tenant has held blob d. Markers
// are written in the background; a miss writes what is pending and looks
// again.
func (t *Tenancy) Holds(ctx context.Context, tenant string, d tmpfs.Digest) bool {
	if _, _, err := t.meta.GetMeta(ctx, blobMarker(tenant, d)); err == nil {
		return true
	}
	t.Flush(ctx)
	_, _, err := t.meta.GetMeta(ctx, blobMarker(tenant, d))
	return err == nil
}

// StartUpload counts one more streamed upload in flight for tenant, within
// its quota; release ends it.
func (t *Tenancy) StartUpload(tenant string) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.q.Uploads > 0 && t.uploads[tenant] >= t.q.Uploads {
		return nil, fault.New(fault.Quota, fmt.Sprintf("tenant %s has %d uploads in flight, its limit", tenant, t.q.Uploads),
			"wait for one to finish, then send this one again")
	}
	t.uploads[tenant]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.uploads[tenant]--; t.uploads[tenant] <= 0 {
			delete(t.uploads, tenant)
		}
	}, nil
}
