package e2b

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

// Snapshots and forks (docs/e2b-protocol.md §5). A snapshot is the core's
// (orchestrator.Snapshot): the sandbox's files, by reference, as a
// read-only run of the caller's tenant, whose id is the snapshot's id and
// the template a sandbox is created from. A fork is a new sandbox whose
// run the core forks from the sandbox's run. Neither keeps kernel memory:
// a forked sandbox's kernel starts fresh over the files (E2B's forks keep
// memory; see docs/DECISIONS.md, "Snapshots and forks").

// snapshotInfoJSON is E2B's SnapshotInfo.
type snapshotInfoJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfo(sn wire.Snapshot) snapshotInfoJSON {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return snapshotInfoJSON{SnapshotID: sn.ID, Names: names}
}

// forkBody is E2B's SandboxForkRequest.
type forkBody struct {
	Timeout *int64 `json:"timeout"`
	Count   *int   `json:"count"`
}

// forkResultJSON is E2B's SandboxForkResult: one of the two is set.
type forkResultJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorBody   `json:"error,omitempty"`
}

// maxForks is the most forks one request may ask for (E2B's spec).
const maxForks = 100

// snapshotCreate is POST /sandboxes/{id}/snapshots: createSnapshot.
func (s *Server) snapshotCreate(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	var in struct {
		Name string `json:"name"`
	}
	if err := s.decodeLoose(w, r, &in, true); err != nil {
		return err
	}
	sn, err := s.c.Core.Snapshot(r.Context(), sb.ID, wire.SnapshotRequest{Name: in.Name})
	if err != nil {
		return err
	}
	s.log.InfoContext(r.Context(), "E2B snapshot taken: files by reference, no kernel memory", "sandbox", sb.ID, "snapshot", sn.ID, "files", sn.Files)
	return writeJSON(w, http.StatusCreated, snapshotInfo(sn))
}

// snapshotList is GET /snapshots: listSnapshots, the caller's, newest
// first, filtered by sandboxID and name, paginated by X-Next-Token.
func (s *Server) snapshotList(w http.ResponseWriter, r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fault.Wrap(fault.BadInput, err, "the query string is malformed", "percent-encode query parameters")
	}
	var sq orchestrator.SnapshotQuery
	if raw := q.Get("sandboxID"); raw != "" {
		id, err := runid.Parse(raw)
		if err != nil {
			return writeJSON(w, http.StatusOK, []snapshotInfoJSON{}) // names no sandbox: none of its snapshots
		}
		sq.Of = id
	}
	sq.Name = q.Get("name")
	limit := 0
	if l, ok := q["limit"]; ok {
		n, err := strconv.Atoi(l[0])
		if err != nil || n < 1 || n > maxListLimit {
			return fault.Badf(fmt.Sprintf("send limit from 1 to %d, or omit it", maxListLimit), "limit %q is not from 1 to %d", l[0], maxListLimit)
		}
		limit = n
	}
	all, err := s.c.Core.Snapshots(r.Context(), sq)
	if err != nil {
		return err
	}
	start := 0
	if next := q.Get("nextToken"); next != "" {
		start = slices.IndexFunc(all, func(sn wire.Snapshot) bool { return sn.ID == next })
		if start < 0 {
			return fault.New(fault.BadInput, "nextToken names no snapshot in this listing", "start again without nextToken")
		}
	}
	all = all[start:]
	if limit > 0 && len(all) > limit {
		w.Header().Set("X-Next-Token", all[limit].ID)
		all = all[:limit]
	}
	out := make([]snapshotInfoJSON, 0, len(all))
	for _, sn := range all {
		out = append(out, snapshotInfo(sn))
	}
	return writeJSON(w, http.StatusOK, out)
}

