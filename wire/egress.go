package wire

import "time"

// EgressPolicy says where a run's sandbox may connect through Triad's egress
// proxy. Nothing is reachable unless a rule allows it: the zero policy
// reaches nothing. A template declares one; a run may narrow its template's
// (never widen it without the admin scope). See "Egress" in
// docs/DECISIONS.md.
type EgressPolicy struct {
	Allow          []EgressRule   `json:"allow,omitempty" doc:"The destinations, by name, that the sandbox may reach."`
	Deny           []string       `json:"deny,omitempty" format:"cidr" doc:"Addresses (CIDRs) refused after a name resolves, beyond the private, loopback, link-local and metadata addresses that are always refused."`
	MaxBytes       int64          `json:"max_bytes,omitempty" minimum:"0" doc:"The bytes the run may move through the proxy, both ways together; 0 means the server's default."`
	MaxConnections int            `json:"max_connections,omitempty" minimum:"0" doc:"The connections the run may open through the proxy; 0 means the server's default."`
	Secrets        []EgressSecret `json:"secrets,omitempty" doc:"Headers the proxy adds to requests for a destination, by host and header name only: the value lives in the server's template and nowhere else."`
}

// EgressRule allows one destination.
type EgressRule struct {
	Host    string   `json:"host" format:"egress-host" doc:"A DNS name (pypi.org), a wildcard for its subdomains at any depth (*.example.com, which does not match example.com itself), or * for any public name. IP literals are never allowed: the proxy decides by name."`
	Ports   []int    `json:"ports,omitempty" minimum:"1" maximum:"65535" doc:"The ports allowed, 1 to 65535; none means 80 and 443."`
	Methods []string `json:"methods,omitempty" format:"http-method" doc:"The HTTP methods allowed (GET, HEAD); none means any. The proxy sees an HTTPS request's method only by terminating its TLS, so a rule with methods makes its HTTPS destinations intercepted, like a secret's."`
}

// EgressSecret names a header the proxy adds for a destination. The value
// is never part of this type.
type EgressSecret struct {
	Host   string `json:"host" format:"egress-name" doc:"The destination, as in a rule's host (no *)."`
	Header string `json:"header" format:"header-name" doc:"The header's name, e.g. Authorization."`
}

// Connection is one outbound connection a run's sandbox opened through the
// egress proxy, or tried to: a record in the run's journal.
type Connection struct {
	// ID numbers the run's connections in the order they were opened.
	ID int `json:"id"`
	// Host and Port are where the sandbox asked to go.
	Host string `json:"host"`
	Port int    `json:"port"`
	// Addr is the address the proxy resolved and connected to (the one
	// it checked), when it got that far.
	Addr string `json:"addr,omitempty"`
	// Kind is "tunnel" (HTTPS passed through by CONNECT host and SNI),
	// "http" (a plain HTTP request forwarded by Host) or "intercepted"
	// (HTTPS terminated by the run's CA to add a secret or check a
	// method).
	Kind string `json:"kind"`
	// Method and URL are the request's, for "http" and "intercepted"; a
	// tunnel's URL is https://host[:port]/, all the proxy can know.
	Method string `json:"method,omitempty"`
	URL    string `json:"url,omitempty"`
	// Status is the upstream's HTTP status, for "http" and "intercepted".
	Status int `json:"status,omitempty"`
	// Verdict is "allowed", "denied" (by the policy, an address check, a
	// limit or a TLS check) or "failed" (allowed, but the upstream could
	// not be reached).
	Verdict string `json:"verdict"`
	// Reason says why, in words: the rule that allowed it, or what refused it.
	Reason string `json:"reason"`
	// Sent and Received are the bytes moved to and from the upstream.
	Sent     int64 `json:"sent"`
	Received int64 `json:"received"`
	// Injected names the headers the proxy added (never their values).
	Injected []string `json:"injected,omitempty"`
	// Started is when the sandbox asked; DurationMs how long the
	// connection lasted, so far when Open.
	Started    time.Time `json:"started"`
	DurationMs int64     `json:"duration_ms"`
	// Open is true when the connection was still open when this record
	// was taken; it is recorded again, closed, in a later step.
	Open bool `json:"open,omitempty"`
}

// Connection verdicts.
const (
	VerdictAllowed = "allowed"
	VerdictDenied  = "denied"
	VerdictFailed  = "failed"
)

// Template describes a sandbox template as callers see it: what its image
// adds to Triad's, and its egress policy (secrets by name only).
type Template struct {
	Name        string       `json:"name"`
	Description string       `json:"description,omitempty"`
	Debian      []string     `json:"debian,omitempty"`
	Wheels      []string     `json:"wheels,omitempty"`
	Files       []string     `json:"files,omitempty"`
	Egress      EgressPolicy `json:"egress"`
}

// TemplateList is GET /templates's answer.
type TemplateList struct {
	Templates []Template `json:"templates"`
}
