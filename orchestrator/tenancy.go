package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Tenancy: every run belongs to the tenant whose caller created it, and
// only that tenant (or an admin) sees it. The records live in the store's
// namespace outside runs (tmpfs.Meta), which no tool reaches:
//
//	owners/<run>                     the run's owner: tenant, key, created
//	tenants/<t>/runs/<inv>-<run>     the tenant's run index: one summary per
//	                                 run, keyed newest first (<inv> counts
//	                                 down from the run's creation), so GET
//	                                 /runs and the runs-per-hour quota read
//	                                 one page instead of every run
//	tenants/<t>/usage                the bytes the tenant's runs hold
//	tenants/<t>/blobs/<sha256>       a blob some run of the tenant has held
//
// A run owned by another tenant is answered exactly as a run that does not
// exist: not_found, never forbidden, so run ids leak nothing. See
// docs/DECISIONS.md, "Tenants".

// Quotas bound what one tenant may use; zero means no limit. The operator
// (authentication off, MCP over stdio, the CLI) is never limited.
type Quotas struct {
	// Kernels is the most kernels a tenant's runs may have live at once.
	Kernels int
	// StoredBytes is the most bytes a tenant's runs may hold (the sum of
	// their files' sizes).
	StoredBytes int64
	// RunsPerHour is the most runs a tenant may start in any hour.
	RunsPerHour int
	// Uploads is the most streamed uploads a tenant may have in flight at
	// once (each holds a connection and a blob being written).
	Uploads int
}

// owner is a run's owner record.
type owner struct {
	Run     runid.ID  `json:"run"`
	Tenant  string    `json:"tenant"`
	KeyID   string    `json:"key_id,omitempty"`
	Name    string    `json:"name,omitempty"`
	Created time.Time `json:"created"`
}

func (ow owner) caller() wire.Caller {
	return wire.Caller{KeyID: ow.KeyID, Name: ow.Name, Tenant: ow.Tenant}
}

// wireSummary is a new run's index entry.
func wireSummary(ow owner) wire.RunSummary {
	return wire.RunSummary{RunID: ow.Run.String(), Status: "open", Created: ow.Created, Updated: ow.Created, StartedBy: ow.caller()}
}

// summary is a run's entry in its tenant's run index.
type summary struct {
	wire.RunSummary
	// Bytes is what the run's files hold, for the tenant's usage.
	Bytes int64 `json:"bytes"`
}

// tenancy is the Orchestrator's ownership state: caches of records that
// never change (owners) or are checked often (usage).
type tenancy struct {
	q Quotas

	mu      sync.Mutex
	owners  map[runid.ID]owner
	usage   map[string]usageAt
	marked  map[string]struct{}         // tenant + "/" + digest, marker written
	pending map[string]map[runid.ID]int // kernels being started, per tenant
	uploads map[string]int              // streamed uploads in flight, per tenant

	// Run summaries and usage changes not yet written (see summaries.go).
	smu      sync.Mutex
	sums     map[runid.ID]*runSum
	listed   map[runid.ID]bool // runs whose files were all marked once
	delta    map[string]int64  // usage changes per tenant
	flushing bool              // the background writer is running
	flushMu  sync.Mutex        // one flush at a time
}

type usageAt struct {
	bytes int64
	at    time.Time
}

// maxCached bounds each cache; past it, the cache starts over.
const maxCached = 100000

func newTenancy(q Quotas) *tenancy {
	return &tenancy{q: q, owners: map[runid.ID]owner{}, usage: map[string]usageAt{}, marked: map[string]struct{}{},
		pending: map[string]map[runid.ID]int{}, uploads: map[string]int{}, sums: map[runid.ID]*runSum{}, listed: map[runid.ID]bool{}, delta: map[string]int64{}}
}

func ownerKey(run runid.ID) string { return "owners/" + run.String() }

func runsPrefix(tenant string) string { return "tenants/" + tenant + "/runs/" }

