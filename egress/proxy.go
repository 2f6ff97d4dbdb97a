package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triadhq/triad/wire"
)

// Codes label why a connection was allowed, denied or failed, in metrics
// (a small fixed set) and in Connection reasons' kind.
const (
	CodeAllowed    = "allowed"
	CodeNoPolicy   = "no_policy"
	CodeNotAllowed = "not_allowed"
	CodePort       = "port"
	CodeMethod     = "method"
	CodeIPLiteral  = "ip_literal"
	CodeAddress    = "address"
	CodeDNS        = "dns"
	CodeLimit      = "limit"
	CodeTLS        = "tls"
	CodeUpstream   = "upstream"
	CodeBadRequest = "bad_request"
)

// Metrics receives the proxy's events; metrics.Metrics implements it. Its
// labels are verdicts and codes, never hosts or runs.
type Metrics interface {
	// EgressConnection counts a connection (or request) by verdict and code.
	EgressConnection(verdict, code string)
	// EgressBytes counts bytes moved to (sent) and from (received) upstreams.
	EgressBytes(sent, received int64)
	// EgressOpen moves the number of open upstream connections by delta.
	EgressOpen(delta int)
}

type noMetrics struct{}

func (noMetrics) EgressConnection(string, string) {}
func (noMetrics) EgressBytes(int64, int64)        {}
func (noMetrics) EgressOpen(int)                  {}

// Defaults of Config.
const (
	DefaultDialTimeout = 30 * time.Second
	// DefaultMaxOpen bounds a run's upstream connections open at once.
	DefaultMaxOpen = 64
	// maxClients bounds a run's connections from the sandbox open at once
	// (each holds a goroutine on the host).
	maxClients = 256
)

// Config configures a Proxy. The zero value works: the system resolver,
// a plain dialer and the system's roots.
type Config struct {
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver
	// Dial connects to an address the proxy has checked ("ip:port"); nil
	// means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verify upstream servers when the proxy terminates TLS (to
	// add a secret); nil means the system's roots.
	RootCAs *x509.CertPool
	// DialTimeout bounds resolving and connecting to an upstream: past
	// it, the connection fails (a "failed" record) and the sandbox gets a
	// 502. Zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxBytes and MaxConnections are a run's limits when its policy sets
	// none; zero means DefaultMaxBytes and DefaultMaxConnections.
	MaxBytes       int64
	MaxConnections int
	// MaxOpen bounds a run's upstream connections open at once; zero
	// means DefaultMaxOpen.
	MaxOpen int
	// Metrics receives counts; nil records none.
	Metrics Metrics
	// Logger receives structured logs; nil is silent.
	Logger *slog.Logger
}

// Proxy holds what every run's Session shares: the resolver, the dialer,
// the upstream roots and the host's own networks.
type Proxy struct {
	cfg Config
	own ownNets
}

// New returns a Proxy. It opens nothing.
func New(cfg Config) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.MaxOpen <= 0 {
		cfg.MaxOpen = DefaultMaxOpen
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Proxy{cfg: cfg}
}

// Session serves one run's sandbox connections under its policy and keeps
// their records until Take. It lives as long as the run is served here,
// across the run's kernels. Its methods are safe for concurrent use.
type Session struct {
	p        *Proxy
	run      string
	pol      *Policy
	ca       *authority // nil when the policy intercepts nothing
	maxBytes int64
	maxConns int
	log      *slog.Logger
	// closing is cancelled by Close, ending Serve's accept.
	closing context.Context
	close   context.CancelFunc

	bytes atomic.Int64 // moved, both ways, over the run
	// sent and received are what this session moved, for the run's
	// accounting (Moved).
	sent, received atomic.Int64

	mu      sync.Mutex
	cond    *sync.Cond // signalled when active drops
	seq     int        // connections begun
	recs    []*rec     // not yet taken closed, or not yet reported open
	open    int        // upstream connections open
	clients map[net.Conn]struct{}
	active  int // handlers running
	closed  bool
}

// Session returns a Session for run under pol (nil reaches nothing). When
// the policy intercepts a destination, the Session makes the run's CA,
// whose certificate (CACert) the run's kernel must trust.
func (p *Proxy) Session(run string, pol *Policy) (*Session, error) {
	if pol == nil {
		pol = &Policy{}
	}
	s := &Session{p: p, run: run, pol: pol, clients: map[net.Conn]struct{}{},
		log: p.cfg.Logger.With("run", run)}
	s.cond = sync.NewCond(&s.mu)
	s.closing, s.close = context.WithCancel(context.Background())
	s.maxBytes, s.maxConns = pol.limits(p.cfg.MaxBytes, p.cfg.MaxConnections)
	if hosts := pol.interceptHosts(); len(hosts) > 0 {
		ca, err := newAuthority(run, hosts)
		if err != nil {
			return nil, fmt.Errorf("egress CA for run %s: %w", run, err)
		}
		s.ca = ca
	}
	return s, nil
}

