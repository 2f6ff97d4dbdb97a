package e2b

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
)

// Sandbox states, as E2B's API names them. A sandbox past its timeout is
// paused: its kernel is stopped, its files stay, and connect resumes it
// with a fresh kernel over the same files.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// maxTokens bounds how many envd access tokens a sandbox keeps: create and
// every connect mint one, and SDK objects holding an older one keep working
// until that many newer connects have happened.
const maxTokens = 32

// Sandbox is what the surface keeps about one E2B sandbox. Its ID is the
// run id, and the run's owner, which the core alone decides, is the
// sandbox's: the surface keeps no owner of its own. Access tokens are kept
// only as sha256 digests, so a record at rest grants nothing; the envs are
// kept sealed (see record).
type Sandbox struct {
	ID        runid.ID
	Template  string
	Metadata  map[string]string
	Envs      map[string]string
	TimeoutS  int64
	StartedAt time.Time
	EndAt     time.Time
	State     string
	// TokenSHA256 are the hex sha256 digests of the envd access tokens
	// create and connect handed out, newest last.
	TokenSHA256 []string
	// Tokens are the same tokens themselves, newest last: a signed
	// files URL (downloadUrl, uploadUrl) is a digest over one of them,
	// which only the token can check (see signing.go). Kept sealed at
	// rest, as the envs.
	Tokens []string
	// FileMeta is the metadata files.write set on the sandbox's files,
	// by run path (filemeta.go).
	FileMeta map[string]fileMeta
	// Internet is true when the sandbox's run has an egress policy that
	// allows something: getInfo's allowInternetAccess.
	Internet bool
	// PublicTraffic is create's network.allowPublicTraffic true: its
	// getHost URLs need no credential. MaskHost is network.maskRequestHost:
	// the Host the sandbox's servers see (${PORT} the port). See
	// docs/DECISIONS.md, "getHost".
	PublicTraffic bool
	MaskHost      string
}

// record is a Sandbox as Records keep it: the envs, which are secrets,
// sealed for the sandbox's id (Config.Sealer), never in plain text.
type record struct {
	ID          runid.ID          `json:"id"`
	Template    string            `json:"template"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	EnvsSealed  string            `json:"envs_sealed,omitempty"`
	TimeoutS    int64             `json:"timeout_s"`
	StartedAt   time.Time         `json:"started_at"`
	EndAt       time.Time         `json:"end_at"`
	State       string            `json:"state"`
	TokenSHA256 []string          `json:"token_sha256"`
	// TokensSealed is Sandbox.Tokens, sealed for the sandbox's id; a
	// record made before signed URLs has none, and its links never match.
	TokensSealed string              `json:"tokens_sealed,omitempty"`
	FileMeta     map[string]fileMeta `json:"file_meta,omitempty"`
	Internet     bool                `json:"internet,omitempty"`
	Public       bool                `json:"public_traffic,omitempty"`
	MaskHost     string              `json:"mask_request_host,omitempty"`
}

// legacyRecord is a record as Triad kept it before the core owned every
// run (in the reserved run tmpfsrecords reads): the owner beside the envs,
// in plain text. Only the migration reads it.
type legacyRecord struct {
	ID          runid.ID          `json:"id"`
	Template    string            `json:"template"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Envs        map[string]string `json:"envs,omitempty"`
	TimeoutS    int64             `json:"timeout_s"`
	StartedAt   time.Time         `json:"started_at"`
	EndAt       time.Time         `json:"end_at"`
	State       string            `json:"state"`
	TokenSHA256 []string          `json:"token_sha256"`
	Owner       *auth.Principal   `json:"owner,omitempty"`
}

// Sealer seals the envs a record keeps; auth/seal implements it.
type Sealer interface {
	Seal(plain, ad []byte) (string, error)
	Open(sealed string, ad []byte) ([]byte, error)
}

func (g *registry) encode(s Sandbox) ([]byte, error) {
	r := record{ID: s.ID, Template: s.Template, Metadata: s.Metadata, TimeoutS: s.TimeoutS, StartedAt: s.StartedAt,
		EndAt: s.EndAt, State: s.State, TokenSHA256: s.TokenSHA256, FileMeta: s.FileMeta, Internet: s.Internet,
		Public: s.PublicTraffic, MaskHost: s.MaskHost}
	var err error
	if len(s.Envs) > 0 {
		if r.EnvsSealed, err = g.sealJSON(s.Envs, []byte(s.ID.String())); err != nil {
			return nil, err
		}
	}
	if len(s.Tokens) > 0 {
		if r.TokensSealed, err = g.sealJSON(s.Tokens, tokensAD(s.ID)); err != nil {
			return nil, err
		}
	}
	return json.Marshal(r)
}