// indexKey names a run's entry in its tenant's index: newest sorts first.
func indexKey(ow owner) string {
	return fmt.Sprintf("%s%019d-%s", runsPrefix(ow.Tenant), math.MaxInt64-ow.Created.UnixNano(), ow.Run)
}

// createdOf reads a run's creation time back from its index key.
func createdOf(key string) (time.Time, bool) {
	i := strings.LastIndexByte(key, '/')
	inv, _, ok := strings.Cut(key[i+1:], "-")
	n, err := strconv.ParseInt(inv, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, math.MaxInt64-n), true
}

// notFound is the one answer for a run the caller may not see, whether it
// exists or not.
func notFound(run runid.ID) error {
	return fault.New(fault.NotFound, fmt.Sprintf("no run %s", run),
		"check the run id; GET /runs lists your runs, POST /runs gives a fresh id")
}

// reservedRun is the one answer for a caller naming one of Triad's own run
// ids: the same whether or not such a run exists.
func reservedRun(run runid.ID) error {
	return fault.New(fault.InvalidRun, fmt.Sprintf("run id %q starts with %q, which is reserved for Triad's own runs", run, runid.ReservedPrefix),
		"pick another run id, or get a fresh one from POST /runs")
}

// forbidden is the answer for a key whose scope does not allow a call.
func forbidden(p auth.Principal, need auth.Scope) error {
	return fault.New(fault.Forbidden, fmt.Sprintf("API key %s (scopes %v) does not have the %s scope this call needs", p.KeyID, p.Scopes, need),
		fmt.Sprintf("use a key with the %s scope; an admin creates one with: triad keys create --name NAME --scope %s", need, need))
}

// Create starts run, an id the surface just minted (POST /runs, an E2B
// sandbox, a recipe or replay run without a run_id), as a run of the
// caller's tenant. This is where a run's owner is decided, once, before any
// call can name the run: a surface that hands out a run id creates the run
// first. An id in use anywhere is a conflict (the owner record is written
// with a conditional create, so replicas sharing a store cannot both win).
// See docs/DECISIONS.md, "One owner per run".
func (o *Orchestrator) Create(ctx context.Context, run runid.ID) error {
	p := auth.From(ctx)
	if !p.Has(auth.Runs) {
		return forbidden(p, auth.Runs)
	}
	if run.Reserved() {
		return reservedRun(run)
	}
	_, won, err := o.create(ctx, run, p)
	if err != nil {
		return err
	}
	if !won {
		return fault.New(fault.Conflict, fmt.Sprintf("run id %s is already in use", run), "mint another run id (POST /runs gives a fresh one)")
	}
	return nil
}

// OpenRun is how a caller takes up a run outside a tool call (a recipe run
// resumed by run_id): the caller's own run, or, for an id nobody has used,
// a new run of the caller's tenant, created then and there exactly as a
// tool call naming a fresh id creates it. Another tenant's run is not
// found.
func (o *Orchestrator) OpenRun(ctx context.Context, run runid.ID) error {
	_, err := o.access(ctx, run, auth.Runs, true)
	return err
}

// ErrOwned is Adopt's answer for a run the core already has as another
// tenant's.
var ErrOwned = errors.New("orchestrator: the run belongs to another tenant")

// Adopt records run, which a surface made before the core owned every run
// (an E2B sandbox whose owner only the surface knew), as p's, created at
// created: a migration's step, once, on start. A run the core already has
// as p's tenant's is left as it is; as another tenant's, ErrOwned.
func (o *Orchestrator) Adopt(ctx context.Context, run runid.ID, p auth.Principal, created time.Time) error {
	if run.Reserved() {
		return reservedRun(run)
	}
	if err := auth.CheckTenant(p.Tenant); err != nil {
		return err
	}
	ow, won, err := o.putOwner(ctx, owner{Run: run, Tenant: p.Tenant, KeyID: p.KeyID, Name: p.Name, Created: created.UTC()})
	if err != nil {
		return err
	}
	if !won && ow.Tenant != p.Tenant {
		return fmt.Errorf("run %s: %w (%s, not %s)", run, ErrOwned, ow.Tenant, p.Tenant)
	}
	return nil
}

