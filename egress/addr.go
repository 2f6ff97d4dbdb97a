package egress

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Resolver resolves names for the proxy; *net.Resolver satisfies it, and
// tests give one of their own (egresstest.Resolver) so that test names
// resolve to test hosts without DNS.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// refused are the address ranges the proxy never connects to, whatever
// the policy says, with why. Documentation ranges (TEST-NET) are not
// here: they route nowhere on the internet, and Triad's tests put their
// test hosts there.
var refused = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "a cloud metadata address"},
	{netip.MustParsePrefix("100.100.100.200/32"), "a cloud metadata address"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("::/128"), "an unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// embedded returns the IPv4 address an IPv6 address carries (mapped,
// NAT64, 6to4), which is what the packets would reach.
func embedded(a netip.Addr) (netip.Addr, bool) {
	if a.Is4In6() {
		return a.Unmap(), true
	}
	b := a.As16()
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(a), netip.MustParsePrefix("64:ff9b:1::/48").Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case netip.MustParsePrefix("2002::/16").Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// refusedWhy says why the proxy never connects to a, or "" when it may.
func refusedWhy(a netip.Addr) string {
	a = a.WithZone("")
	if v4, ok := embedded(a); ok {
		if why := refusedWhy(v4); why != "" {
			return why
		}
	}
	for _, r := range refused {
		if r.prefix.Contains(a) {
			return r.why
		}
	}
	return ""
}

// ownNets are the networks of the host's own interfaces: an address there
// is the host itself or its neighbours (a gateway, another machine of the
// cluster), which a sandbox must not reach. Re-read at most every few
// seconds, since interfaces come and go.
type ownNets struct {
	mu   sync.Mutex
	at   time.Time
	nets []netip.Prefix
}

const ownNetsTTL = 5 * time.Second

func (o *ownNets) contains(a netip.Addr) (netip.Prefix, bool) {
	o.mu.Lock()
	if time.Since(o.at) > ownNetsTTL {
		o.nets, o.at = interfaceNets(), time.Now()
	}
	nets := o.nets
	o.mu.Unlock()
	for _, n := range nets {
		if n.Contains(a) {
			return n, true
		}
	}
	return netip.Prefix{}, false
}

func interfaceNets() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ones, _ := ipn.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones).Masked())
	}
	return out
}