func (g *registry) decode(b []byte) (Sandbox, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return Sandbox{}, err
	}
	s := Sandbox{ID: r.ID, Template: r.Template, Metadata: r.Metadata, TimeoutS: r.TimeoutS, StartedAt: r.StartedAt,
		EndAt: r.EndAt, State: r.State, TokenSHA256: r.TokenSHA256, FileMeta: r.FileMeta, Internet: r.Internet,
		PublicTraffic: r.Public, MaskHost: r.MaskHost}
	if r.EnvsSealed != "" {
		if err := g.openJSON(r.EnvsSealed, []byte(r.ID.String()), "envs", &s.Envs); err != nil {
			return Sandbox{}, err
		}
	}
	if r.TokensSealed != "" {
		if err := g.openJSON(r.TokensSealed, tokensAD(r.ID), "tokens", &s.Tokens); err != nil {
			return Sandbox{}, err
		}
	}
	return s, nil
}

// sealJSON seals v's JSON for a record, bound to ad.
func (g *registry) sealJSON(v any, ad []byte) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return g.seal.Seal(b, ad)
}

// openJSON opens what sealJSON sealed (the sandbox's what) into v.
func (g *registry) openJSON(sealed string, ad []byte, what string, v any) error {
	plain, err := g.seal.Open(sealed, ad)
	if err != nil {
		return fmt.Errorf("open the sandbox's %s: %w", what, err)
	}
	return json.Unmarshal(plain, v)
}

func (s Sandbox) clone() Sandbox {
	s.Metadata = maps.Clone(s.Metadata)
	s.Envs = maps.Clone(s.Envs)
	s.TokenSHA256 = slices.Clone(s.TokenSHA256)
	s.Tokens = slices.Clone(s.Tokens)
	s.FileMeta = maps.Clone(s.FileMeta)
	return s
}

// newToken mints an envd access token and records its digest.
func (s *Sandbox) newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("mint access token: %w", err)
	}
	tok := "e2b_at_" + hex.EncodeToString(b)
	s.TokenSHA256 = append(s.TokenSHA256, tokenDigest(tok))
	if n := len(s.TokenSHA256); n > maxTokens {
		s.TokenSHA256 = s.TokenSHA256[n-maxTokens:]
	}
	s.Tokens = append(s.Tokens, tok)
	if n := len(s.Tokens); n > maxTokens {
		s.Tokens = s.Tokens[n-maxTokens:]
	}
	return tok, nil
}

// tokensAD binds a record's sealed tokens to its sandbox, apart from its
// envs.
func tokensAD(id runid.ID) []byte { return []byte(id.String() + "/tokens") }

// tokenOK reports whether tok is one of the sandbox's access tokens.
func (s *Sandbox) tokenOK(tok string) bool {
	if tok == "" {
		return false
	}
	d := []byte(tokenDigest(tok))
	ok := false
	for _, h := range s.TokenSHA256 {
		if subtle.ConstantTimeCompare(d, []byte(h)) == 1 {
			ok = true
		}
	}
	return ok
}

func tokenDigest(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// ErrNoRecord is returned by Records.Get for a sandbox it does not hold:
// the sandbox was never created here, or was killed.
var ErrNoRecord = errors.New("e2b: no such sandbox record")

// Records persists sandbox records, so that a restarted server (or another
// replica sharing the store) knows every sandbox. Implementations are safe
// for concurrent use: MemRecords in memory, metarecords in the store's
// records beside keys and share links, where no tool reaches.
type Records interface {
	// Put stores the record of sandbox id, replacing any earlier one.
	Put(ctx context.Context, id runid.ID, b []byte) error
	// Get returns the record of sandbox id, or ErrNoRecord.
	Get(ctx context.Context, id runid.ID) ([]byte, error)
	// Delete removes the record of sandbox id; deleting a missing record is
	// not an error.
	Delete(ctx context.Context, id runid.ID) error
	// All returns every record.
	All(ctx context.Context) ([][]byte, error)
}

// MemRecords keeps records in memory: for tests, and for a server that
// need not remember its sandboxes across restarts.
type MemRecords struct {
	mu sync.Mutex
	m  map[runid.ID][]byte
}

var _ Records = (*MemRecords)(nil)

// Put implements Records.
func (m *MemRecords) Put(_ context.Context, id runid.ID, b []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[runid.ID][]byte{}
	}
	m.m[id] = slices.Clone(b)
	return nil
}

// Get implements Records.
func (m *MemRecords) Get(_ context.Context, id runid.ID) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.m[id]
	if !ok {
		return nil, ErrNoRecord
	}
	return slices.Clone(b), nil
}