// Creator returns who acts for a run where the run itself is the
// credential: an E2B sandbox's data plane, admitted by the sandbox's
// access token, calls as the key that created the sandbox's run (the
// operator for a run the operator created). It checks no access: the
// surface has authenticated the run its own way. A run with no owner is
// not found.
func (o *Orchestrator) Creator(ctx context.Context, run runid.ID) (auth.Principal, error) {
	if run.Reserved() {
		return auth.Principal{}, reservedRun(run)
	}
	ow, ok, err := o.ownerOf(ctx, run)
	if err != nil {
		return auth.Principal{}, err
	}
	if !ok {
		return auth.Principal{}, notFound(run)
	}
	if ow.KeyID == "" {
		return auth.Operator, nil
	}
	return auth.Principal{KeyID: ow.KeyID, Name: ow.Name, Tenant: ow.Tenant, Scopes: []auth.Scope{auth.Runs}}, nil
}

// Retire removes one of Triad's own runs (a reserved id) that held a
// surface's state before that state moved out of the runs: its files, its
// owner and its entry in its tenant's run index, and the usage its files
// counted. No caller could name the run; after Retire nothing of it is
// left but its blobs, which the store never deletes.
func (o *Orchestrator) Retire(ctx context.Context, run runid.ID) error {
	if !run.Reserved() {
		return fmt.Errorf("retire run %s: only Triad's own runs (%s...) are retired", run, runid.ReservedPrefix)
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return err
	}
	defer held.Unlock()
	files, err := o.store.List(ctx, run, "")
	if err != nil {
		return storeErr(err, run, "")
	}
	for _, f := range files {
		if err := o.store.Delete(ctx, run, f.Path); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return storeErr(err, run, f.Path)
		}
	}
	m := o.store.Meta()
	ow, ok, err := o.ownerOf(ctx, run)
	if err != nil {
		return err
	}
	if ok {
		var sum summary
		if b, _, err := m.GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &sum) == nil && sum.Bytes > 0 {
			if err := o.addUsage(ctx, ow.Tenant, -sum.Bytes); err != nil {
				o.log.WarnContext(ctx, "take a retired run's bytes off its tenant's usage", "run", run, "err", err)
			}
		}
		for _, k := range []string{indexKey(ow), ownerKey(run)} {
			if err := m.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
				return storeErr(err, run, "")
			}
		}
	}
	if err := m.DeleteMeta(ctx, markerKey(run)); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return storeErr(err, run, "")
	}
	o.t.smu.Lock()
	delete(o.t.sums, run)
	o.t.smu.Unlock()
	o.t.mu.Lock()
	delete(o.t.owners, run)
	o.t.mu.Unlock()
	o.forget(run, true)
	return nil
}

// Visible checks that the caller may read run, an existing run: a run
// that does not exist and another tenant's run are both not found.
func (o *Orchestrator) Visible(ctx context.Context, run runid.ID) error {
	_, err := o.access(ctx, run, auth.Read, false)
	return err
}

// StartedBy returns who started a run the caller may read.
func (o *Orchestrator) StartedBy(ctx context.Context, run runid.ID) (wire.Caller, time.Time, error) {
	ow, err := o.access(ctx, run, auth.Read, false)
	return ow.caller(), ow.Created, err
}

