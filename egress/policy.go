package egress

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/triadhq/triad/wire"
)

// Defaults of a policy's limits when neither the policy nor the proxy's
// Config sets them.
const (
	DefaultMaxBytes       = 1 << 30
	DefaultMaxConnections = 10_000
)

// defaultPorts are a rule's ports when it names none.
var defaultPorts = []int{80, 443}

// Secret is a header the proxy adds to every request for a destination.
// Its value lives only here, on the host: String, GoString and LogValue
// never show it.
type Secret struct {
	// Host is a DNS name or a "*.example.com" wildcard.
	Host string
	// Header is the header's canonical name.
	Header string
	// Value is the header's value, e.g. "Bearer …".
	Value string
}

// String shows the secret's destination and header, never its value.
func (s Secret) String() string { return s.Host + " " + s.Header + ": <secret>" }

// GoString is String, so %#v does not print the value either.
func (s Secret) GoString() string { return s.String() }

// Policy is a validated egress policy: what a run's sandbox may reach.
// The zero Policy (and a nil *Policy) reaches nothing. A Policy is
// immutable once made.
type Policy struct {
	rules    []rule
	deny     []netip.Prefix
	maxBytes int64
	maxConns int
	secrets  []Secret
	wire     wire.EgressPolicy
}

type rule struct {
	host    string // normalised: "*", "*.example.com" or "example.com"
	ports   []int
	methods []string // upper case; nil is any
}

// ErrOutside means a run asked for egress its template's policy does not
// allow, without the scope to widen it: narrow the request, or ask an
// operator.
var ErrOutside = errors.New("egress: outside the template's policy")

// Compile validates p and attaches the secrets' values. p.Secrets is
// ignored: the secrets given here are the policy's, and its wire form
// names them (host and header only).
func Compile(p wire.EgressPolicy, secrets []Secret) (*Policy, error) {
	out := &Policy{maxBytes: p.MaxBytes, maxConns: p.MaxConnections}
	if p.MaxBytes < 0 || p.MaxConnections < 0 {
		return nil, fmt.Errorf("egress policy: max_bytes and max_connections must not be negative")
	}
	for i, r := range p.Allow {
		cr, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("egress policy: allow[%d]: %w", i, err)
		}
		out.rules = append(out.rules, cr)
	}
	for i, d := range p.Deny {
		pfx, err := parseCIDR(d)
		if err != nil {
			return nil, fmt.Errorf("egress policy: deny[%d]: %w", i, err)
		}
		out.deny = append(out.deny, pfx)
	}
	for i, s := range secrets {
		h, err := normalizePattern(s.Host)
		if err != nil {
			return nil, fmt.Errorf("egress policy: secret %d: %w", i, err)
		}
		if h == "*" {
			return nil, fmt.Errorf("egress policy: secret %d: a secret names its destination; %q would send it anywhere", i, s.Host)
		}
		name := http.CanonicalHeaderKey(strings.TrimSpace(s.Header))
		if !validHeaderName(name) {
			return nil, fmt.Errorf("egress policy: secret %d: %q is not a header name", i, s.Header)
		}
		if s.Value == "" || strings.ContainsAny(s.Value, "\r\n\x00") {
			return nil, fmt.Errorf("egress policy: secret %d (%s %s): the value is empty or holds a line break", i, h, name)
		}
		out.secrets = append(out.secrets, Secret{Host: h, Header: name, Value: s.Value})
	}
	out.wire = out.describe()
	return out, nil
}

func compileRule(r wire.EgressRule) (rule, error) {
	h, err := normalizePattern(r.Host)
	if err != nil {
		return rule{}, err
	}
	out := rule{host: h}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return rule{}, fmt.Errorf("port %d is not a TCP port", p)
		}
		if !slices.Contains(out.ports, p) {
			out.ports = append(out.ports, p)
		}
	}
	if out.ports == nil {
		out.ports = slices.Clone(defaultPorts)
	}
	slices.Sort(out.ports)
	for _, m := range r.Methods {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || m == http.MethodConnect || strings.IndexFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
			return rule{}, fmt.Errorf("method %q is not an HTTP method a rule can allow", m)
		}
		if !slices.Contains(out.methods, m) {
			out.methods = append(out.methods, m)
		}
	}
	slices.Sort(out.methods)
	return out, nil
}

