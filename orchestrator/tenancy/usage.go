package tenancy

import (
	"context"
	"encoding/json"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/wire"
)

// What each run used is kept with its index entry (Summary.Usage, a
// wire.RunUsage, written by the background writer like the rest of the
// entry), and summed per tenant in its usage record beside its stored
// bytes. Only the orchestrator reports use (Use), from its readings of
// the run's kernel and egress. See docs/DECISIONS.md, "Per-run
// accounting (issue 27)".

// Used is what a run's sandbox used since its previous report. A measure
// that is unknown (nil) changes nothing.
type Used struct {
	// CPUSeconds and MemoryByteSeconds add up; MemoryBytes is one
	// reading, and the run's peak is the largest.
	CPUSeconds        *float64
	MemoryBytes       *int64
	MemoryByteSeconds *float64
	// EgressOut and EgressIn are the bytes its egress sent and received:
	// always known (the proxy is the sandbox's only way out), so a run
	// that reported any use says how many, if none.
	EgressOut, EgressIn int64
}

// Use adds what ow's run used to its usage and its tenant's. It needs no
// lock of the run: additions commute. A run its tenant's index no longer
// lists (deleted) has nothing to add to, but its tenant's sums still
// count what it used.
func (t *Tenancy) Use(ctx context.Context, ow Owner, u Used) {
	t.noteIf(ctx, ow, nil, false, false, true, func(s *Summary) {
		s.Usage = add(s.Usage, u)
	})
	var d usageRec
	if u.CPUSeconds != nil {
		d.CPUSeconds = *u.CPUSeconds
	}
	if u.MemoryByteSeconds != nil {
		d.MemoryByteSeconds = *u.MemoryByteSeconds
	}
	d.EgressBytesOut, d.EgressBytesIn = u.EgressOut, u.EgressIn
	t.mu.Lock()
	t.delta[ow.Tenant] = t.delta[ow.Tenant].plus(d)
	t.mu.Unlock()
	if t.m != nil {
		t.m.TenantUsed(ow.Tenant, d.CPUSeconds, d.MemoryByteSeconds, d.EgressBytesOut, d.EgressBytesIn)
	}
}

// add returns r with u added. It never changes what r points to: a copy
// of an entry's usage handed out (Listed) stays as it was.
func add(r *wire.RunUsage, u Used) *wire.RunUsage {
	var out wire.RunUsage
	if r != nil {
		out = *r
	}
	sum := func(p *float64, d *float64) *float64 {
		if d == nil {
			return p
		}
		v := *d
		if p != nil {
			v += *p
		}
		return &v
	}
	out.CPUSeconds = sum(out.CPUSeconds, u.CPUSeconds)
	out.MemoryByteSeconds = sum(out.MemoryByteSeconds, u.MemoryByteSeconds)
	if m := u.MemoryBytes; m != nil && (out.MemoryPeakBytes == nil || *m > *out.MemoryPeakBytes) {
		v := *m
		out.MemoryPeakBytes = &v
	}
	o, i := u.EgressOut, u.EgressIn
	if out.EgressBytesOut != nil {
		o += *out.EgressBytesOut
	}
	if out.EgressBytesIn != nil {
		i += *out.EgressBytesIn
	}
	out.EgressBytesOut, out.EgressBytesIn = &o, &i
	return &out
}

// Listed is the run as GET /runs lists it: its summary, with its usage
// (its stored bytes as of its last note) in a copy of its own.
func (s Summary) Listed() wire.RunSummary {
	out := s.RunSummary
	var u wire.RunUsage
	if s.Usage != nil {
		u = *s.Usage
	}
	u.StoredBytes = s.Bytes
	out.Usage = &u
	return out
}

// RunUsage returns what ow's run has used, from its index entry (the
// pending one, if a change is not written yet), with the bytes its files
// hold now.
func (t *Tenancy) RunUsage(ctx context.Context, ow Owner) wire.RunUsage {
	var s Summary
	t.mu.Lock()
	e := t.index[ow.Run]
	if e != nil {
		s = e.sum
	}
	t.mu.Unlock()
	if e == nil {
		if b, _, err := t.meta.GetMeta(ctx, indexKey(ow)); err == nil {
			json.Unmarshal(b, &s)
		}
	}
	if n, err := t.store.Usage(ctx, ow.Run); err == nil {
		s.Bytes = n
	}
	return *s.Listed().Usage
}

// TenantUsage returns what the caller's tenant's runs used and store; an
// admin may name another tenant.
func (t *Tenancy) TenantUsage(ctx context.Context, tenant string) (wire.TenantUsage, error) {
	p := auth.From(ctx)
	if !p.Has(auth.Read) {
		return wire.TenantUsage{}, Forbidden(p, auth.Read)
	}
	if tenant == "" {
		tenant = p.Tenant
	}
	if err := auth.CheckTenant(tenant); err != nil {
		return wire.TenantUsage{}, fault.Wrap(fault.BadInput, err, err.Error(), "omit tenant for your own usage")
	}
	if !p.CanSee(tenant) {
		return wire.TenantUsage{}, Forbidden(p, auth.Admin)
	}
	t.Flush(ctx) // read your own writes
	rec, err := t.usageOf(ctx, tenant)
	if err != nil {
		return wire.TenantUsage{}, err
	}
	return wire.TenantUsage{Tenant: tenant, CPUSeconds: rec.CPUSeconds, MemoryByteSeconds: rec.MemoryByteSeconds,
		StoredBytes: rec.Bytes, EgressBytesOut: rec.EgressBytesOut, EgressBytesIn: rec.EgressBytesIn}, nil
}