// access checks the caller's scope and its right to the run, and returns
// the run's owner. With create, an id nobody has used becomes a run of the
// caller's (within the runs-per-hour quota); without, it is not found. A
// run id that is known in any way (an owner record, or files from before
// owners) is never created again. Triad's own ids (runid.Reserved) are
// refused, whether or not such a run exists.
func (o *Orchestrator) access(ctx context.Context, run runid.ID, need auth.Scope, create bool) (owner, error) {
	p := auth.From(ctx)
	if !p.Has(need) {
		return owner{}, forbidden(p, need)
	}
	if run.Reserved() {
		return owner{}, reservedRun(run)
	}
	ow, ok, err := o.ownerOf(ctx, run)
	if err != nil {
		return owner{}, err
	}
	if !ok {
		if ow, ok, err = o.adoptLegacy(ctx, run); err != nil {
			return owner{}, err
		}
	}
	if !ok && !create {
		return owner{}, notFound(run)
	}
	if !ok {
		// An implicit run: created for the caller's tenant with a
		// conditional create, so that of two tenants naming the same
		// fresh id at once (on this replica or another) one wins and the
		// other finds another tenant's run, not found.
		if ow, _, err = o.create(ctx, run, p); err != nil {
			return owner{}, err
		}
	}
	if !p.CanSee(ow.Tenant) {
		return owner{}, notFound(run)
	}
	return ow, nil
}

// ownerOf reads a run's owner, from the cache when it was seen before:
// owners never change, so the cache needs no expiry.
func (o *Orchestrator) ownerOf(ctx context.Context, run runid.ID) (owner, bool, error) {
	o.touch(run)
	o.t.mu.Lock()
	ow, ok := o.t.owners[run]
	o.t.mu.Unlock()
	if ok {
		return ow, true, nil
	}
	b, _, err := o.store.Meta().GetMeta(ctx, ownerKey(run))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return owner{}, false, nil
	}
	if err != nil {
		return owner{}, false, storeErr(err, run, "")
	}
	if err := json.Unmarshal(b, &ow); err != nil {
		return owner{}, false, fmt.Errorf("owner of run %s: %w", run, err)
	}
	o.cacheOwner(ow)
	return ow, true, nil
}

func (o *Orchestrator) cacheOwner(ow owner) {
	o.t.mu.Lock()
	defer o.t.mu.Unlock()
	if len(o.t.owners) >= maxCached {
		clear(o.t.owners)
	}
	o.t.owners[ow.Run] = ow
}

// adoptLegacy gives a run that has files but no owner (made before runs
// had owners) to the default tenant, once.
func (o *Orchestrator) adoptLegacy(ctx context.Context, run runid.ID) (owner, bool, error) {
	files, err := o.store.List(ctx, run, "")
	if err != nil {
		return owner{}, false, storeErr(err, run, "")
	}
	if len(files) == 0 {
		return owner{}, false, nil
	}
	created := files[0].ModifiedAt
	for _, f := range files {
		if f.ModifiedAt.Before(created) {
			created = f.ModifiedAt
		}
	}
	ow, _, err := o.putOwner(ctx, owner{Run: run, Tenant: auth.DefaultTenant, Name: "before tenants", Created: created.UTC()})
	return ow, err == nil, err
}

// create makes the caller the owner of a run nobody owns, and reports
// whether it did: false when another call (here or on a replica) created
// the run first, whose owner it returns.
func (o *Orchestrator) create(ctx context.Context, run runid.ID, p auth.Principal) (owner, bool, error) {
	if err := o.checkRunsPerHour(ctx, p); err != nil {
		return owner{}, false, err
	}
	ow, won, err := o.putOwner(ctx, owner{Run: run, Tenant: p.Tenant, KeyID: p.KeyID, Name: p.Name, Created: time.Now().UTC()})
	if err == nil && won {
		o.metrics.runStatus("open")
	}
	return ow, won, err
}