// Charge counts earlier use of the run (what its journal records from
// before this session) against its limits: bytes moved and connections
// opened. Records this session makes are numbered after conns.
func (s *Session) Charge(bytes int64, conns int) {
	s.bytes.Add(bytes)
	s.mu.Lock()
	s.seq += conns
	s.mu.Unlock()
}

// Moved returns the bytes this session's connections sent upstream and
// received from upstreams so far (Charge's earlier use not included).
func (s *Session) Moved() (sent, received int64) {
	return s.sent.Load(), s.received.Load()
}

// Policy returns the session's policy.
func (s *Session) Policy() *Policy { return s.pol }

// CACert returns the run's CA certificate in PEM, which the kernel must
// trust for intercepted destinations, or nil when the policy intercepts
// none. It is public; its key never leaves the host.
func (s *Session) CACert() []byte {
	if s.ca == nil {
		return nil
	}
	return slices.Clone(s.ca.pem)
}

// Serve accepts the sandbox's connections with accept (a kernel's
// sandbox.Egress.AcceptEgress) and serves each, until accept fails (the
// kernel closed), ctx ends or the session closes. It returns accept's
// error, or nil when ctx or Close ended it. Connections it started keep
// being served until they end or Close.
func (s *Session) Serve(ctx context.Context, accept func(context.Context) (net.Conn, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()
	for {
		c, err := accept(ctx)
		if err != nil {
			if ctx.Err() != nil || s.isClosed() {
				return nil
			}
			return err
		}
		if !s.enter() {
			c.Close()
			return nil
		}
		go func() {
			defer s.leave()
			s.ServeConn(c)
		}()
	}
}

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// enter registers a handler; false once the session is closed.
func (s *Session) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.active++
	return true
}

func (s *Session) leave() {
	s.mu.Lock()
	s.active--
	s.cond.Broadcast()
	s.mu.Unlock()
}

// track registers a connection to close on Close; false when closed or
// when the run has too many connections from its sandbox open.
func (s *Session) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.clients) >= maxClients {
		return false
	}
	s.clients[c] = struct{}{}
	return true
}

func (s *Session) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.clients, c)
	s.mu.Unlock()
}

// Close ends every connection the session serves and waits for their
// handlers. Records not yet taken stay takeable. It is safe to call twice.
func (s *Session) Close() error {
	s.close()
	s.mu.Lock()
	s.closed = true
	for c := range s.clients {
		c.Close()
	}
	for s.active > 0 {
		s.cond.Wait()
	}
	s.mu.Unlock()
	return nil
}

// rec is one connection's record while it lives.
type rec struct {
	s        *Session
	c        wire.Connection // guarded by s.mu
	sent     atomic.Int64
	received atomic.Int64
	upstream bool // counted in s.open
	done     bool // closed (or denied): final
	reported bool // reported open by a Take
	cut      string
}

// begin opens a record for a connection the sandbox asked for.
func (s *Session) begin(kind, host string, port int, method, url string) *rec {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	r := &rec{s: s, c: wire.Connection{ID: s.seq, Host: host, Port: port, Kind: kind, Method: method, URL: url, Started: time.Now().UTC()}}
	s.recs = append(s.recs, r)
	return r
}

// admit counts an upstream connection against the run's limits; it
// returns a refusal when one is reached.
func (r *rec) admit() *refusal {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.bytes.Load() >= s.maxBytes:
		return &refusal{code: CodeLimit, reason: fmt.Sprintf("this run has moved its egress limit of %d bytes", s.maxBytes)}
	case s.connections() > s.maxConns:
		return &refusal{code: CodeLimit, reason: fmt.Sprintf("this run has opened its egress limit of %d connections", s.maxConns)}
	case s.open >= s.p.cfg.MaxOpen:
		return &refusal{code: CodeLimit, reason: fmt.Sprintf("this run has %d egress connections open, its limit", s.p.cfg.MaxOpen)}
	}
	s.open++
	r.upstream = true
	s.p.cfg.Metrics.EgressOpen(1)
	return nil
}

// connections is how many connections the run has asked for; s.mu held.
func (s *Session) connections() int { return s.seq }

// finish closes the record with a verdict.
func (r *rec) finish(verdict, code, reason string) {
	s := r.s
	s.mu.Lock()
	if r.done {
		s.mu.Unlock()
		return
	}
	r.done = true
	r.c.Verdict, r.c.Reason = verdict, reason
	if r.cut != "" {
		r.c.Reason += "; " + r.cut
	}
	r.c.DurationMs = time.Since(r.c.Started).Milliseconds()
	if r.upstream {
		s.open--
		s.p.cfg.Metrics.EgressOpen(-1)
	}
	s.mu.Unlock()
	s.p.cfg.Metrics.EgressConnection(verdict, code)
	s.log.Debug("egress", "id", r.c.ID, "host", r.c.Host, "port", r.c.Port, "verdict", verdict, "reason", r.c.Reason)
}

// refuse closes the record as denied (or failed, for DNS and upstream
// trouble).
func (r *rec) refuse(f *refusal) {
	v := wire.VerdictDenied
	if f.code == CodeDNS || f.code == CodeUpstream {
		v = wire.VerdictFailed
	}
	r.finish(v, f.code, f.reason)
}

