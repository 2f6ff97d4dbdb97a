// Package replay is the browser.Provider that answers searches from recorded citations records instead of the web, so a replayed run sees exactly the evidence the original run saw.
//
// Records are matched by browser.RequestKey, so a request that differs only
// in form (domain order or case, top_k left at its default) still matches.
// When a run made the same search several times, the replay answers the
// first call with the first record, the second with the second, and every
// later call with the last: each replayed call gets the record, and so the
// citations_id, of the call it replays. The record is returned unchanged,
// so storing it again gives the same content address.
package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/internal/fault"
)

// ErrNotRecorded is the cause of the fault.NotFound a strict replay returns
// for a search the original run did not make. Callers that can fall back to
// a live search should configure a fallback instead of matching it.
var ErrNotRecorded = errors.New("search not recorded")

// Name is the provider name replay reports in logs. Records it returns keep
// the name of the provider that made them.
const Name = "replay"

// Provider answers from records. It is safe for concurrent use.
type Provider struct {
	fallback browser.Provider

	mu    sync.Mutex
	byKey map[string]*queue
}

type queue struct {
	records []*browser.Record
	next    int
}

var _ browser.Provider = (*Provider)(nil)

// New returns a replay of records. fallback answers searches that were not
// recorded; nil makes the replay strict (such searches fail with
// fault.NotFound wrapping ErrNotRecorded). Records are replayed per key in
// the order given, so pass them in the order the original run made them.
func New(fallback browser.Provider, records ...*browser.Record) *Provider {
	p := &Provider{fallback: fallback, byKey: map[string]*queue{}}
	for _, r := range records {
		p.Add(r)
	}
	return p
}

// Add appends rec to the records replayed for its request key.
func (p *Provider) Add(rec *browser.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.byKey[rec.RequestKey]
	if q == nil {
		q = &queue{}
		p.byKey[rec.RequestKey] = q
	}
	q.records = append(q.records, rec)
}

// AddBytes parses a stored record (the bytes of Record.Marshal) and adds it.
func (p *Provider) AddBytes(b []byte) error {
	rec, err := browser.ParseRecord(b)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	p.Add(rec)
	return nil
}

// Name implements browser.Provider.
func (p *Provider) Name() string { return Name }

// Search implements browser.Provider: it returns the recorded record for req
// without contacting anyone, or asks the fallback.
func (p *Provider) Search(ctx context.Context, req browser.Request) (*browser.Record, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	key := browser.RequestKey(req)
	p.mu.Lock()
	q := p.byKey[key]
	var rec *browser.Record
	if q != nil {
		rec = q.records[min(q.next, len(q.records)-1)]
		q.next++
	}
	p.mu.Unlock()
	if rec != nil {
		return rec, nil
	}
	if p.fallback != nil {
		return p.fallback.Search(ctx, req)
	}
	return nil, fault.Wrap(fault.NotFound, ErrNotRecorded,
		fmt.Sprintf("search %q was not made by the run being replayed (request key %s)", req.Normalized().Query, key),
		"replay only the searches the original run made, or turn replay off to search the web")
}
