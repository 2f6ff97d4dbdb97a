package orchestrator

import (
	"context"
	"encoding/json"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// A run's entry in its tenant's run index, the tenant's usage and its blob
// markers change with every call. Writing them in the call would add
// several store writes (fsyncs, or S3 round trips) to each one, so the
// call changes them in memory and a background writer stores what changed
// every flushEvery, coalescing a run's calls into one write. Readers that
// must see the latest state flush first: GET /runs, and a files_in by
// hash that finds no marker; the stored-bytes quota adds the changes not
// yet written to the stored usage. A crash loses at most flushEvery of
// index updates (see docs/DECISIONS.md, "Tenants").
const flushEvery = 250 * time.Millisecond

// runSum is a run's summary while it changes.
type runSum struct {
	ow    owner
	sum   summary
	dirty bool
	idle  int          // flushes since the last change; the entry is dropped after a few
	files []tmpfs.File // files written since the last flush, whose blobs to mark
}

// noteRun applies edit to the run's summary, with the bytes its files
// now hold, and schedules the write; files are what the call wrote, whose
// blobs the tenant now holds. Call it with the run locked. Its cost does
// not grow with the run: the bytes are the store's running count
// (tmpfs.Store.Usage), and only the call's own files are marked.
func (o *Orchestrator) noteRun(ctx context.Context, run runid.ID, files []tmpfs.File, edit func(*summary)) {
	ow, ok, err := o.ownerOf(ctx, run)
	if err != nil || !ok {
		return
	}
	bytes, lerr := o.store.Usage(ctx, run)
	o.t.smu.Lock()
	rs := o.t.sums[run]
	o.t.smu.Unlock()
	if rs == nil {
		rs = &runSum{ow: ow}
		if b, _, err := o.store.Meta().GetMeta(ctx, indexKey(ow)); err == nil {
			json.Unmarshal(b, &rs.sum)
		} else {
			rs.sum = summary{RunSummary: newSummary(ow).RunSummary}
		}
	}
	o.t.smu.Lock()
	defer o.t.smu.Unlock()
	if cur := o.t.sums[run]; cur != nil {
		rs = cur
	}
	o.t.sums[run] = rs
	if lerr == nil {
		o.t.delta[ow.Tenant] += bytes - rs.sum.Bytes
		rs.sum.Bytes = bytes
	}
	edit(&rs.sum)
	rs.files = append(rs.files, files...)
	rs.sum.Updated = time.Now().UTC()
	rs.dirty, rs.idle = true, 0
	if !o.t.flushing {
		o.t.flushing = true
		go o.flusher()
	}
}

func newSummary(ow owner) summary {
	return summary{RunSummary: wireSummary(ow)}
}

// pendingBytes is the tenant's usage change not yet written.
func (o *Orchestrator) pendingBytes(tenant string) int64 {
	o.t.smu.Lock()
	defer o.t.smu.Unlock()
	return o.t.delta[tenant]
}

// flusher writes what changed until nothing is left to write. A store
// that refuses every write for giveUp is given up on, loudly, rather than
// retried forever.
func (o *Orchestrator) flusher() {
	const giveUp = 40 // flushes: 10 s
	failing := 0
	for {
		time.Sleep(flushEvery)
		if o.Flush(context.Background()) {
			failing = 0
		} else {
			failing++
		}
		o.t.smu.Lock()
		if len(o.t.sums) == 0 && len(o.t.delta) == 0 || failing >= giveUp {
			if failing >= giveUp {
				o.log.Error("the store refused the run index and usage updates for 10 s; dropping them", "runs", len(o.t.sums))
				clear(o.t.sums)
				clear(o.t.delta)
			}
			o.t.flushing = false
			o.t.smu.Unlock()
			return
		}
		o.t.smu.Unlock()
	}
}

// Close waits for the steps being recorded and writes what calls left
// pending (Flush); call it before closing the store. The orchestrator stays usable; Close is safe to call twice.
func (o *Orchestrator) Close() error {
	o.closeEgress()
	o.pend.wg.Wait() // steps being recorded
	o.Flush(context.Background())
	return nil
}

// Flush writes the run summaries, usage changes and blob markers that
// calls made since the last flush; failed writes are kept for the next.
// It reports false when some write failed.
func (o *Orchestrator) Flush(ctx context.Context) bool {
	o.t.flushMu.Lock()
	defer o.t.flushMu.Unlock()
	type job struct {
		run   runid.ID
		ow    owner
		sum   summary
		files []tmpfs.File
		all   bool // mark every file of the run: the first flush of it in this process
	}
	var jobs []job
	o.t.smu.Lock()
	for run, rs := range o.t.sums {
		switch {
		case rs.dirty:
			all := !o.t.listed[run]
			if all {
				if len(o.t.listed) >= maxCached {
					clear(o.t.listed)
				}
				o.t.listed[run] = true
			}
			jobs = append(jobs, job{run, rs.ow, rs.sum, rs.files, all})
			rs.dirty, rs.files = false, nil
		case rs.idle >= 4:
			delete(o.t.sums, run)
		default:
			rs.idle++
		}
	}
	delta := o.t.delta
	o.t.delta = map[string]int64{}
	o.t.smu.Unlock()

	ok := true
	m := o.store.Meta()
	for _, j := range jobs {
		b, _ := json.Marshal(j.sum)
		if _, err := m.PutMeta(ctx, indexKey(j.ow), b, tmpfs.Cond{}); err != nil {
			o.log.WarnContext(ctx, "write the run's index entry; will retry", "run", j.run, "err", err)
			ok = false
			o.t.smu.Lock()
			if rs := o.t.sums[j.run]; rs != nil {
				rs.dirty = true
				rs.files = append(rs.files, j.files...)
			}
			if j.all {
				delete(o.t.listed, j.run)
			}
			o.t.smu.Unlock()
			continue
		}
		files := j.files
		if j.all {
			if all, err := o.store.List(ctx, j.run, ""); err == nil {
				files = all
			}
		}
		o.markBlobs(ctx, j.ow.Tenant, files)
	}
	for tenant, d := range delta {
		if d == 0 {
			continue
		}
		if err := o.addUsage(ctx, tenant, d); err != nil {
			o.log.WarnContext(ctx, "update the tenant's usage; will retry", "tenant", tenant, "err", err)
			ok = false
			o.t.smu.Lock()
			o.t.delta[tenant] += d
			o.t.smu.Unlock()
		}
	}
	return ok
}
