package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/browser/replay"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// SearchOptions are per-call knobs beyond the contract.
type SearchOptions struct {
	// SaveAs also writes the answer ({results, citations_id}) to this run
	// path, for the cells that read it (a recipe's search block).
	SaveAs string
}

// Search is browser.search. The raw upstream answer is kept as a citations
// record under citations/, and citations_id is that record's sha256. When
// replay is on for the run (or the server), the answer comes from the run's
// recorded records instead of the provider, so a replayed run sees exactly
// the evidence the original saw.
func (o *Orchestrator) Search(ctx context.Context, run runid.ID, w wire.SearchRequest, opt SearchOptions, opts ...CallOption) (wire.SearchResponse, error) {
	var out wire.SearchResponse
	req, err := browser.FromWire(w)
	if err != nil {
		return out, err
	}
	if opt.SaveAs != "" {
		p, err := writable(opt.SaveAs)
		if err != nil {
			return out, err
		}
		opt.SaveAs = p
	}
	oc := &SearchOutcome{Query: req.Query, TopK: req.TopK, IncludePage: req.IncludePage, AllowDomains: req.AllowDomains,
		DateRange: req.DateRange, SaveAs: opt.SaveAs}
	err = o.call(ctx, run, oc, opts, func(ctx context.Context, c *call) error {
		s := c.step
		rec, stored, err := c.search(ctx, req)
		if err != nil {
			return err
		}
		out = rec.Response()
		out.CitationsID = stored.SHA256.String()
		s.Artifacts = append(s.Artifacts, stored)
		oc.Searched, oc.Results = true, len(out.Results)
		for i, d := range rec.TopDomains {
			if i == 3 {
				break
			}
			oc.Domains = append(oc.Domains, d.Domain)
		}
		urls := make([]string, 0, len(out.Results))
		for _, r := range out.Results {
			urls = append(urls, r.URL)
		}
		c.r.journal.AddCitations(urls)
		if err := o.files.put(ctx, run, stored); err != nil {
			return err
		}
		if opt.SaveAs != "" {
			b, err := runfiles.MarshalIndent(out)
			if err != nil {
				return err
			}
			f, err := o.store.WriteBytes(ctx, run, opt.SaveAs, append(b, '\n'))
			if err != nil {
				return storeErr(err, run, opt.SaveAs)
			}
			s.Artifacts = append(s.Artifacts, f)
			return o.files.put(ctx, run, f)
		}
		return nil
	})
	return out, err
}

// search answers req live or from the run's records, and returns the
// stored record.
func (c *call) search(ctx context.Context, req browser.Request) (*browser.Record, tmpfs.File, error) {
	o, run := c.o, c.run
	if on, _ := c.r.replaying(o.replay); on {
		return c.replayed(ctx, req)
	}
	if o.search == nil {
		return nil, tmpfs.File{}, fault.New(fault.NotConfigured, "no search provider is configured",
			"set TAVILY_API_KEY (and TRIAD_TAVILY_URL for a proxy) and restart triad")
	}
	rec, err := o.search.Search(ctx, req)
	if err != nil {
		if fault.As(err) == nil {
			err = fault.Wrap(fault.Upstream, err, "the search failed: "+err.Error(), "retry the search")
		}
		o.metrics.search(outcome(err))
		return nil, tmpfs.File{}, err
	}
	o.metrics.search("ok")
	b, err := rec.Marshal()
	if err != nil {
		return nil, tmpfs.File{}, err
	}
	existing, err := o.store.List(ctx, run, runfiles.CitationsDir)
	if err != nil {
		return nil, tmpfs.File{}, storeErr(err, run, runfiles.CitationsDir)
	}
	key := rec.RequestKey
	if len(key) > 12 {
		key = key[:12]
	}
	p := fmt.Sprintf("%s%04d-%s.json", runfiles.CitationsDir, len(existing)+1, key)
	f, err := o.store.WriteBytes(ctx, run, p, b)
	if err != nil {
		return nil, tmpfs.File{}, storeErr(err, run, p)
	}
	return rec, f, nil
}

// replayed answers from the run's citations records (or those of the run
// it replays), in the order the original run made its searches.
func (c *call) replayed(ctx context.Context, req browser.Request) (*browser.Record, tmpfs.File, error) {
	o, run := c.o, c.run
	_, src := c.r.replaying(o.replay)
	other := !src.IsZero() && src != run
	if !other {
		src = run
	}
	files, err := o.store.List(ctx, src, runfiles.CitationsDir)
	if err != nil {
		return nil, tmpfs.File{}, storeErr(err, src, runfiles.CitationsDir)
	}
	rp := replay.New(nil)
	byDigest := map[tmpfs.Digest]tmpfs.File{}
	for _, f := range files {
		b, _, err := o.store.ReadAll(ctx, src, f.Path)
		if err != nil {
			return nil, tmpfs.File{}, storeErr(err, src, f.Path)
		}
		if rp.AddBytes(b) == nil {
			byDigest[f.SHA256] = f
		}
	}
	// Each earlier replayed call of the same request consumed one record.
	key := browser.RequestKey(req)
	c.r.mu.Lock()
	seen := c.r.replayed[key]
	c.r.mu.Unlock()
	var rec *browser.Record
	for i := 0; i <= seen; i++ {
		if rec, err = rp.Search(ctx, req); err != nil {
			if errors.Is(err, replay.ErrNotRecorded) {
				return nil, tmpfs.File{}, fault.Wrap(fault.NotFound, err, fmt.Sprintf("replay: run %s recorded no search for %q", run, req.Query),
					"replay answers only searches the original run made, with the same arguments; turn replay off to search live")
			}
			return nil, tmpfs.File{}, err
		}
	}
	c.r.mu.Lock()
	if c.r.replayed == nil {
		c.r.replayed = map[string]int{}
	}
	c.r.replayed[key]++
	c.r.mu.Unlock()
	b, err := rec.Marshal()
	if err != nil {
		return nil, tmpfs.File{}, err
	}
	f, ok := byDigest[tmpfs.DigestOf(b)]
	if !ok {
		return nil, tmpfs.File{}, fault.New(fault.Internal, "replay: a recorded citations record did not round-trip", "report this with the run id")
	}
	if other {
		// The record appears in the replaying run when its search is made,
		// at the path the original gave it, as it did in the original.
		if f, err = o.store.Link(ctx, run, f.Path, f.SHA256, f.Size); err != nil {
			return nil, tmpfs.File{}, storeErr(err, run, f.Path)
		}
	}
	return rec, f, nil
}

// replaying reports whether the run's searches replay its records (all
// runs' do by default when all is set), and whose records.
func (r *run) replaying(all bool) (bool, runid.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.replay == nil {
		return all, runid.ID{}
	}
	return r.replay.on, r.replay.src
}
