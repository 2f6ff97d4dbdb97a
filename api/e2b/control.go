package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// The control plane's wire types (docs/e2b-protocol.md §5). Fields the SDKs
// require are always present.

// newSandboxBody is the body of POST /sandboxes and /v2/sandboxes.
type newSandboxBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	MCP                 json.RawMessage   `json:"mcp"`
	Network             json.RawMessage   `json:"network"`
	IAM                 json.RawMessage   `json:"iam"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
}

// sandboxJSON is E2B's Sandbox: the answer of create and connect.
type sandboxJSON struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// TrafficAccessToken is the same token, which the code interpreter
	// SDKs send on their context calls (E2B-Traffic-Access-Token) where
	// they send no X-Access-Token: with it, every data-plane call carries
	// the sandbox's credential.
	TrafficAccessToken string `json:"trafficAccessToken"`
	// Domain is the domain getHost(port) builds its host under:
	// <port>-<sandboxID>.<domain>, which Triad's listener proxies to the
	// port in the sandbox (ports.go).
	Domain string `json:"domain,omitempty"`
}

// sandboxDetailJSON is E2B's SandboxDetail and ListedSandbox.
type sandboxDetailJSON struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	// AllowInternetAccess is true when the sandbox's run has an egress
	// policy that allows something (through Triad's egress proxy).
	AllowInternetAccess bool `json:"allowInternetAccess"`
}

// timeoutBody is the body of connect and setTimeout.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// clientID is E2B's deprecated but required clientID: there is one client.
const clientID = "triad"

func (s *Server) controlRoutes() http.Handler {
	mux := http.NewServeMux()
	create := s.create
	mux.Handle("/sandboxes", s.methods(map[string]handlerFunc{http.MethodPost: create, http.MethodGet: s.list}))
	mux.Handle("/v2/sandboxes", s.methods(map[string]handlerFunc{http.MethodPost: create, http.MethodGet: s.list}))
	mux.Handle("/sandboxes/{id}", s.methods(map[string]handlerFunc{http.MethodGet: s.info, http.MethodDelete: s.kill}))
	mux.Handle("/sandboxes/{id}/timeout", s.methods(map[string]handlerFunc{http.MethodPost: s.setTimeout}))
	mux.Handle("/sandboxes/{id}/connect", s.methods(map[string]handlerFunc{http.MethodPost: s.connect}))
	mux.Handle("/v2/sandboxes/{id}/connect", s.methods(map[string]handlerFunc{http.MethodPost: s.connect}))
	mux.Handle("/sandboxes/{id}/resume", s.methods(map[string]handlerFunc{http.MethodPost: s.connect}))
	mux.Handle("/sandboxes/{id}/pause", s.methods(map[string]handlerFunc{http.MethodPost: s.pauseNow}))
	mux.Handle("/sandboxes/{id}/snapshots", s.methods(map[string]handlerFunc{http.MethodPost: s.snapshotCreate}))
	mux.Handle("/sandboxes/{id}/fork", s.methods(map[string]handlerFunc{http.MethodPost: s.fork}))
	mux.Handle("/sandboxes/{id}/metrics", s.methods(map[string]handlerFunc{http.MethodGet: s.metrics}))
	mux.Handle("/snapshots", s.methods(map[string]handlerFunc{http.MethodGet: s.snapshotList}))
	mux.Handle("/templates/{id}", s.methods(map[string]handlerFunc{http.MethodDelete: s.snapshotDelete}))
	mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return fault.New(fault.Unsupported, fmt.Sprintf("Triad's E2B surface does not serve %s %s", r.Method, r.URL.Path),
			"Triad serves create, connect, kill, list, getInfo, setTimeout, pause, fork, snapshots and metrics; see docs/e2b-protocol.md")
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.authorize(r)
		if !ok {
			msg := "X-API-Key is missing"
			if r.Header.Get(HeaderAPIKey) != "" {
				msg = "X-API-Key is not a key this server accepts"
			}
			s.writeError(w, r, authError(msg), 0)
			return
		}
		mux.ServeHTTP(w, r.WithContext(auth.With(r.Context(), p)))
	})
}

// decodeLoose reads a JSON body that may carry fields Triad does not know:
// the SDKs add fields over time and must keep working.
func (s *Server) decodeLoose(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	err := json.NewDecoder(body).Decode(v)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF) && optional:
		return nil
	case errors.Is(err, io.EOF):
		return fault.New(fault.BadInput, "the request body is empty", "send a JSON object")
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return err
	}
	return fault.Wrap(fault.BadInput, err, "the request body is not valid JSON for this endpoint: "+err.Error(), "send a JSON object with the fields in docs/e2b-protocol.md")
}

// lifetime turns a requested timeout in seconds into a duration, applying
// the default and the cap.
func (s *Server) lifetime(sec *int64) (time.Duration, error) {
	if sec == nil || *sec == 0 {
		return s.c.DefaultTimeout, nil
	}
	if *sec < 0 {
		return 0, fault.Badf("send a timeout in seconds above 0, or omit it for the server default", "timeout is %d", *sec)
	}
	d := time.Duration(*sec) * time.Second
	if s.c.MaxTimeout > 0 && d > s.c.MaxTimeout {
		d = s.c.MaxTimeout
	}
	return d, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var in newSandboxBody
	if err := s.decodeLoose(w, r, &in, false); err != nil {
		return err
	}
	if strings.TrimSpace(in.TemplateID) == "" {
		return fault.New(fault.BadInput, "templateID is empty", "name a template: base or code-interpreter-v1 (Triad's default), or one of the server's (GET /templates)")
	}
	if snap, ok := s.snapshotOf(r, in.TemplateID); ok {
		return s.createFromSnapshot(w, r, in, snap)
	}
	for name, raw := range map[string]json.RawMessage{"mcp": in.MCP, "iam": in.IAM, "volumeMounts": in.VolumeMounts} {
		if len(raw) > 0 && string(raw) != "null" {
			// 400, a status E2B's spec documents for create (422 is
			// not), with the kind that says why.
			return statusError{http.StatusBadRequest, fault.New(fault.Unsupported, fmt.Sprintf("Triad does not support the sandbox option %q", name),
				"omit it; Triad's sandboxes have no MCP gateway or volumes")}
		}
	}
	setup, network, err := runSetupFor(in)
	if err != nil {
		return err
	}
	life, err := s.lifetime(in.Timeout)
	if err != nil {
		return err
	}
	if err := validEnvs(in.EnvVars); err != nil {
		return err
	}
	now := time.Now().UTC()
	sb := Sandbox{ID: runid.New(), Template: in.TemplateID, Metadata: in.Metadata, Envs: in.EnvVars,
		TimeoutS: int64(life / time.Second), StartedAt: now, EndAt: now.Add(life), State: StateRunning,
		PublicTraffic: network.AllowPublicTraffic != nil && *network.AllowPublicTraffic, MaskHost: network.MaskRequestHost}
	// The run's sandbox is chosen here, once: an unknown template is a
	// 400 naming the server's, network options beyond the template's
	// egress policy a 403; checked before the run exists, so a refused
	// create leaves nothing behind.
	if err := s.c.Core.CheckSetup(r.Context(), sb.ID, setup); err != nil {
		return err
	}
	tok, err := sb.newToken()
	if err != nil {
		return err
	}
	// The run is the caller's tenant's from here on, before its id is
	// handed out: no later call decides it (docs/DECISIONS.md, "One owner
	// per run").
	if err := s.c.Core.Create(r.Context(), sb.ID); err != nil {
		return err
	}
	st, err := s.c.Core.SetRunSetup(r.Context(), sb.ID, setup)
	if err != nil {
		return err
	}
	sb.Internet = st.Egress != nil
	if err := s.reg.create(r.Context(), sb); err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the sandbox could not be recorded", "retry; GET /healthz shows the store's state")
	}
	s.log.InfoContext(r.Context(), "E2B sandbox created", "sandbox", sb.ID, "template", sb.Template, "timeout", life)
	return writeJSON(w, http.StatusCreated, s.sandboxAnswer(r, sb, tok))
}

// sandboxAnswer is create's, connect's and a fork's answer for sb, with
// its new access token.
func (s *Server) sandboxAnswer(r *http.Request, sb Sandbox, tok string) sandboxJSON {
	return sandboxJSON{TemplateID: sb.Template, SandboxID: sb.ID.String(), ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: tok, TrafficAccessToken: tok, Domain: s.domain(r)}
}

// validEnvs refuses environment variable names a process could not have.
func validEnvs(envs map[string]string) error {
	for k, v := range envs {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fault.Badf("use names without '=' or NUL, and values without NUL", "environment variable %q is not valid", k)
		}
	}
	return nil
}

// sandboxID reads and validates the {id} of a control-plane path. A
// malformed id names no sandbox: 404, as for any unknown one.
func sandboxID(r *http.Request) (runid.ID, error) {
	raw := r.PathValue("id")
	id, err := runid.Parse(raw)
	if err != nil {
		return id, notFound(raw)
	}
	return id, nil
}

func notFound(id string) *fault.Error {
	return fault.New(fault.NotFound, fmt.Sprintf("sandbox %q not found", id),
		"Sandbox.list shows the sandboxes; a killed sandbox is gone, but its run's journal and files stay readable through Triad's API")
}

// lookup returns the sandbox, as a 404 fault when there is none.
func (s *Server) lookup(r *http.Request) (Sandbox, error) {
	id, err := sandboxID(r)
	if err != nil {
		return Sandbox{}, err
	}
	sb, err := s.reg.get(r.Context(), id)
	if errors.Is(err, ErrNoRecord) || err == nil && !s.visible(r.Context(), sb) {
		// Another tenant's sandbox is not found, as its run is.
		return Sandbox{}, notFound(id.String())
	}
	if err != nil {
		return sb, fault.Wrap(fault.StoreUnavailable, err, "the sandbox record could not be read", "retry; GET /healthz shows the store's state")
	}
	return sb, nil
}

func detail(sb Sandbox, l sizes) sandboxDetailJSON {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return sandboxDetailJSON{TemplateID: sb.Template, SandboxID: sb.ID.String(), ClientID: clientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt, CPUCount: l.cpus, MemoryMB: l.memoryMB, DiskSizeMB: l.diskMB,
		State: sb.State, EnvdVersion: EnvdVersion, Metadata: md, AllowInternetAccess: sb.Internet}
}

// sizes are a sandbox's resources as E2B reports them: whole CPUs (at
// least 1), MiB of memory (at least 128, E2B's smallest sandbox: Triad's
// kernels are never smaller than the limits allow) and MiB of disk.
type sizes struct{ cpus, memoryMB, diskMB int }

func sizesOf(l sandbox.Limits) sizes {
	return sizes{cpus: max(1, int(math.Ceil(l.CPUs))), memoryMB: max(128, int(l.MemoryBytes>>20)), diskMB: max(0, int(l.DiskBytes>>20))}
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, detail(sb, sizesOf(s.c.Limits)))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := s.reg.remove(r.Context(), sb.ID); err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the sandbox record could not be removed", "retry the kill")
	}
	s.procs.killAll(sb.ID)
	s.watch.endAll(sb.ID, errSandboxGone(sb.ID, "killed"))
	if err := s.c.Core.Stop(r.Context(), sb.ID); err != nil {
		s.log.ErrorContext(r.Context(), "stop kernel of killed sandbox", "sandbox", sb.ID, "err", err)
	}
	// The sandbox is gone for good: so are its code contexts (a paused
	// one keeps them, to start afresh when it is resumed).
	for _, c := range s.c.Core.Contexts(sb.ID) {
		if err := s.c.Core.RemoveContext(r.Context(), sb.ID, c.ID); err != nil {
			s.log.ErrorContext(r.Context(), "remove context of killed sandbox", "sandbox", sb.ID, "context", c.ID, "err", err)
		}
	}
	s.log.InfoContext(r.Context(), "E2B sandbox killed; its run's journal and files stay", "sandbox", sb.ID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	// Another tenant's sandbox is not found, as for every control call.
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	id := sb.ID
	var in timeoutBody
	if err := s.decodeLoose(w, r, &in, false); err != nil {
		return err
	}
	if in.Timeout == nil {
		return fault.New(fault.BadInput, "timeout is missing", "send {\"timeout\": <seconds>}")
	}
	life, err := s.lifetime(in.Timeout)
	if err != nil {
		return err
	}
	_, err = s.reg.update(r.Context(), id, func(sb *Sandbox) error {
		sb.EndAt = time.Now().UTC().Add(life)
		sb.TimeoutS = int64(life / time.Second)
		return nil
	})
	if err != nil {
		return s.updateErr(id, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) updateErr(id runid.ID, err error) error {
	if errors.Is(err, ErrNoRecord) {
		return notFound(id.String())
	}
	if fault.As(err) != nil {
		return err
	}
	return fault.Wrap(fault.StoreUnavailable, err, "the sandbox record could not be updated", "retry the call")
}

// connect resumes a paused sandbox (its next call starts a fresh kernel
// over the same files) or extends a running one, and hands out a new
// access token.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	// Another tenant's sandbox is not found: connect hands out an access
	// token, the data plane's one credential.
	cur, err := s.lookup(r)
	if err != nil {
		return err
	}
	id := cur.ID
	var in timeoutBody
	if err := s.decodeLoose(w, r, &in, true); err != nil {
		return err
	}
	var life time.Duration
	if in.Timeout != nil {
		if life, err = s.lifetime(in.Timeout); err != nil {
			return err
		}
	}
	var tok string
	resumed := false
	sb, err := s.reg.update(r.Context(), id, func(sb *Sandbox) error {
		now := time.Now().UTC()
		if life == 0 {
			life = time.Duration(sb.TimeoutS) * time.Second
		}
		end := now.Add(life)
		if sb.State != StateRunning {
			sb.State = StateRunning
			sb.EndAt = end
			resumed = true
		} else if end.After(sb.EndAt) {
			sb.EndAt = end // a running sandbox's end only moves later
		}
		var err error
		tok, err = sb.newToken()
		return err
	})
	if err != nil {
		return s.updateErr(id, err)
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
		s.log.InfoContext(r.Context(), "E2B sandbox resumed: its next call starts a fresh kernel over its files", "sandbox", id)
	}
	return writeJSON(w, status, s.sandboxAnswer(r, sb, tok))
}

// pauseNow is POST /sandboxes/{id}/pause: what a timeout does, now.
func (s *Server) pauseNow(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	if sb.State != StateRunning {
		return statusError{http.StatusConflict, fault.New(fault.Conflict, fmt.Sprintf("sandbox %s is already paused", sb.ID), "Sandbox.connect resumes it")}
	}
	_, err = s.reg.update(r.Context(), sb.ID, func(sb *Sandbox) error {
		sb.EndAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return s.updateErr(sb.ID, err)
	}
	s.pause(r.Context(), sb.ID, time.Now().UTC())
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// list is GET /v2/sandboxes (and the deprecated GET /sandboxes): filtered
// by metadata, state, template and start time, paginated by X-Next-Token.
func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fault.Wrap(fault.BadInput, err, "the query string is malformed", "percent-encode query parameters")
	}
	all, err := s.reg.list(r.Context())
	if err != nil {
		return fault.Wrap(fault.StoreUnavailable, err, "the sandbox records could not be read", "retry; GET /healthz shows the store's state")
	}
	f, err := parseListFilter(q, r.URL.Path == "/sandboxes")
	if err != nil {
		return err
	}
	var out []sandboxDetailJSON
	for _, sb := range all {
		if f.match(sb) && s.visible(r.Context(), sb) {
			out = append(out, detail(sb, sizesOf(s.c.Limits)))
		}
	}
	if f.asc {
		slices.Reverse(out)
	}
	start := 0
	if f.next != "" {
		start = slices.IndexFunc(out, func(d sandboxDetailJSON) bool { return d.SandboxID == f.next })
		if start < 0 {
			return fault.New(fault.BadInput, "nextToken names no sandbox in this listing", "start again without nextToken")
		}
	}
	out = out[start:]
	if f.limit > 0 && len(out) > f.limit {
		w.Header().Set("X-Next-Token", out[f.limit].SandboxID)
		out = out[:f.limit]
	}
	if out == nil {
		out = []sandboxDetailJSON{}
	}
	return writeJSON(w, http.StatusOK, out)
}

// maxListLimit is the largest page E2B's spec allows.
const maxListLimit = 100

type listFilter struct {
	metadata url.Values
	states   []string
	template string
	after    time.Time
	asc      bool
	limit    int
	next     string
}

func parseListFilter(q url.Values, v1 bool) (listFilter, error) {
	f := listFilter{states: []string{StateRunning, StatePaused}, template: q.Get("template"), next: q.Get("nextToken")}
	if v1 {
		f.states = []string{StateRunning} // the deprecated list shows running sandboxes only
	}
	if m := q.Get("metadata"); m != "" {
		mv, err := url.ParseQuery(m)
		if err != nil {
			return f, fault.Wrap(fault.BadInput, err, "metadata is not a URL-encoded query", "send metadata as k=v&k2=v2, keys and values URL-encoded")
		}
		// The SDKs URL-encode each key and value before building the
		// query string (docs/e2b-protocol.md §5), so decode them once more.
		f.metadata = url.Values{}
		for k, vs := range mv {
			for _, v := range vs {
				f.metadata.Add(unescape(k), unescape(v))
			}
		}
	}
	if st := q["state"]; len(st) > 0 {
		f.states = nil
		for _, v := range st {
			for _, one := range strings.Split(v, ",") {
				if one != StateRunning && one != StatePaused {
					return f, fault.Badf("use running or paused", "state %q is not a sandbox state", one)
				}
				f.states = append(f.states, one)
			}
		}
	}
	if a := q.Get("startedAfter"); a != "" {
		t, err := time.Parse(time.RFC3339Nano, a)
		if err != nil {
			return f, fault.Wrap(fault.BadInput, err, "startedAfter is not an RFC 3339 time", "send an ISO time such as 2026-01-02T15:04:05Z")
		}
		f.after = t
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		f.asc = true
	default:
		return f, fault.New(fault.BadInput, "order is neither asc nor desc", "send order=asc or order=desc")
	}
	if l, ok := q["limit"]; ok {
		// E2B's spec: 1 to 100 (its default is 100, Triad's all).
		n, err := strconv.Atoi(l[0])
		if err != nil || n < 1 || n > maxListLimit {
			return f, fault.Badf(fmt.Sprintf("send limit from 1 to %d, or omit it", maxListLimit), "limit %q is not from 1 to %d", l[0], maxListLimit)
		}
		f.limit = n
	}
	return f, nil
}

func (f listFilter) match(sb Sandbox) bool {
	if !slices.Contains(f.states, sb.State) {
		return false
	}
	if f.template != "" && f.template != sb.Template {
		return false
	}
	if !f.after.IsZero() && sb.StartedAt.Before(f.after) {
		return false
	}
	for k, vs := range f.metadata {
		for _, v := range vs {
			if sb.Metadata[k] != v {
				return false
			}
		}
	}
	return true
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// defaultTemplates are E2B's own template names, which run Triad's default
// template.
var defaultTemplates = map[string]bool{"base": true, "code-interpreter-v1": true}

// e2bNetwork is create's network option (docs/e2b-protocol.md §5).
type e2bNetwork struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// AllowPublicTraffic true opens the sandbox's getHost URLs to
	// requests without a credential; false (and, on Triad, absent)
	// demands the sandbox's token or a key (DECISIONS, "getHost").
	AllowPublicTraffic *bool `json:"allowPublicTraffic"`
	// MaskRequestHost is the Host header the sandbox's servers see on
	// proxied requests, ${PORT} replaced by the port.
	MaskRequestHost string `json:"maskRequestHost"`
}

// maskHostRE is what a maskRequestHost may be once ${PORT} is replaced:
// a host name or address, with an optional port.
var maskHostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?$`)

