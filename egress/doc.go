// Package egress is the proxy on Triad's host through which a sandbox reaches the network: nothing by default, named hosts by policy, every connection a record.
//
// A kernel's network namespace stays closed. Its processes reach the proxy
// at sandbox.EgressAddr, which the backend relays to the host (a Kernel
// that implements sandbox.Egress); a Session serves those connections for
// one run under the run's Policy. The proxy decides by name: it resolves
// names itself through a Resolver (the sandbox has no DNS), refuses IP
// literals, refuses private, loopback, link-local, metadata and the host's
// own addresses after resolution, and connects to the very address it
// checked, so neither DNS rebinding nor a redirect can steer it elsewhere.
// HTTPS passes through by CONNECT host and TLS SNI, without interception,
// unless the policy attaches a secret header to the destination or limits
// its methods: then the Session terminates TLS with a per-run CA the
// kernel trusts (see "Egress" in docs/DECISIONS.md). Each connection, allowed or
// denied, becomes a wire.Connection the run journals (Session.Take).
package egress