// Delete implements Records.
func (m *MemRecords) Delete(_ context.Context, id runid.ID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, id)
	return nil
}

// All implements Records.
func (m *MemRecords) All(context.Context) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([][]byte, 0, len(m.m))
	for _, b := range m.m {
		out = append(out, slices.Clone(b))
	}
	return out, nil
}

// registry is the in-memory view of the sandboxes, written through to
// Records. A sandbox unknown in memory is looked up in Records, so one
// created by another replica is found.
type registry struct {
	recs Records
	seal Sealer
	log  *slog.Logger
	mu   sync.Mutex
	m    map[runid.ID]Sandbox
	// rescanned is when signer last read every record (signing.go).
	rescanned time.Time
}

func newRegistry(ctx context.Context, recs Records, seal Sealer, log *slog.Logger) (*registry, error) {
	g := &registry{recs: recs, seal: seal, log: log, m: map[runid.ID]Sandbox{}}
	all, err := recs.All(ctx)
	if err != nil {
		return nil, fmt.Errorf("load sandbox records: %w", err)
	}
	for _, b := range all {
		if s, ok := g.parse(ctx, b); ok {
			g.m[s.ID] = s
		}
	}
	return g, nil
}

// parse decodes a record. One that does not decode to a valid sandbox
// (damaged, or its envs sealed under another key) is logged and skipped,
// so a damaged record costs that sandbox, never the server.
func (g *registry) parse(ctx context.Context, b []byte) (Sandbox, bool) {
	s, err := g.decode(b)
	if err != nil || s.ID.String() == "" || (s.State != StateRunning && s.State != StatePaused) {
		var r record
		json.Unmarshal(b, &r) // for the log: the record's id, never its envs
		g.log.ErrorContext(ctx, "skipping a damaged E2B sandbox record", "err", err, "sandbox", r.ID)
		return s, false
	}
	return s, true
}

// get returns a copy of sandbox id, or ErrNoRecord.
func (g *registry) get(ctx context.Context, id runid.ID) (Sandbox, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.getLocked(ctx, id)
}

func (g *registry) getLocked(ctx context.Context, id runid.ID) (Sandbox, error) {
	if s, ok := g.m[id]; ok {
		return s.clone(), nil
	}
	b, err := g.recs.Get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	s, ok := g.parse(ctx, b)
	if !ok || s.ID != id {
		return Sandbox{}, ErrNoRecord
	}
	g.m[id] = s
	return s.clone(), nil
}

// create stores a new sandbox.
func (g *registry) create(ctx context.Context, s Sandbox) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.putLocked(ctx, s)
}

// update applies fn to sandbox id and stores the result; fn's error aborts
// the update and is returned.
func (g *registry) update(ctx context.Context, id runid.ID, fn func(*Sandbox) error) (Sandbox, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, err := g.getLocked(ctx, id)
	if err != nil {
		return s, err
	}
	if err := fn(&s); err != nil {
		return s, err
	}
	return s.clone(), g.putLocked(ctx, s)
}

func (g *registry) putLocked(ctx context.Context, s Sandbox) error {
	b, err := g.encode(s)
	if err != nil {
		return err
	}
	if err := g.recs.Put(ctx, s.ID, b); err != nil {
		return fmt.Errorf("store sandbox record %s: %w", s.ID, err)
	}
	g.m[s.ID] = s.clone()
	return nil
}

// remove forgets sandbox id.
func (g *registry) remove(ctx context.Context, id runid.ID) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.recs.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete sandbox record %s: %w", id, err)
	}
	delete(g.m, id)
	return nil
}

// list returns every sandbox, read from Records so that sandboxes of
// other replicas are included, sorted newest first.
func (g *registry) list(ctx context.Context) ([]Sandbox, error) {
	all, err := g.recs.All(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sandbox records: %w", err)
	}
	out := make([]Sandbox, 0, len(all))
	g.mu.Lock()
	for _, b := range all {
		s, ok := g.parse(ctx, b)
		if !ok {
			continue
		}
		g.m[s.ID] = s
		out = append(out, s.clone())
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b Sandbox) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return compareIDs(a.ID, b.ID)
	})
	return out, nil
}

// expired returns the running sandboxes whose end is at or before now.
func (g *registry) expired(now time.Time) []runid.ID {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []runid.ID
	for id, s := range g.m {
		if s.State == StateRunning && !s.EndAt.After(now) {
			out = append(out, id)
		}
	}
	return out
}

func compareIDs(a, b runid.ID) int {
	switch {
	case a.String() < b.String():
		return -1
	case a.String() > b.String():
		return 1
	}
	return 0
}