// putOwner writes an owner record, with a conditional create, and the
// run's first index entry. If another call (here or on a replica) created
// the run first, its record wins and is returned, with won false.
func (o *Orchestrator) putOwner(ctx context.Context, ow owner) (owner, bool, error) {
	b, _ := json.Marshal(ow)
	_, err := o.store.Meta().PutMeta(ctx, ownerKey(ow.Run), b, tmpfs.Cond{IfAbsent: true})
	if errors.Is(err, tmpfs.ErrPrecondition) {
		got, ok, err := o.ownerOf(ctx, ow.Run)
		if err == nil && !ok {
			err = fmt.Errorf("owner of run %s vanished", ow.Run)
		}
		return got, false, err
	}
	if err != nil {
		return owner{}, false, storeErr(err, ow.Run, "")
	}
	o.cacheOwner(ow)
	sb, _ := json.Marshal(newSummary(ow))
	if _, err := o.store.Meta().PutMeta(ctx, indexKey(ow), sb, tmpfs.Cond{}); err != nil {
		o.log.WarnContext(ctx, "add a run to its tenant's index", "run", ow.Run, "err", err)
	}
	return ow, true, nil
}

// checkRunsPerHour counts the tenant's runs started in the last hour from
// the newest page of its index.
func (o *Orchestrator) checkRunsPerHour(ctx context.Context, p auth.Principal) error {
	limit := o.t.q.RunsPerHour
	if limit <= 0 || p.IsOperator() {
		return nil
	}
	keys, err := o.store.Meta().ListMeta(ctx, runsPrefix(p.Tenant), "", limit)
	if err != nil {
		return storeErr(err, runid.ID{}, "")
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
	o.metrics.quotaRefused("runs_per_hour")
	return fault.New(fault.Quota,
		fmt.Sprintf("tenant %s started %d runs in the last hour, its limit (runs per hour)", p.Tenant, n),
		fmt.Sprintf("keep working in a run you have (its X-Run-Id), or start one after %s; the operator can raise --quota-runs-per-hour (TRIAD_QUOTA_RUNS_PER_HOUR)",
			oldest.Add(time.Hour).UTC().Format(time.RFC3339)))
}

// usageKey names a tenant's usage record.
func usageKey(tenant string) string { return "tenants/" + tenant + "/usage" }

type usageRec struct {
	Bytes int64 `json:"bytes"`
}

// checkBytes refuses a call that would take the run's tenant over its
// stored-bytes quota: already over, or over with add more bytes.
func (o *Orchestrator) checkBytes(ctx context.Context, ow owner, add int64) error {
	limit := o.t.q.StoredBytes
	if limit <= 0 || auth.From(ctx).IsOperator() {
		return nil
	}
	used, err := o.usage(ctx, ow.Tenant)
	if err != nil {
		return err
	}
	used += o.pendingBytes(ow.Tenant)
	if used < limit && used+add <= limit {
		return nil
	}
	o.metrics.quotaRefused("stored_bytes")
	return fault.New(fault.Quota,
		fmt.Sprintf("tenant %s stores %d bytes; this call would take it past its stored-bytes quota of %d", ow.Tenant, used+add, limit),
		"delete files you no longer need (tmp.delete), or ask the operator to raise --quota-stored-bytes (TRIAD_QUOTA_STORED_BYTES)")
}

// usage reads a tenant's stored bytes, trusted for a second.
func (o *Orchestrator) usage(ctx context.Context, tenant string) (int64, error) {
	o.t.mu.Lock()
	u, ok := o.t.usage[tenant]
	o.t.mu.Unlock()
	if ok && time.Since(u.at) < time.Second {
		return u.bytes, nil
	}
	b, _, err := o.store.Meta().GetMeta(ctx, usageKey(tenant))
	var rec usageRec
	switch {
	case errors.Is(err, tmpfs.ErrNotFound):
	case err != nil:
		return 0, storeErr(err, runid.ID{}, "")
	default:
		json.Unmarshal(b, &rec)
	}
	o.setUsage(tenant, rec.Bytes)
	return rec.Bytes, nil
}

func (o *Orchestrator) setUsage(tenant string, n int64) {
	o.t.mu.Lock()
	defer o.t.mu.Unlock()
	if len(o.t.usage) >= maxCached {
		clear(o.t.usage)
	}
	o.t.usage[tenant] = usageAt{bytes: n, at: time.Now()}
}

// addUsage adds delta to a tenant's usage with a conditional write, so
// replicas updating at once lose no update.
func (o *Orchestrator) addUsage(ctx context.Context, tenant string, delta int64) error {
	m := o.store.Meta()
	for range 20 {
		b, v, err := m.GetMeta(ctx, usageKey(tenant))
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
		rec.Bytes = max(rec.Bytes+delta, 0)
		nb, _ := json.Marshal(rec)
		if _, err := m.PutMeta(ctx, usageKey(tenant), nb, cond); errors.Is(err, tmpfs.ErrPrecondition) {
			continue
		} else if err != nil {
			return err
		}
		o.setUsage(tenant, rec.Bytes)
		return nil
	}
	return errors.New("usage: too many concurrent writers")
}

// SetRecipeState records a recipe run's recipe and status in its index
// entry, for GET /runs, with the objective SetRunInfo gave.
func (o *Orchestrator) SetRecipeState(ctx context.Context, run runid.ID, recipe, status string) {
	objective := o.objective(run)
	held, err := o.lockRun(ctx, run)
	if err != nil {
		o.log.WarnContext(ctx, "record a recipe run's state in the run index", "run", run, "err", err)
		return
	}
	defer held.Unlock()
	o.noteRun(ctx, run, nil, func(s *summary) {
		if s.Status != status {
			o.metrics.runStatus(status)
		}
		s.Recipe, s.Status = recipe, status
		if objective != "" {
			s.Objective = objective
		}
	})
}

func blobMarker(tenant string, d tmpfs.Digest) string {
	return "tenants/" + tenant + "/blobs/" + d.String()
}

// markBlobs notes that the tenant holds these files' blobs, once each.
func (o *Orchestrator) markBlobs(ctx context.Context, tenant string, files []tmpfs.File) {
	for _, f := range files {
		k := blobMarker(tenant, f.SHA256)
		o.t.mu.Lock()
		_, done := o.t.marked[k]
		o.t.mu.Unlock()
		if done {
			continue
		}
		_, err := o.store.Meta().PutMeta(ctx, k, []byte("{}"), tmpfs.Cond{IfAbsent: true})
		if err != nil && !errors.Is(err, tmpfs.ErrPrecondition) {
			o.log.WarnContext(ctx, "mark a tenant's blob", "tenant", tenant, "err", err)
			continue
		}
		o.t.mu.Lock()
		if len(o.t.marked) >= maxCached {
			clear(o.t.marked)
		}
		o.t.marked[k] = struct{}{}
		o.t.mu.Unlock()
	}
}

// tenantHolds reports whether some run of the tenant has held blob d.
// Markers are written in the background; a miss writes what is pending
// and looks again.
func (o *Orchestrator) tenantHolds(ctx context.Context, tenant string, d tmpfs.Digest) bool {
	if _, _, err := o.store.Meta().GetMeta(ctx, blobMarker(tenant, d)); err == nil {
		return true
	}
	o.Flush(ctx)
	_, _, err := o.store.Meta().GetMeta(ctx, blobMarker(tenant, d))
	return err == nil
}

// blobNotFound is the one answer for a blob the caller may not have,
// whether it exists or not (no existence oracle; see docs/DECISIONS.md,
// "Who may fetch a blob").
// The message does not even echo the hash, so the body is byte for byte the
// same for every blob.
func blobNotFound(d tmpfs.Digest) error {
	return fault.New(fault.NotFound, "no such blob in a run this caller can read",
		"send the X-Run-Id of a run that holds the file (tmp.list shows each file's sha256), or ask for a share link (POST /runs/{id}/share)")
}

// BlobNotFound is OpenBlob's answer for a request that names no run.
func BlobNotFound(d tmpfs.Digest) error { return blobNotFound(d) }

// OpenBlob opens blob d for a caller who names run: the caller must be
// able to read the run, and the run must hold a file with those bytes.
// Membership is checked before the blob store is touched, and every
// failure is the same not_found, so the answer says nothing about whether
// the blob exists.
func (o *Orchestrator) OpenBlob(ctx context.Context, run runid.ID, d tmpfs.Digest) (*tmpfs.Reader, error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		if fe := fault.As(err); fe != nil && fe.Kind == fault.Forbidden {
			return nil, err
		}
		return nil, blobNotFound(d)
	}
	if err := o.settle(ctx, run); err != nil {
		return nil, err
	}
	files, err := o.store.List(ctx, run, "")
	if err != nil {
		return nil, storeErr(err, run, "")
	}
	held := false
	for _, f := range files {
		held = held || f.SHA256 == d
	}
	if !held {
		return nil, blobNotFound(d)
	}
	r, err := o.store.OpenBlob(ctx, d)
	if errors.Is(err, tmpfs.ErrNotFound) {
		return nil, blobNotFound(d)
	}
	if err != nil {
		return nil, storeErr(err, run, "")
	}
	return r, nil
}

