// Package tenancy keeps who owns each run and what each tenant may use: owner records, quotas, the per-tenant run index and usage, in the store's records outside runs.
//
// Every run belongs to the tenant whose caller created it, and only that
// tenant (or an admin) sees it. The records live in tmpfs.Meta, which no
// tool reaches:
//
//	owners/<run>                     the run's owner: tenant, key, created
//	tenants/<t>/runs/<inv>-<run>     the tenant's run index: one summary per
//	                                 run, keyed newest first (<inv> counts
//	                                 down from the run's creation), so GET
//	                                 /runs and the runs-per-hour quota read
//	                                 one page instead of every run
//	tenants/<t>/usage                the bytes the tenant's runs hold, and
//	                                 what they used (CPU, memory, egress)
//	tenants/<t>/blobs/<sha256>       a blob some run of the tenant has held
//
// The package decides facts from the store and writes them; it keeps no
// per-run cache of its own beyond the index writes not yet made (the
// orchestrator's run table caches each run's owner). See
// docs/DECISIONS.md, "Tenants" and "One owner per run".
package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// Owner is a run's owner record.
type Owner struct {
	Run     runid.ID  `json:"run"`
	Tenant  string    `json:"tenant"`
	KeyID   string    `json:"key_id,omitempty"`
	Name    string    `json:"name,omitempty"`
	Created time.Time `json:"created"`
	// SnapshotOf is the run a snapshot run was taken from (CreateSnapshot),
	// empty for every other run. Decided at creation, as the owner: a
	// snapshot's files never change (docs/DECISIONS.md, "Snapshots and
	// forks").
	SnapshotOf string `json:"snapshot_of,omitempty"`
	// Deleted is when the run was deleted: its owner record stays as a
	// tombstone, so the id is never a run again (DeleteRun).
	Deleted *time.Time `json:"deleted,omitempty"`
}

// Caller is who started the run, as run views show it.
func (ow Owner) Caller() wire.Caller {
	return wire.Caller{KeyID: ow.KeyID, Name: ow.Name, Tenant: ow.Tenant}
}

// Principal is who acts for the run where the run itself is the
// credential: the key that created it (the operator for a run the
// operator created), with the runs scope.
func (ow Owner) Principal() auth.Principal {
	if ow.KeyID == "" {
		return auth.Operator
	}
	return auth.Principal{KeyID: ow.KeyID, Name: ow.Name, Tenant: ow.Tenant, Scopes: []auth.Scope{auth.Runs}}
}

// Metrics receives what tenancy decides; nil records nothing.
type Metrics interface {
	// RunStatus is a run entering a status ("open" when it is created).
	RunStatus(status string)
	// QuotaRefused is a call refused by a quota.
	QuotaRefused(limit string)
	// KernelReclaimed is an idle kernel reclaimed at the kernel quota.
	KernelReclaimed()
	// TenantUsed is what a tenant's run used since its last report: CPU
	// seconds and memory byte-seconds where known (zero otherwise), and
	// egress bytes out and in.
	TenantUsed(tenant string, cpuSeconds, memoryByteSeconds float64, egressOut, egressIn int64)
	// TenantStored is the bytes a tenant's runs store, whenever this
	// process reads or writes its usage record.
	TenantStored(tenant string, bytes int64)
}

// Config configures a Tenancy.
type Config struct {
	Store   *tmpfs.Store
	Quotas  Quotas
	Logger  *slog.Logger
	Metrics Metrics
	// FlushEvery is how often the background writer stores the index
	// changes calls made (0: 250 ms).
	FlushEvery time.Duration
}

