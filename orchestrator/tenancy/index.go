package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/internal/storeerr"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// A run's entry in its tenant's run index, the tenant's usage and its blob
// markers change with every call. Writing them in the call would add
// several store writes (fsyncs, or S3 round trips) to each one, so a call
// changes them here in memory and the background writer stores what
// changed every Config.FlushEvery, coalescing a run's calls into one
// write. Readers that must see the latest state flush first: GET /runs,
// and a files_in by hash that finds no marker; the stored-bytes quota adds
// the changes not yet written to the stored usage. A crash loses at most
// FlushEvery of index updates (see docs/DECISIONS.md, "Tenants").

// Summary is a run's entry in its tenant's run index. Its Usage is what
// the run used (Use); its stored bytes are Bytes, not kept twice:
// Listed puts them in the usage it hands out.
type Summary struct {
	wire.RunSummary
	// Bytes is what the run's files hold, for the tenant's usage.
	Bytes int64 `json:"bytes"`
}

// firstSummary is a new run's index entry.
func firstSummary(ow Owner) wire.RunSummary {
	return wire.RunSummary{RunID: ow.Run.String(), Status: "open", Created: ow.Created, Updated: ow.Created, StartedBy: ow.Caller()}
}

// entry is a run's index entry while it changes.
type entry struct {
	ow    Owner
	sum   Summary
	dirty bool
	idle  int          // flushes since the last change; the entry is dropped after a few
	files []tmpfs.File // files written since the last flush, whose blobs to mark
	all   bool         // mark every file of the run at the next flush
}

// Note applies edit to the run's entry (ow's run), with the bytes its
// files now hold, and schedules the write; files are what the call wrote,
// whose blobs the tenant now holds, and all asks for every file of the
// run to be marked (the first time this process notes the run). Call it
// with the run locked. Its cost does not grow with the run: the bytes are
// the store's running count (tmpfs.Store.Usage), and only the call's own
// files are marked.
func (t *Tenancy) Note(ctx context.Context, ow Owner, files []tmpfs.File, all bool, edit func(*Summary)) {
	t.note(ctx, ow, files, all, true, edit)
}

// Label applies edit to the run's entry as Note does, but as a change to
// how the run is listed (its name and tags), not its activity: its
// Updated time stays. Call it with the run locked.
func (t *Tenancy) Label(ctx context.Context, ow Owner, edit func(*Summary)) {
	t.note(ctx, ow, nil, false, false, edit)
}

// Labels returns a run's name and tags from its index entry (the pending
// one, if a change is not written yet).
func (t *Tenancy) Labels(ctx context.Context, ow Owner) (string, []string) {
	t.mu.Lock()
	if e := t.index[ow.Run]; e != nil {
		name, tags := e.sum.Name, slices.Clone(e.sum.Tags)
		t.mu.Unlock()
		return name, tags
	}
	t.mu.Unlock()
	var s Summary
	if b, _, err := t.meta.GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &s) == nil {
		return s.Name, s.Tags
	}
	return "", nil
}

func (t *Tenancy) note(ctx context.Context, ow Owner, files []tmpfs.File, all, touch bool, edit func(*Summary)) {
	t.noteIf(ctx, ow, files, all, touch, false, edit)
}

// noteIf is note; with listed, only for a run its tenant's index lists
// (one not deleted meanwhile), and it reports whether it was.
func (t *Tenancy) noteIf(ctx context.Context, ow Owner, files []tmpfs.File, all, touch, listed bool, edit func(*Summary)) bool {
	run := ow.Run
	bytes, lerr := t.store.Usage(ctx, run)
	t.mu.Lock()
	e := t.index[run]
	t.mu.Unlock()
	if e == nil {
		e = &entry{ow: ow}
		b, _, err := t.meta.GetMeta(ctx, indexKey(ow))
		switch {
		case err == nil:
			json.Unmarshal(b, &e.sum)
		case listed:
			return false
		default:
			e.sum = Summary{RunSummary: firstSummary(ow)}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.index[run]; cur != nil {
		e = cur
	}
	t.index[run] = e
	if lerr == nil {
		d := t.delta[ow.Tenant]
		d.Bytes += bytes - e.sum.Bytes
		t.delta[ow.Tenant] = d
		e.sum.Bytes = bytes
	}
	edit(&e.sum)
	e.files = append(e.files, files...)
	e.all = e.all || all
	if touch {
		e.sum.Updated = time.Now().UTC()
	}
	e.dirty, e.idle = true, 0
	return true
}

// Pending reports whether the run has index changes not yet written.
func (t *Tenancy) Pending(run runid.ID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.index[run] != nil
}

// Cached counts the runs whose index changes are kept in memory.
func (t *Tenancy) Cached() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.index)
}