// StoreError turns an error from reading a run's file (or a blob it holds)
// into the fault a caller sees: a corrupt or quarantined blob is corrupt,
// a store that does not answer is store_unavailable, and so on.
func StoreError(err error, run runid.ID, path string) error { return storeErr(err, run, path) }

// RunsQuery selects a page of a tenant's runs.
type RunsQuery struct {
	// Tenant is the caller's own when empty; another needs an admin.
	Tenant string
	// Cursor is the NextCursor of the previous page, empty for the first.
	Cursor string
	// Limit is the most runs per page, 1-200 (0: 50).
	Limit int
	// Status keeps only runs with this status ("open", "running",
	// "succeeded", ...); empty keeps all.
	Status string
	// Recipe keeps only runs of this recipe; ManualRuns keeps the runs of
	// no recipe; empty keeps all.
	Recipe string
}

// ManualRuns is the RunsQuery.Recipe of runs that are not recipe runs.
const ManualRuns = "manual"

// maxScan bounds the index entries one filtered page reads: a filter
// that matches rarely answers a short page with a cursor to go on from.
const maxScan = 1000

// Runs lists the caller's runs, newest first, a page at a time: q.Limit
// runs after the cursor a previous page returned, optionally only those
// of a status or recipe. An admin may name another tenant.
func (o *Orchestrator) Runs(ctx context.Context, q RunsQuery) (wire.RunList, error) {
	out := wire.RunList{Runs: []wire.RunSummary{}}
	p := auth.From(ctx)
	if !p.Has(auth.Read) {
		return out, forbidden(p, auth.Read)
	}
	tenant := q.Tenant
	if tenant == "" {
		tenant = p.Tenant
	}
	if err := auth.CheckTenant(tenant); err != nil {
		return out, fault.Wrap(fault.BadInput, err, err.Error(), "omit tenant to list your own runs")
	}
	if !p.CanSee(tenant) {
		return out, forbidden(p, auth.Admin)
	}
	if len(q.Status) > 64 || len(q.Recipe) > 200 {
		return out, fault.New(fault.BadInput, "status or recipe is too long", "send a status such as running, or a recipe name from GET /recipes")
	}
	o.Flush(ctx) // read your own writes
	limit := q.Limit
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 200 {
		return out, fault.Badf("send limit between 1 and 200, or omit it for 50", "limit %d is out of range", limit)
	}
	after := ""
	if q.Cursor != "" {
		after = runsPrefix(tenant) + q.Cursor
		if err := tmpfs.CheckMetaKey(after); err != nil || strings.Contains(q.Cursor, "/") {
			return out, fault.New(fault.BadInput, "the cursor is not one this server gave", "send next_cursor from the previous page unchanged, or omit it for the first page")
		}
	}
	filtered := q.Status != "" || q.Recipe != ""
	keep := func(s wire.RunSummary) bool {
		switch {
		case q.Status != "" && s.Status != q.Status:
			return false
		case q.Recipe == ManualRuns:
			return s.Recipe == ""
		case q.Recipe != "":
			return s.Recipe == q.Recipe
		}
		return true
	}
	scanned, lastKey := 0, ""
	for {
		batch := limit + 1
		if filtered {
			batch = min(200, maxScan-scanned)
		}
		keys, err := o.store.Meta().ListMeta(ctx, runsPrefix(tenant), after, batch)
		if err != nil {
			return out, storeErr(err, runid.ID{}, "")
		}
		sums, err := o.summaries(ctx, keys)
		if err != nil {
			return out, err
		}
		for i, k := range keys {
			scanned++
			after = k
			if sums[i] == nil || !keep(*sums[i]) {
				continue
			}
			if len(out.Runs) == limit {
				// One more match exists: the page ends at the previous one.
				out.NextCursor = strings.TrimPrefix(lastKey, runsPrefix(tenant))
				return out, nil
			}
			out.Runs = append(out.Runs, *sums[i])
			lastKey = k
		}
		if len(keys) < batch {
			return out, nil // the index is exhausted
		}
		if filtered && scanned >= maxScan {
			out.NextCursor = strings.TrimPrefix(after, runsPrefix(tenant))
			return out, nil
		}
	}
}