// Tenancy keeps owners, quotas, the run index and usage. Its background
// writer is started by New and stopped by Close.
type Tenancy struct {
	store *tmpfs.Store
	meta  tmpfs.Meta
	q     Quotas
	log   *slog.Logger
	m     Metrics
	every time.Duration

	mu      sync.Mutex
	usage   map[string]usageAt          // stored bytes per tenant, trusted for a second
	marked  map[string]struct{}         // tenant + "/" + digest, marker written
	starts  map[string]map[runid.ID]int // kernels being started, per tenant
	uploads map[string]int              // streamed uploads in flight, per tenant
	index   map[runid.ID]*entry         // index changes not yet written (index.go)
	delta   map[string]usageRec         // usage changes not yet written, per tenant
	flushMu sync.Mutex                  // one flush at a time
	// kmu serializes kernel reservations (ReserveKernel): the count, the
	// choice of a kernel to reclaim and its removal are one step.
	kmu sync.Mutex

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

type usageAt struct {
	bytes int64
	at    time.Time
}

// maxCached bounds each cache; past it, the cache starts over.
const maxCached = 100000

// maxMarked bounds the blob markers known written. It is one entry per
// blob a tenant ever held, so it grows with work, not with tenants: kept
// small, since a miss costs one conditional metadata write.
const maxMarked = 1 << 13

// New returns a Tenancy and starts its background writer.
func New(c Config) *Tenancy {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = 250 * time.Millisecond
	}
	t := &Tenancy{store: c.Store, meta: c.Store.Meta(), q: c.Quotas, log: c.Logger, m: c.Metrics, every: c.FlushEvery,
		usage: map[string]usageAt{}, marked: map[string]struct{}{}, starts: map[string]map[runid.ID]int{},
		uploads: map[string]int{}, index: map[runid.ID]*entry{}, delta: map[string]usageRec{}, stop: make(chan struct{}), done: make(chan struct{})}
	go t.writer()
	return t
}

// Close stops the background writer and writes what calls left pending.
// Call it before closing the store; it is safe to call twice.
func (t *Tenancy) Close() error {
	t.once.Do(func() {
		close(t.stop)
		<-t.done
	})
	t.Flush(context.Background())
	return nil
}

// Quotas returns the configured quotas.
func (t *Tenancy) Quotas() Quotas { return t.q }

func (t *Tenancy) runStatus(s string) {
	if t.m != nil {
		t.m.RunStatus(s)
	}
}

func (t *Tenancy) reclaimed() {
	if t.m != nil {
		t.m.KernelReclaimed()
	}
}

func (t *Tenancy) refused(limit string) {
	if t.m != nil {
		t.m.QuotaRefused(limit)
	}
}

func ownerKey(run runid.ID) string { return "owners/" + run.String() }

func runsPrefix(tenant string) string { return "tenants/" + tenant + "/runs/" }

// indexKey names a run's entry in its tenant's index: newest sorts first.
func indexKey(ow Owner) string {
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

// Lookup reads a run's owner record; ok is false when the run has none.
// Owners never change, so a caller may cache what it returns.
func (t *Tenancy) Lookup(ctx context.Context, run runid.ID) (Owner, bool, error) {
	b, _, err := t.meta.GetMeta(ctx, ownerKey(run))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return Owner{}, false, nil
	}
	if err != nil {
		return Owner{}, false, err
	}
	var ow Owner
	if err := json.Unmarshal(b, &ow); err != nil {
		return Owner{}, false, fmt.Errorf("owner of run %s: %w", run, err)
	}
	if ow.Deleted != nil {
		return Owner{}, false, deleted(run)
	}
	return ow, true, nil
}

// ErrDeleted means the run was deleted: it is not found, and its id is
// never a run again. Lookup and Create answer it as a not_found fault.
var ErrDeleted = errors.New("tenancy: the run was deleted")

func deleted(run runid.ID) error {
	return fault.Wrap(fault.NotFound, ErrDeleted, fmt.Sprintf("no run %s", run),
		"check the run id; GET /runs lists your runs, POST /runs gives a fresh id")
}