// SetStatus records a run's recipe and status in its index entry, with the
// objective when there is one, for GET /runs.
func (t *Tenancy) SetStatus(ctx context.Context, ow Owner, recipe, status, objective string) {
	t.Note(ctx, ow, nil, false, func(s *Summary) {
		if s.Status != status {
			t.runStatus(status)
		}
		s.Recipe, s.Status = recipe, status
		if objective != "" {
			s.Objective = objective
		}
	})
}

// writer stores what changed every FlushEvery until Close. A store that
// refuses every write for 40 flushes is given up on, loudly, rather than
// retried forever.
func (t *Tenancy) writer() {
	defer close(t.done)
	const giveUp = 40
	failing := 0
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		t.mu.Lock()
		idle := len(t.index) == 0 && len(t.delta) == 0
		t.mu.Unlock()
		if idle {
			continue
		}
		if t.Flush(context.Background()) {
			failing = 0
			continue
		}
		if failing++; failing >= giveUp {
			t.mu.Lock()
			t.log.Error("the store refused the run index and usage updates for 40 flushes; dropping them", "runs", len(t.index))
			clear(t.index)
			clear(t.delta)
			t.mu.Unlock()
			failing = 0
		}
	}
}

// Flush writes the run summaries, usage changes and blob markers that
// calls made since the last flush; failed writes are kept for the next.
// It reports false when some write failed.
func (t *Tenancy) Flush(ctx context.Context) bool {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	type job struct {
		ow    Owner
		sum   Summary
		files []tmpfs.File
		all   bool
	}
	var jobs []job
	t.mu.Lock()
	for run, e := range t.index {
		switch {
		case e.dirty:
			jobs = append(jobs, job{e.ow, e.sum, e.files, e.all})
			e.dirty, e.files, e.all = false, nil, false
		case e.idle >= 4:
			delete(t.index, run)
		default:
			e.idle++
		}
	}
	delta := t.delta
	t.delta = map[string]usageRec{}
	t.mu.Unlock()

	ok := true
	for _, j := range jobs {
		b, _ := json.Marshal(j.sum)
		if _, err := t.meta.PutMeta(ctx, indexKey(j.ow), b, tmpfs.Cond{}); err != nil {
			t.log.WarnContext(ctx, "write the run's index entry; will retry", "run", j.ow.Run, "err", err)
			ok = false
			t.mu.Lock()
			if e := t.index[j.ow.Run]; e != nil {
				e.dirty = true
				e.files = append(e.files, j.files...)
				e.all = e.all || j.all
			}
			t.mu.Unlock()
			continue
		}
		files := j.files
		if j.all {
			if all, err := t.store.List(ctx, j.ow.Run, ""); err == nil {
				files = all
			}
		}
		t.markBlobs(ctx, j.ow.Tenant, files)
	}
	for tenant, d := range delta {
		if d == (usageRec{}) {
			continue
		}
		if err := t.addUsage(ctx, tenant, d); err != nil {
			t.log.WarnContext(ctx, "update the tenant's usage; will retry", "tenant", tenant, "err", err)
			ok = false
			t.mu.Lock()
			t.delta[tenant] = t.delta[tenant].plus(d)
			t.mu.Unlock()
		}
	}
	return ok
}

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
	// Query keeps only runs that match each of its words in their id,
	// name, objective, recipe or tags (tag:x needs the tag x); empty keeps
	// all.
	Query string
	// Sort is one of Sorts; empty is SortCreated, newest first.
	Sort string
}