// summaries reads index entries, 16 at a time; an entry deleted meanwhile
// is nil.
func (o *Orchestrator) summaries(ctx context.Context, keys []string) ([]*wire.RunSummary, error) {
	sums := make([]*wire.RunSummary, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			b, _, err := o.store.Meta().GetMeta(ctx, k)
			if err != nil {
				errs[i] = err
				return
			}
			var s summary
			if errs[i] = json.Unmarshal(b, &s); errs[i] == nil {
				sums[i] = &s.RunSummary
			}
		}()
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil && !errors.Is(errs[i], tmpfs.ErrNotFound) {
			return nil, storeErr(errs[i], runid.ID{}, "")
		}
	}
	return sums, nil
}

// reserveKernel counts a kernel the call is about to start against the
// run's tenant's concurrent-kernels quota, and returns the release to
// call when the start is over (the live kernel then counts by itself).
func (o *Orchestrator) reserveKernel(ctx context.Context, run runid.ID, ow owner) (func(), error) {
	limit := o.t.q.Kernels
	if limit <= 0 || o.kernels == nil || auth.From(ctx).IsOperator() || o.kernels.Peek(run) != nil {
		return func() {}, nil
	}
	live := map[runid.ID]bool{}
	for _, r := range o.kernels.Runs() {
		if ro, ok, _ := o.ownerOf(ctx, r); ok && ro.Tenant == ow.Tenant {
			live[r] = true
		}
	}
	o.t.mu.Lock()
	defer o.t.mu.Unlock()
	for r := range o.t.pending[ow.Tenant] {
		live[r] = true
	}
	if !live[run] && len(live) >= limit {
		o.metrics.quotaRefused("kernels")
		return nil, fault.New(fault.Quota,
			fmt.Sprintf("tenant %s has %d kernels live, its limit of concurrent kernels", ow.Tenant, len(live)),
			"keep working in a run whose kernel is live, or wait until one is stopped after it sits idle (--idle-ttl); the operator can raise --quota-kernels (TRIAD_QUOTA_KERNELS)")
	}
	if o.t.pending[ow.Tenant] == nil {
		o.t.pending[ow.Tenant] = map[runid.ID]int{}
	}
	o.t.pending[ow.Tenant][run]++
	return func() {
		o.t.mu.Lock()
		defer o.t.mu.Unlock()
		if o.t.pending[ow.Tenant][run]--; o.t.pending[ow.Tenant][run] <= 0 {
			delete(o.t.pending[ow.Tenant], run)
		}
		if len(o.t.pending[ow.Tenant]) == 0 {
			delete(o.t.pending, ow.Tenant)
		}
	}, nil
}

// startUpload counts one more streamed upload in flight for tenant, within
// its quota; release ends it.
func (t *tenancy) startUpload(tenant string) (release func(), err error) {
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