// describe is the policy's wire form: rules normalised, secrets by name.
func (p *Policy) describe() wire.EgressPolicy {
	w := wire.EgressPolicy{MaxBytes: p.maxBytes, MaxConnections: p.maxConns}
	for _, r := range p.rules {
		w.Allow = append(w.Allow, wire.EgressRule{Host: r.host, Ports: slices.Clone(r.ports), Methods: slices.Clone(r.methods)})
	}
	for _, d := range p.deny {
		w.Deny = append(w.Deny, d.String())
	}
	for _, s := range p.secrets {
		w.Secrets = append(w.Secrets, wire.EgressSecret{Host: s.Host, Header: s.Header})
	}
	return w
}

// Wire returns the policy as callers may see it: secrets by host and
// header name only.
func (p *Policy) Wire() wire.EgressPolicy {
	if p == nil {
		return wire.EgressPolicy{}
	}
	return p.wire
}

// Empty reports whether the policy reaches nothing.
func (p *Policy) Empty() bool { return p == nil || len(p.rules) == 0 }

// Secrets returns the policy's secrets, values included, for the proxy.
func (p *Policy) secretsFor(host string) []Secret {
	if p == nil {
		return nil
	}
	var out []Secret
	for _, s := range p.secrets {
		if matchHost(s.Host, host) {
			out = append(out, s)
		}
	}
	return out
}

// InterceptHosts are the patterns whose HTTPS the proxy terminates: those
// with a secret, and those of rules that limit methods. The run's CA may
// sign only for these (its name constraints).
func (p *Policy) interceptHosts() []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, s := range p.secrets {
		if !slices.Contains(out, s.Host) {
			out = append(out, s.Host)
		}
	}
	for _, r := range p.rules {
		if r.methods != nil && !slices.Contains(out, r.host) {
			out = append(out, r.host)
		}
	}
	return out
}

// Intercepts reports whether the proxy terminates TLS for some
// destination of this policy, so that the run needs a CA.
func (p *Policy) Intercepts() bool { return len(p.interceptHosts()) > 0 }

// decision is what the policy says about one destination.
type decision struct {
	ok        bool
	reason    string
	code      string // a metrics label
	intercept bool   // terminate TLS to add secrets or check methods
	methods   []string
}

// check decides a destination by name and port, before resolution. An
// empty method means the proxy cannot see it yet (a CONNECT).
func (p *Policy) check(host string, port int, method string) decision {
	if p.Empty() {
		return decision{reason: "this run's egress policy allows nothing", code: CodeNoPolicy}
	}
	var (
		named   bool
		ported  []rule
		anyMeth bool
	)
	for _, r := range p.rules {
		if !matchHost(r.host, host) {
			continue
		}
		named = true
		if slices.Contains(r.ports, port) {
			ported = append(ported, r)
			if r.methods == nil {
				anyMeth = true
			}
		}
	}
	if !named {
		return decision{reason: fmt.Sprintf("%s is not allowed by this run's egress policy", host), code: CodeNotAllowed}
	}
	if len(ported) == 0 {
		return decision{reason: fmt.Sprintf("port %d of %s is not allowed by this run's egress policy", port, host), code: CodePort}
	}
	d := decision{ok: true, code: CodeAllowed, intercept: len(p.secretsFor(host)) > 0}
	if !anyMeth {
		d.intercept = true
		for _, r := range ported {
			for _, m := range r.methods {
				if !slices.Contains(d.methods, m) {
					d.methods = append(d.methods, m)
				}
			}
		}
		if method != "" && !slices.Contains(d.methods, method) {
			return decision{reason: fmt.Sprintf("%s to %s is not allowed by this run's egress policy (allowed: %s)", method, host, strings.Join(d.methods, ", ")), code: CodeMethod}
		}
	}
	d.reason = fmt.Sprintf("allowed by rule %s", describeRule(ported[0]))
	return d
}

func describeRule(r rule) string {
	s := r.host + ":" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(r.ports)), ","), "[]")
	if r.methods != nil {
		s += " " + strings.Join(r.methods, ",")
	}
	return s
}