// maskHost is the Host a request to port carries under mask.
func maskHost(mask string, port int) string {
	return strings.ReplaceAll(mask, "${PORT}", strconv.Itoa(port))
}

// allTraffic is E2B's ALL_TRAFFIC: every destination.
const allTraffic = "0.0.0.0/0"

// runSetupFor maps create's template and network options onto the run's
// setup: base and code-interpreter-v1 are Triad's default template, any
// other name a template of the server's. allow_internet_access false, or
// denyOut naming all traffic with no allowOut, allows nothing; allowOut
// narrows the template's egress policy to its names (Triad decides by
// name: an address in allowOut is refused); other denyOut addresses are
// refused after resolution. A name beyond the template's policy is the
// core's 403. See docs/e2b-protocol.md §5.
func runSetupFor(in newSandboxBody) (wire.RunSetup, e2bNetwork, error) {
	setup := wire.RunSetup{Template: in.TemplateID}
	if defaultTemplates[in.TemplateID] {
		setup.Template = ""
	}
	var n e2bNetwork
	if len(in.Network) > 0 && string(in.Network) != "null" {
		dec := json.NewDecoder(bytes.NewReader(in.Network))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&n); err != nil {
			return setup, n, fault.New(fault.Unsupported, "Triad reads network.allowOut, denyOut, allowPublicTraffic and maskRequestHost only: "+err.Error(),
				"send network as {\"allowOut\": [\"pypi.org\"], \"denyOut\": [\"0.0.0.0/0\"], \"allowPublicTraffic\": false}")
		}
	}
	if m := n.MaskRequestHost; m != "" && !maskHostRE.MatchString(maskHost(m, 1)) {
		return setup, n, fault.New(fault.BadInput, fmt.Sprintf("network.maskRequestHost %q is not a host", m),
			"send a host name with an optional port, ${PORT} standing for the port: ${PORT}-app.example.com")
	}
	setup, err := egressSetup(setup, in, n)
	return setup, n, err
}