// keep reports whether a run passes the query's filters.
func (q RunsQuery) keep(s wire.RunSummary) bool {
	switch {
	case q.Status != "" && s.Status != q.Status:
		return false
	case q.Recipe == ManualRuns && s.Recipe != "":
		return false
	case q.Recipe != "" && q.Recipe != ManualRuns && s.Recipe != q.Recipe:
		return false
	}
	return search(s, q.Query)
}

// ManualRuns is the RunsQuery.Recipe of runs that are not recipe runs.
const ManualRuns = "manual"

// maxScan bounds the index entries one filtered page reads: a filter
// that matches rarely answers a short page with a cursor to go on from.
const maxScan = 1000

// Runs lists the caller's runs, newest first, a page at a time: q.Limit
// runs after the cursor a previous page returned, optionally only those
// of a status or recipe. An admin may name another tenant.
func (t *Tenancy) Runs(ctx context.Context, q RunsQuery) (wire.RunList, error) {
	out := wire.RunList{Runs: []wire.RunSummary{}}
	p := auth.From(ctx)
	if !p.Has(auth.Read) {
		return out, Forbidden(p, auth.Read)
	}
	tenant := q.Tenant
	if tenant == "" {
		tenant = p.Tenant
	}
	if err := auth.CheckTenant(tenant); err != nil {
		return out, fault.Wrap(fault.BadInput, err, err.Error(), "omit tenant to list your own runs")
	}
	if !p.CanSee(tenant) {
		return out, Forbidden(p, auth.Admin)
	}
	if len(q.Status) > 64 || len(q.Recipe) > 200 || len(q.Query) > 500 {
		return out, fault.New(fault.BadInput, "status, recipe or q is too long", "send a status such as running, a recipe name from GET /recipes, or a few words to search for")
	}
	if q.Sort != "" && !slices.Contains(Sorts, q.Sort) {
		return out, fault.Badf("send sort as one of "+strings.Join(Sorts, ", ")+", or omit it for newest first", "sort %q is not an order GET /runs knows", q.Sort)
	}
	t.Flush(ctx) // read your own writes
	limit := q.Limit
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 200 {
		return out, fault.Badf("send limit between 1 and 200, or omit it for 50", "limit %d is out of range", limit)
	}
	if q.Sort != "" && q.Sort != SortCreated {
		return t.sortedRuns(ctx, tenant, q, limit)
	}
	after := ""
	if q.Cursor != "" {
		after = runsPrefix(tenant) + q.Cursor
		if err := tmpfs.CheckMetaKey(after); err != nil || strings.Contains(q.Cursor, "/") {
			return out, fault.New(fault.BadInput, "the cursor is not one this server gave", "send next_cursor from the previous page unchanged, or omit it for the first page")
		}
	}
	filtered := q.Status != "" || q.Recipe != "" || strings.TrimSpace(q.Query) != ""
	keep := q.keep
	scanned, lastKey := 0, ""
	for {
		batch := limit + 1
		if filtered {
			batch = min(200, maxScan-scanned)
		}
		keys, err := t.meta.ListMeta(ctx, runsPrefix(tenant), after, batch)
		if err != nil {
			return out, storeerr.Fault(err, runid.ID{}, "")
		}
		sums, err := t.summaries(ctx, keys)
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

// sortedRuns is a page of runs in another order than the index's: the
// tenant's newest maxSorted runs are read, filtered and sorted, and the
// cursor is an offset into that order.
func (t *Tenancy) sortedRuns(ctx context.Context, tenant string, q RunsQuery, limit int) (wire.RunList, error) {
	out := wire.RunList{Runs: []wire.RunSummary{}}
	offset := 0
	if q.Cursor != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(q.Cursor, "@"))
		if !strings.HasPrefix(q.Cursor, "@") || err != nil || n < 0 {
			return out, fault.New(fault.BadInput, "the cursor is not one this server gave", "send next_cursor from the previous page unchanged, with the same sort, or omit it for the first page")
		}
		offset = n
	}
	var all []wire.RunSummary
	after := ""
	for scanned := 0; scanned < maxSorted; {
		keys, err := t.meta.ListMeta(ctx, runsPrefix(tenant), after, 200)
		if err != nil {
			return out, storeerr.Fault(err, runid.ID{}, "")
		}
		sums, err := t.summaries(ctx, keys)
		if err != nil {
			return out, err
		}
		for i, k := range keys {
			after = k
			if sums[i] != nil && q.keep(*sums[i]) {
				all = append(all, *sums[i])
			}
		}
		scanned += len(keys)
		if len(keys) < 200 {
			break
		}
	}
	sortRuns(all, q.Sort)
	if offset < len(all) {
		out.Runs = append(out.Runs, all[offset:min(len(all), offset+limit)]...)
	}
	if offset+limit < len(all) {
		out.NextCursor = sortedCursor(offset + limit)
	}
	return out, nil
}