// snapshotDelete is DELETE /templates/{id} for a snapshot: deleteSnapshot.
// Triad's own templates are the operator's, never deleted here.
func (s *Server) snapshotDelete(w http.ResponseWriter, r *http.Request) error {
	raw := r.PathValue("id")
	id, err := runid.Parse(raw)
	if err != nil {
		return fault.New(fault.NotFound, fmt.Sprintf("no snapshot %q", raw), "listSnapshots shows your snapshots; Triad's own templates are the operator's")
	}
	if err := s.c.Core.DeleteSnapshot(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// snapshotOf returns the snapshot a create's templateID names, if it names
// one the caller may see.
func (s *Server) snapshotOf(r *http.Request, template string) (wire.Snapshot, bool) {
	if defaultTemplates[template] {
		return wire.Snapshot{}, false
	}
	id, err := runid.Parse(template)
	if err != nil {
		return wire.Snapshot{}, false
	}
	sn, err := s.c.Core.SnapshotInfo(r.Context(), id)
	return sn, err == nil
}

// createFromSnapshot is create with a snapshot for a template: the
// sandbox's run is forked from the snapshot, whose setup (template,
// egress) it keeps.
func (s *Server) createFromSnapshot(w http.ResponseWriter, r *http.Request, in newSandboxBody, sn wire.Snapshot) error {
	if len(in.Network) > 0 && string(in.Network) != "null" || in.AllowInternetAccess != nil {
		return statusError{http.StatusBadRequest, fault.New(fault.Unsupported, "a sandbox made from a snapshot has its snapshot's network",
			"omit network and allow_internet_access")}
	}
	life, err := s.lifetime(in.Timeout)
	if err != nil {
		return err
	}
	if err := validEnvs(in.EnvVars); err != nil {
		return err
	}
	from, _ := runid.Parse(sn.ID)
	now := time.Now().UTC()
	sb := Sandbox{ID: runid.New(), Template: sn.ID, Metadata: in.Metadata, Envs: in.EnvVars,
		TimeoutS: int64(life / time.Second), StartedAt: now, EndAt: now.Add(life), State: StateRunning}
	if of, err := runid.Parse(sn.Of); err == nil {
		if src, err := s.reg.get(r.Context(), of); err == nil {
			sb.Internet = src.Internet
		}
	}
	return s.startFork(w, r, from, sb, http.StatusCreated)
}

// startFork makes sandbox sb, whose run the core forks from run from, and
// answers with it.
func (s *Server) startFork(w http.ResponseWriter, r *http.Request, from runid.ID, sb Sandbox, status int) error {
	ans, err := s.forkOne(r, from, sb)
	if err != nil {
		return err
	}
	return writeJSON(w, status, ans)
}

func (s *Server) forkOne(r *http.Request, from runid.ID, sb Sandbox) (sandboxJSON, error) {
	tok, err := sb.newToken()
	if err != nil {
		return sandboxJSON{}, err
	}
	if _, err := s.c.Core.Fork(r.Context(), from, sb.ID); err != nil {
		return sandboxJSON{}, err
	}
	if err := s.reg.create(r.Context(), sb); err != nil {
		return sandboxJSON{}, fault.Wrap(fault.StoreUnavailable, err, "the sandbox could not be recorded", "retry; GET /healthz shows the store's state")
	}
	s.log.InfoContext(r.Context(), "E2B sandbox forked: files by reference, a fresh kernel", "sandbox", sb.ID, "from", from)
	return s.sandboxAnswer(r, sb, tok), nil
}

// fork is POST /sandboxes/{id}/fork: count new sandboxes whose runs are
// forked from the sandbox's, each with its envs and metadata. The first
// failure before any fork started is the answer; later ones are entries.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	// The body is checked first, as E2B's API does: a bad count is 400
	// whatever the sandbox.
	var in forkBody
	if err := s.decodeLoose(w, r, &in, true); err != nil {
		return err
	}
	count := 1
	if in.Count != nil {
		if *in.Count < 1 || *in.Count > maxForks {
			return fault.Badf(fmt.Sprintf("send count from 1 to %d, or omit it for 1", maxForks), "count %d is not from 1 to %d", *in.Count, maxForks)
		}
		count = *in.Count
	}
	life, err := s.lifetime(in.Timeout)
	if err != nil {
		return err
	}
	src, err := s.lookup(r)
	if err != nil {
		return err
	}
	out := make([]forkResultJSON, 0, count)
	for i := range count {
		now := time.Now().UTC()
		sb := Sandbox{ID: runid.New(), Template: src.Template, Metadata: maps.Clone(src.Metadata), Envs: maps.Clone(src.Envs),
			TimeoutS: int64(life / time.Second), StartedAt: now, EndAt: now.Add(life), State: StateRunning, Internet: src.Internet}
		ans, err := s.forkOne(r, src.ID, sb)
		if err != nil && i == 0 {
			return err
		}
		if err != nil {
			fe, st := classify(err)
			out = append(out, forkResultJSON{Error: &errorBody{Code: st, Message: sdkMessage(fe),
				Error: errorDetail{Kind: fe.Kind, Message: fe.Message, Suggestion: fe.Suggestion}}})
			continue
		}
		out = append(out, forkResultJSON{Sandbox: &ans})
	}
	return writeJSON(w, http.StatusCreated, out)
}