// egressSetup maps create's internet and network options onto the run's
// egress policy.
func egressSetup(setup wire.RunSetup, in newSandboxBody, n e2bNetwork) (wire.RunSetup, error) {
	if in.AllowInternetAccess != nil && !*in.AllowInternetAccess {
		if len(n.AllowOut) > 0 {
			return setup, fault.New(fault.BadInput, "allow_internet_access is false, and network.allowOut names destinations",
				"drop one: allowOut allows only its names, allow_internet_access false allows nothing")
		}
		setup.Egress = &wire.EgressPolicy{Allow: []wire.EgressRule{}}
		return setup, nil
	}
	if n.AllowOut == nil && n.DenyOut == nil {
		return setup, nil
	}
	eg := &wire.EgressPolicy{}
	for _, a := range n.AllowOut {
		if _, err := netip.ParsePrefix(a); err == nil || isAddr(a) {
			return setup, fault.New(fault.Unsupported, fmt.Sprintf("network.allowOut %q is an address: Triad's egress is allowed by name", a),
				"name the host (pypi.org, *.example.com) instead; the proxy resolves it and refuses private addresses")
		}
		eg.Allow = append(eg.Allow, wire.EgressRule{Host: a})
	}
	for _, d := range n.DenyOut {
		if d == allTraffic || d == "::/0" {
			if eg.Allow == nil {
				eg.Allow = []wire.EgressRule{}
			}
			continue
		}
		eg.Deny = append(eg.Deny, d)
	}
	setup.Egress = eg
	return setup, nil
}

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// ForgetRun drops the sandbox whose run was deleted (an
// orchestrator.DeleteHook): its record, its processes and its watches, so
// the sandbox is not found from then on. A run that was no sandbox, or one
// forgotten already, has nothing to drop.
func (s *Server) ForgetRun(ctx context.Context, run runid.ID) error {
	if err := s.reg.remove(ctx, run); err != nil {
		return err
	}
	s.procs.killAll(run)
	s.watch.endAll(run, errSandboxGone(run, "deleted"))
	return nil
}
