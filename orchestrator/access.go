package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/orchestrator/tenancy"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
)

// Who may use a run is the core's to decide, once: a run belongs to the
// tenant whose caller created it (package tenancy keeps the records), a
// run owned by another tenant is answered exactly as a run that does not
// exist (not_found, never forbidden, so run ids leak nothing), and Triad's
// own ids are refused to every caller. See docs/DECISIONS.md, "Tenants"
// and "One owner per run".

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

// Create starts run, an id the surface just minted (POST /runs, an E2B
// sandbox, a recipe run or a replay, an MCP session), as a run of the
// caller's tenant. This is where a run's owner is decided, once, before
// any call can name the run: a surface that hands out a run id creates the
// run first. An id in use anywhere is a conflict (the owner record is
// written with a conditional create, so replicas sharing a store cannot
// both win).
func (o *Orchestrator) Create(ctx context.Context, id runid.ID, opts ...RunOption) error {
	p := auth.From(ctx)
	if !p.Has(auth.Runs) {
		return tenancy.Forbidden(p, auth.Runs)
	}
	if id.Reserved() {
		return reservedRun(id)
	}
	r, done := o.runs.use(id)
	defer done()
	ow, won, err := o.t.Create(ctx, id, p)
	if err != nil {
		return storeErr(err, id, "")
	}
	r.setOwner(ow)
	if !won {
		return fault.New(fault.Conflict, fmt.Sprintf("run id %s is already in use", id), "mint another run id (POST /runs gives a fresh one)")
	}
	return o.settings(ctx, r, opts)
}

// RunOption is a setting of a run that is kept nowhere but in this
// process, given when a surface creates or opens the run.
type RunOption func(*runSettings)

type runSettings struct {
	info     *cel.Header
	replay   *replaying
	copyFrom runid.ID
}

// WithRunInfo names the recipe and objective for the run's journal
// header; give it before the run's first call.
func WithRunInfo(recipe, objective string) RunOption {
	return func(s *runSettings) { s.info = &cel.Header{Recipe: recipe, Objective: objective} }
}

// ReplaySearches answers the run's searches from recorded citations
// records instead of the provider: src's (each search links the record it
// replays into the run when it is made, at the path src gave it, so the
// run's files match src's step by step), or the run's own when src is
// zero.
func ReplaySearches(src runid.ID) RunOption {
	return func(s *runSettings) { s.replay = &replaying{on: true, src: src} }
}

// CopySearches copies the citations records of run src (which the caller
// must be able to read) into the run first, and replays them.
func CopySearches(src runid.ID) RunOption {
	return func(s *runSettings) { s.copyFrom, s.replay = src, &replaying{on: true} }
}