// denied reports which of the policy's deny prefixes holds a, if any.
func (p *Policy) denied(a netip.Addr) (netip.Prefix, bool) {
	for _, d := range p.deny {
		if d.Contains(a) {
			return d, true
		}
	}
	return netip.Prefix{}, false
}

// limits are the policy's limits over the proxy's defaults.
func (p *Policy) limits(maxBytes int64, maxConns int) (int64, int) {
	if p != nil && p.maxBytes > 0 {
		maxBytes = p.maxBytes
	}
	if p != nil && p.maxConns > 0 {
		maxConns = p.maxConns
	}
	return maxBytes, maxConns
}

// Narrow returns the policy a run gets when it asks for req within p, its
// template's policy. A request's rules must each fall within p: a host
// the template's rules cover, ports and methods among theirs (a rule that
// leaves ports or methods out takes the template's). Deny prefixes add
// up; limits may only shrink. widen lets an admin caller go beyond p. A
// request outside p fails with an error wrapping ErrOutside that names
// what is outside. Secrets always come from p, for the hosts still
// allowed; a request cannot add one.
func (p *Policy) Narrow(req wire.EgressPolicy, widen bool) (*Policy, error) {
	if p == nil {
		p = &Policy{}
	}
	if len(req.Secrets) > 0 {
		return nil, fmt.Errorf("%w: secrets come from the template, never from a request", ErrOutside)
	}
	out := &Policy{deny: slices.Clone(p.deny), maxBytes: p.maxBytes, maxConns: p.maxConns}
	if req.Allow == nil {
		out.rules = slices.Clone(p.rules)
	}
	for i, rr := range req.Allow {
		r, err := compileRule(rr)
		if err != nil {
			return nil, fmt.Errorf("egress allow[%d]: %w", i, err)
		}
		got := p.within(r, rr)
		if len(got) == 0 {
			if !widen {
				return nil, fmt.Errorf("%w: %s is not allowed by the template's policy (%s)", ErrOutside, describeRequested(rr), p.summary())
			}
			got = []rule{r}
		}
		out.rules = append(out.rules, got...)
	}
	for i, d := range req.Deny {
		pfx, err := parseCIDR(d)
		if err != nil {
			return nil, fmt.Errorf("egress deny[%d]: %w", i, err)
		}
		out.deny = append(out.deny, pfx)
	}
	var err error
	if out.maxBytes, err = shrink("max_bytes", p.maxBytes, req.MaxBytes, widen); err != nil {
		return nil, err
	}
	mc, err := shrink("max_connections", int64(p.maxConns), int64(req.MaxConnections), widen)
	if err != nil {
		return nil, err
	}
	out.maxConns = int(mc)
	for _, s := range p.secrets {
		for _, r := range out.rules {
			if covers(r.host, s.Host) || covers(s.Host, r.host) {
				out.secrets = append(out.secrets, s)
				break
			}
		}
	}
	out.wire = out.describe()
	return out, nil
}

func shrink(name string, have, want int64, widen bool) (int64, error) {
	switch {
	case want < 0:
		return 0, fmt.Errorf("egress %s must not be negative", name)
	case want == 0:
		return have, nil
	case have != 0 && want > have && !widen:
		return 0, fmt.Errorf("%w: %s %d is above the template's %d", ErrOutside, name, want, have)
	}
	return want, nil
}

// within returns r narrowed by each of p's rules that covers its host,
// or nil when r asks for anything none of them allows. raw tells which
// of r's ports and methods were asked for (the rest are inherited).
func (p *Policy) within(r rule, raw wire.EgressRule) []rule {
	var (
		out        []rule
		ports      []int
		methodsAny bool
		methods    []string
	)
	for _, t := range p.rules {
		if !covers(t.host, r.host) {
			continue
		}
		n := rule{host: r.host, ports: t.ports, methods: t.methods}
		if raw.Ports != nil {
			n.ports = intersect(r.ports, t.ports)
		}
		if raw.Methods != nil {
			if t.methods == nil {
				n.methods = r.methods
			} else {
				n.methods = intersect(r.methods, t.methods)
			}
		}
		if len(n.ports) == 0 || (n.methods != nil && len(n.methods) == 0) {
			continue
		}
		ports = append(ports, n.ports...)
		if n.methods == nil {
			methodsAny = true
		}
		methods = append(methods, n.methods...)
		out = append(out, n)
	}
	for _, want := range r.ports {
		if raw.Ports != nil && !slices.Contains(ports, want) {
			return nil
		}
	}
	if raw.Methods != nil && !methodsAny {
		for _, want := range r.methods {
			if !slices.Contains(methods, want) {
				return nil
			}
		}
	}
	return out
}