// setAddr notes the address the proxy connects to.
func (r *rec) set(fn func(c *wire.Connection)) {
	r.s.mu.Lock()
	fn(&r.c)
	r.s.mu.Unlock()
}

// moved counts bytes; it reports false once the run's byte limit is past,
// and the connection must end.
func (r *rec) moved(sent, received int64) bool {
	if sent > 0 {
		r.sent.Add(sent)
		r.s.sent.Add(sent)
	}
	if received > 0 {
		r.received.Add(received)
		r.s.received.Add(received)
	}
	r.s.p.cfg.Metrics.EgressBytes(sent, received)
	if r.s.bytes.Add(sent+received) > r.s.maxBytes {
		r.s.mu.Lock()
		if r.cut == "" {
			r.cut = fmt.Sprintf("cut: the run moved its egress limit of %d bytes", r.s.maxBytes)
		}
		r.s.mu.Unlock()
		return false
	}
	return true
}

// Take returns the records of connections that ended since the last Take,
// and of those opened since and still open (Open, bytes so far), in the
// order they were opened. An open one is reported again when it ends.
func (s *Session) Take() []wire.Connection {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []wire.Connection
	keep := s.recs[:0]
	for _, r := range s.recs {
		c := r.c
		c.Sent, c.Received = r.sent.Load(), r.received.Load()
		switch {
		case r.done:
			out = append(out, c)
			continue
		case !r.reported:
			c.Open = true
			c.Verdict = wire.VerdictAllowed
			c.Reason = "open"
			c.DurationMs = time.Since(c.Started).Milliseconds()
			out = append(out, c)
			r.reported = true
		}
		keep = append(keep, r)
	}
	clear(s.recs[len(keep):])
	s.recs = keep
	return out
}

// refusal is why the proxy will not make a connection.
type refusal struct {
	code   string
	reason string
}

func (f *refusal) Error() string { return f.reason }

// resolve resolves host and checks every address it resolves to against
// the addresses always refused, the host's own networks and the policy's
// deny list. It returns the addresses the proxy may connect to: only
// these are ever dialled, so a second answer (DNS rebinding) cannot steer
// the connection.
func (s *Session) resolve(ctx context.Context, host string) ([]netip.Addr, *refusal) {
	addrs, err := s.p.cfg.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, &refusal{code: CodeDNS, reason: fmt.Sprintf("%s does not resolve (no such host)", host)}
		}
		return nil, &refusal{code: CodeDNS, reason: fmt.Sprintf("%s could not be resolved: %v", host, err)}
	}
	if len(addrs) == 0 {
		return nil, &refusal{code: CodeDNS, reason: fmt.Sprintf("%s resolves to no address", host)}
	}
	for _, a := range addrs {
		a = a.Unmap()
		if why := refusedWhy(a); why != "" {
			return nil, &refusal{code: CodeAddress, reason: fmt.Sprintf("%s resolves to %s, %s, which a sandbox may never reach", host, a, why)}
		}
		if n, ok := s.p.own.contains(a); ok {
			return nil, &refusal{code: CodeAddress, reason: fmt.Sprintf("%s resolves to %s, on the host's own network %s, which a sandbox may never reach", host, a, n)}
		}
		if n, ok := s.pol.denied(a); ok {
			return nil, &refusal{code: CodeAddress, reason: fmt.Sprintf("%s resolves to %s, in %s, which this run's egress policy denies", host, a, n)}
		}
	}
	return addrs, nil
}

// dial resolves, checks and connects to host:port, pinned to a checked
// address, and returns the connection counted against r.
func (s *Session) dial(ctx context.Context, r *rec, host string, port int) (net.Conn, *refusal) {
	ctx, cancel := context.WithTimeout(ctx, s.p.cfg.DialTimeout)
	defer cancel()
	addrs, f := s.resolve(ctx, host)
	if f != nil {
		return nil, f
	}
	var errs []error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), uint16(port))
		c, err := s.p.cfg.Dial(ctx, "tcp", ap.String())
		if err == nil {
			r.set(func(w *wire.Connection) { w.Addr = ap.String() })
			return &countConn{Conn: c, r: r}, nil
		}
		errs = append(errs, err)
	}
	return nil, &refusal{code: CodeUpstream, reason: fmt.Sprintf("%s:%d did not answer: %v", host, port, errors.Join(errs...))}
}

// countConn counts an upstream connection's bytes against its record and
// the run, and ends it once the run's byte limit is past.
type countConn struct {
	net.Conn
	r *rec
}

var errByteLimit = errors.New("egress: the run's byte limit is reached")

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.r.moved(0, int64(n)) {
		c.Conn.Close()
		return n, errByteLimit
	}
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 && !c.r.moved(int64(n), 0) {
		c.Conn.Close()
		return n, errByteLimit
	}
	return n, err
}

// CloseWrite half-closes the upstream when it can.
func (c *countConn) CloseWrite() error { return closeWrite(c.Conn) }