// settings applies a run's options, once its owner is known.
func (o *Orchestrator) settings(ctx context.Context, r *run, opts []RunOption) error {
	var s runSettings
	for _, opt := range opts {
		opt(&s)
	}
	if src := s.copyFrom; !src.IsZero() {
		// The citations records of src (which the caller must be able
		// to read) are linked into the run, whose searches replay them.
		rs, done := o.runs.use(src)
		defer done()
		if _, err := o.access(ctx, rs, auth.Read, false); err != nil {
			return err
		}
		files, err := o.store.List(ctx, src, runfiles.CitationsDir)
		if err != nil {
			return storeErr(err, src, runfiles.CitationsDir)
		}
		if len(files) == 0 {
			return fault.New(fault.NotFound, fmt.Sprintf("run %s has no recorded searches to replay", src),
				"check the run id; GET /tmp/list?prefix=citations/ with its X-Run-Id shows its records")
		}
		for _, f := range files {
			if _, err := safepath.Clean(f.Path); err != nil {
				continue
			}
			if _, err := o.store.Link(ctx, r.id, f.Path, f.SHA256, f.Size); err != nil {
				return storeErr(err, r.id, f.Path)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.info != nil {
		h := *s.info
		h.Run = r.id
		r.header = &h
	}
	if s.replay != nil {
		r.replay, r.replayed = s.replay, nil
	}
	return nil
}

// OpenRun is how a caller takes up a run outside a tool call (a recipe
// run resumed by run_id): the caller's own run, or, for an id nobody has
// used, a new run of the caller's tenant, created then and there exactly
// as a tool call naming a fresh id creates it. Another tenant's run is not
// found.
func (o *Orchestrator) OpenRun(ctx context.Context, id runid.ID, opts ...RunOption) error {
	r, done := o.runs.use(id)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, true); err != nil {
		return err
	}
	return o.settings(ctx, r, opts)
}

// Visible checks that the caller may read run, an existing run: a run
// that does not exist and another tenant's run are both not found.
func (o *Orchestrator) Visible(ctx context.Context, id runid.ID) error {
	r, done := o.runs.use(id)
	defer done()
	_, err := o.access(ctx, r, auth.Read, false)
	return err
}

// Creator returns who acts for a run where the run itself is the
// credential: an E2B sandbox's data plane, admitted by the sandbox's
// access token, calls as the key that created the sandbox's run (the
// operator for a run the operator created). It checks no access: the
// surface has authenticated the run its own way. A run with no owner is
// not found.
func (o *Orchestrator) Creator(ctx context.Context, id runid.ID) (auth.Principal, error) {
	if id.Reserved() {
		return auth.Principal{}, reservedRun(id)
	}
	r, done := o.runs.use(id)
	defer done()
	ow, ok, err := o.ownerOf(ctx, r)
	if err != nil {
		return auth.Principal{}, err
	}
	if !ok {
		return auth.Principal{}, notFound(id)
	}
	return ow.Principal(), nil
}

// ErrOwned is Adopt's answer for a run the core already has as another
// tenant's.
var ErrOwned = errors.New("orchestrator: the run belongs to another tenant")

// Adopt records run, which a surface made before the core owned every run
// (an E2B sandbox whose owner only the surface knew), as p's, created at
// created: a migration's step, once, on start. A run the core already has
// as p's tenant's is left as it is; as another tenant's, ErrOwned.
func (o *Orchestrator) Adopt(ctx context.Context, id runid.ID, p auth.Principal, created time.Time) error {
	if id.Reserved() {
		return reservedRun(id)
	}
	if err := auth.CheckTenant(p.Tenant); err != nil {
		return err
	}
	r, done := o.runs.use(id)
	defer done()
	ow, _, err := o.t.Adopt(ctx, tenancy.Owner{Run: id, Tenant: p.Tenant, KeyID: p.KeyID, Name: p.Name, Created: created.UTC()})
	if err != nil {
		return storeErr(err, id, "")
	}
	r.setOwner(ow)
	if ow.Tenant != p.Tenant {
		return fmt.Errorf("run %s: %w (%s, not %s)", id, ErrOwned, ow.Tenant, p.Tenant)
	}
	return nil
}

// Retire removes one of Triad's own runs (a reserved id) that held a
// surface's state before that state moved out of the runs: its files, its
// owner and its entry in its tenant's run index, and the usage its files
// counted. No caller could name the run; after Retire nothing of it is
// left but its blobs, which the store never deletes.
func (o *Orchestrator) Retire(ctx context.Context, id runid.ID) error {
	if !id.Reserved() {
		return fmt.Errorf("retire run %s: only Triad's own runs (%s...) are retired", id, runid.ReservedPrefix)
	}
	r, done := o.runs.use(id)
	defer done()
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	files, err := o.store.List(ctx, id, "")
	if err != nil {
		return storeErr(err, id, "")
	}
	for _, f := range files {
		if err := o.store.Delete(ctx, id, f.Path); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
			return storeErr(err, id, f.Path)
		}
	}
	if ow, ok, err := o.ownerOf(ctx, r); err != nil {
		return err
	} else if ok {
		if err := o.t.Remove(ctx, ow); err != nil {
			return storeErr(err, id, "")
		}
	}
	if err := o.store.Meta().DeleteMeta(ctx, "journal/"+id.String()+"/started"); err != nil && !errors.Is(err, tmpfs.ErrNotFound) {
		return storeErr(err, id, "")
	}
	r.mu.Lock()
	r.owned = false
	r.mu.Unlock()
	o.forget(r, true)
	return nil
}

// access checks the caller's scope and its right to the run, and returns
// the run's owner. With create, an id nobody has used becomes a run of the
// caller's (within the runs-per-hour quota), created with a conditional
// create, so that of two tenants naming the same fresh id at once (on
// this replica or another) one wins and the other finds another tenant's
// run; without, it is not found. A run id that is known in any way (an
// owner record, or files from before owners) is never created again.
// Triad's own ids (runid.Reserved) are refused, whether or not such a run
// exists.
func (o *Orchestrator) access(ctx context.Context, r *run, need auth.Scope, create bool) (tenancy.Owner, error) {
	p := auth.From(ctx)
	if !p.Has(need) {
		return tenancy.Owner{}, tenancy.Forbidden(p, need)
	}
	if r.id.Reserved() {
		return tenancy.Owner{}, reservedRun(r.id)
	}
	ow, ok, err := o.ownerOf(ctx, r)
	if err != nil {
		return tenancy.Owner{}, err
	}
	if !ok {
		if ow, ok, err = o.t.AdoptLegacy(ctx, r.id); err != nil {
			return tenancy.Owner{}, storeErr(err, r.id, "")
		} else if ok {
			r.setOwner(ow)
		}
	}
	if !ok && !create {
		return tenancy.Owner{}, notFound(r.id)
	}
	if !ok {
		if ow, _, err = o.t.Create(ctx, r.id, p); err != nil {
			return tenancy.Owner{}, storeErr(err, r.id, "")
		}
		r.setOwner(ow)
	}
	if !p.CanSee(ow.Tenant) {
		return tenancy.Owner{}, notFound(r.id)
	}
	return ow, nil
}

// ownerOf is the run's owner, read from the store once and kept in the
// run's entry: owners never change.
func (o *Orchestrator) ownerOf(ctx context.Context, r *run) (tenancy.Owner, bool, error) {
	o.ownerLookups.add()
	if ow, ok := r.cachedOwner(); ok {
		return ow, true, nil
	}
	ow, ok, err := o.t.Lookup(ctx, r.id)
	if err != nil {
		return tenancy.Owner{}, false, storeErr(err, r.id, "")
	}
	if ok {
		r.setOwner(ow)
	}
	return ow, ok, nil
}

// kernelOwner is the owner of a run with a live kernel, for work that runs
// beside the run's calls (a usage reading, the kernel quota's list): the
// call that started the kernel resolved it, so it is read from the run's
// entry and nothing is looked up (and counted) then. Only an entry that
// lost it falls back to ownerOf.
func (o *Orchestrator) kernelOwner(ctx context.Context, r *run) (tenancy.Owner, bool) {
	if ow, ok := r.cachedOwner(); ok {
		return ow, true
	}
	ow, ok, err := o.ownerOf(ctx, r)
	return ow, ok && err == nil
}

// cachedOwner is the run's owner if its entry already holds it.
func (r *run) cachedOwner() (tenancy.Owner, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owner, r.owned
}

func (r *run) setOwner(ow tenancy.Owner) {
	r.mu.Lock()
	r.owner, r.owned = ow, true
	r.mu.Unlock()
}

// blobNotFound is the one answer for a blob the caller may not have,
// whether it exists or not (no existence oracle; see docs/DECISIONS.md,
// "Who may fetch a blob"). The message does not even echo the hash, so
// the body is byte for byte the same for every blob.
func blobNotFound(tmpfs.Digest) error {
	return fault.New(fault.NotFound, "no such blob in a run this caller can read",
		"send the X-Run-Id of a run that holds the file (tmp.list shows each file's sha256), or ask for a share link (POST /runs/{id}/share)")
}

// BlobNotFound is OpenBlob's answer for a request that names no run.
func BlobNotFound(d tmpfs.Digest) error { return blobNotFound(d) }

// StoreError turns an error from reading a run's file (or a blob it holds)
// into the fault a caller sees: a corrupt or quarantined blob is corrupt,
// a store that does not answer is store_unavailable, and so on.
func StoreError(err error, run runid.ID, path string) error { return storeErr(err, run, path) }