func describeRequested(r wire.EgressRule) string {
	s := r.Host
	if len(r.Ports) > 0 {
		s += fmt.Sprint(" ports ", r.Ports)
	}
	if len(r.Methods) > 0 {
		s += " methods " + strings.Join(r.Methods, ",")
	}
	return s
}

// summary names p's rules, for an error message.
func (p *Policy) summary() string {
	if p.Empty() {
		return "it allows nothing"
	}
	var parts []string
	for _, r := range p.rules {
		parts = append(parts, describeRule(r))
	}
	return "it allows " + strings.Join(parts, "; ")
}

func intersect[T comparable](a, b []T) []T {
	out := []T{}
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// matchHost reports whether the normalised pattern matches the
// normalised host name.
func matchHost(pattern, host string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:])
	default:
		return pattern == host
	}
}

// covers reports whether every name pattern b matches, pattern a matches too.
func covers(a, b string) bool {
	switch {
	case a == "*":
		return true
	case b == "*":
		return false
	case strings.HasPrefix(b, "*."):
		return strings.HasPrefix(a, "*.") && (b == a || strings.HasSuffix(b, a[1:]))
	default:
		return matchHost(a, b)
	}
}

// CheckRuleHost reports whether h is a host an egress rule can name
// (wire.EgressHostFormat).
func CheckRuleHost(h string) error { _, err := normalizePattern(h); return err }

// CheckCIDR reports whether s is an address or a prefix a policy's deny
// list can hold (wire.CIDRFormat).
func CheckCIDR(s string) error { _, err := parseCIDR(s); return err }

// CheckMethod reports whether m is a method a rule can allow
// (wire.HTTPMethodFormat).
func CheckMethod(m string) error {
	_, err := compileRule(wire.EgressRule{Host: "example.com", Methods: []string{m}})
	return err
}

// ValidHeaderName reports whether s is an HTTP header's name
// (wire.HeaderNameFormat).
func ValidHeaderName(s string) bool { return validHeaderName(s) }

// normalizePattern validates a rule's host: "*", "*.name" or a name.
func normalizePattern(h string) (string, error) {
	h = strings.TrimSpace(h)
	if h == "*" {
		return h, nil
	}
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		n, err := NormalizeHost(rest)
		if err != nil {
			return "", err
		}
		return "*." + n, nil
	}
	if strings.Contains(h, "*") {
		return "", fmt.Errorf("host %q: a wildcard is \"*\" or a leading \"*.\"", h)
	}
	return NormalizeHost(h)
}

// NormalizeHost lower-cases a DNS name and drops a trailing dot. It
// refuses IP literals (the proxy decides by name), names whose last label
// is numeric (which some resolvers read as an address), and anything that
// is not a DNS name of letters, digits, hyphens and underscores.
func NormalizeHost(h string) (string, error) {
	h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
	if h == "" {
		return "", errors.New("the host is empty")
	}
	if strings.HasPrefix(h, "[") || strings.Contains(h, ":") {
		return "", fmt.Errorf("%q is an IP address; egress is allowed by name", h)
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return "", fmt.Errorf("%q is an IP address; egress is allowed by name", h)
	}
	if len(h) > 253 {
		return "", fmt.Errorf("host %q is longer than a DNS name can be", h)
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%q is not a DNS name", h)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%q is not a DNS name (non-ASCII names go in their xn-- form)", h)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.IndexFunc(last, func(c rune) bool { return c < '0' || c > '9' }) < 0 || strings.HasPrefix(last, "0x") {
		return "", fmt.Errorf("%q looks like an IP address; egress is allowed by name", h)
	}
	return h, nil
}

func parseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return true
}