// The orders GET /runs sorts by.
const (
	SortCreated = "created" // newest first, the default
	SortOldest  = "oldest"
	SortUpdated = "updated" // latest activity first
	SortName    = "name"    // A to Z, unnamed runs last
)

// Sorts lists the orders RunsQuery.Sort takes.
var Sorts = []string{SortCreated, SortOldest, SortUpdated, SortName}

// maxSorted bounds the index entries a page in another order than the
// index's own reads: the tenant's newest runs, this many of them.
const maxSorted = 5000

// search reports whether a run matches every term of q: a term tag:x
// needs the tag x; any other term is looked for in the run's id, name,
// objective, recipe and tags, ignoring case.
func search(s wire.RunSummary, q string) bool {
	for _, term := range strings.Fields(strings.ToLower(q)) {
		if t, ok := strings.CutPrefix(term, "tag:"); ok {
			if !slices.Contains(s.Tags, t) {
				return false
			}
			continue
		}
		hay := strings.ToLower(s.RunID + "\x00" + s.Name + "\x00" + s.Objective + "\x00" + s.Recipe + "\x00" + strings.Join(s.Tags, "\x00"))
		if !strings.Contains(hay, term) {
			return false
		}
	}
	return true
}

// sortedCursor is a page's cursor in another order than the index's: the
// offset of the page's first run, after "@".
func sortedCursor(offset int) string { return "@" + strconv.Itoa(offset) }

// sortRuns orders runs for q.Sort.
func sortRuns(runs []wire.RunSummary, by string) {
	sort.SliceStable(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		switch by {
		case SortOldest:
			return a.Created.Before(b.Created)
		case SortUpdated:
			return a.Updated.After(b.Updated)
		case SortName:
			if (a.Name == "") != (b.Name == "") {
				return a.Name != ""
			}
			if x, y := strings.ToLower(a.Name), strings.ToLower(b.Name); x != y {
				return x < y
			}
		}
		return a.Created.After(b.Created)
	})
}

// summaries reads index entries, 16 at a time; an entry deleted meanwhile
// is nil.
func (t *Tenancy) summaries(ctx context.Context, keys []string) ([]*wire.RunSummary, error) {
	sums := make([]*wire.RunSummary, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			b, _, err := t.meta.GetMeta(ctx, k)
			if err != nil {
				errs[i] = err
				return
			}
			var s Summary
			if errs[i] = json.Unmarshal(b, &s); errs[i] == nil {
				l := s.Listed()
				sums[i] = &l
			}
		}()
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil && !errors.Is(errs[i], tmpfs.ErrNotFound) {
			return nil, storeerr.Fault(errs[i], runid.ID{}, "")
		}
	}
	return sums, nil
}

// Forbidden is the answer for a key whose scope does not allow a call.
func Forbidden(p auth.Principal, need auth.Scope) error {
	return fault.New(fault.Forbidden, fmt.Sprintf("API key %s (scopes %v) does not have the %s scope this call needs", p.KeyID, p.Scopes, need),
		fmt.Sprintf("use a key with the %s scope; an admin creates one with: triad keys create --name NAME --scope %s", need, need))
}