// Create makes p the owner of run, within p's runs-per-hour quota, with a
// conditional create: when another call (here or on a replica) created
// the run first, its owner is returned with won false.
func (t *Tenancy) Create(ctx context.Context, run runid.ID, p auth.Principal) (Owner, bool, error) {
	if err := t.checkRunsPerHour(ctx, p); err != nil {
		return Owner{}, false, err
	}
	ow, won, err := t.put(ctx, Owner{Run: run, Tenant: p.Tenant, KeyID: p.KeyID, Name: p.Name, Created: time.Now().UTC()})
	if err == nil && won {
		t.runStatus("open")
	}
	return ow, won, err
}

// CreateSnapshot is Create for a snapshot of run of: a run of p's tenant,
// within the same runs-per-hour quota, whose owner record says what it
// was taken from.
func (t *Tenancy) CreateSnapshot(ctx context.Context, run runid.ID, p auth.Principal, of runid.ID) (Owner, bool, error) {
	if err := t.checkRunsPerHour(ctx, p); err != nil {
		return Owner{}, false, err
	}
	return t.put(ctx, Owner{Run: run, Tenant: p.Tenant, KeyID: p.KeyID, Name: p.Name, Created: time.Now().UTC(), SnapshotOf: of.String()})
}

// Adopt records ow for a run that existed before the core knew its owner
// (a migration), with no quota: as Create, the first record wins.
func (t *Tenancy) Adopt(ctx context.Context, ow Owner) (Owner, bool, error) {
	return t.put(ctx, ow)
}

// AdoptLegacy gives a run that has files but no owner (made before runs
// had owners) to the default tenant, once; ok is false when the run has
// no files either.
func (t *Tenancy) AdoptLegacy(ctx context.Context, run runid.ID) (Owner, bool, error) {
	files, err := t.store.List(ctx, run, "")
	if err != nil {
		return Owner{}, false, err
	}
	if len(files) == 0 {
		return Owner{}, false, nil
	}
	created := files[0].ModifiedAt
	for _, f := range files {
		if f.ModifiedAt.Before(created) {
			created = f.ModifiedAt
		}
	}
	ow, _, err := t.put(ctx, Owner{Run: run, Tenant: auth.DefaultTenant, Name: "before tenants", Created: created.UTC()})
	return ow, err == nil, err
}

// put writes an owner record, with a conditional create, and the run's
// first index entry.
func (t *Tenancy) put(ctx context.Context, ow Owner) (Owner, bool, error) {
	b, _ := json.Marshal(ow)
	_, err := t.meta.PutMeta(ctx, ownerKey(ow.Run), b, tmpfs.Cond{IfAbsent: true})
	if errors.Is(err, tmpfs.ErrPrecondition) {
		got, ok, err := t.Lookup(ctx, ow.Run)
		if err == nil && !ok {
			err = fmt.Errorf("owner of run %s vanished", ow.Run)
		}
		return got, false, err
	}
	if err != nil {
		return Owner{}, false, err
	}
	sb, _ := json.Marshal(Summary{RunSummary: firstSummary(ow)})
	if _, err := t.meta.PutMeta(ctx, indexKey(ow), sb, tmpfs.Cond{}); err != nil {
		t.log.WarnContext(ctx, "add a run to its tenant's index", "run", ow.Run, "err", err)
	}
	return ow, true, nil
}

// Remove deletes a run's owner record and its index entry, and takes the
// bytes its entry counted off its tenant's usage: the run is gone (one of
// Triad's own, retired).
func (t *Tenancy) Remove(ctx context.Context, ow Owner) error {
	t.mu.Lock()
	delete(t.index, ow.Run)
	t.mu.Unlock()
	var sum Summary
	if b, _, err := t.meta.GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &sum) == nil && sum.Bytes > 0 {
		if err := t.addUsage(ctx, ow.Tenant, usageRec{Bytes: -sum.Bytes}); err != nil {
			t.log.WarnContext(ctx, "take a removed run's bytes off its tenant's usage", "run", ow.Run, "err", err)
		}
	}
	for _, k := range []string{indexKey(ow), ownerKey(ow.Run)} {
		if err := t.meta.DeleteMeta(ctx, k); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return err
		}
	}
	return nil
}
