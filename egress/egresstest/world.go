package egresstest

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
)

// Names a World's resolver answers.
const (
	// Allowed, Other, Denied and API name the public host; tests allow
	// Allowed, leave Denied out, and attach secrets to API.
	Allowed = "allowed.test"
	Other   = "other.test"
	Denied  = "denied.test"
	API     = "api.test"
	// Index names the public host as a package index (/simple/).
	Index = "pypi.test"
	// Private names the private host; Metadata and Loopback resolve to
	// 169.254.169.254 and 127.0.0.1; Rebind answers the public host's
	// address first and the private host's after; Mixed answers both at
	// once; Nowhere does not resolve.
	Private  = "private.test"
	Metadata = "metadata.test"
	Loopback = "loopback.test"
	Rebind   = "rebind.test"
	Mixed    = "mixed.test"
	Nowhere  = "nowhere.test"
)

// SecretPath answers whether the request carried an Authorization header,
// never the header itself.
const SecretPath = "/secret"

// World is a public and a private test host, a resolver that names them,
// a CA their certificates come from, and a wheel the public host serves
// as a package index.
type World struct {
	Resolver *Resolver
	CA       *CA
	Public   *Host
	Private  *Host
	// Seen receives the requests the hosts served (the first 1000).
	Seen chan *http.Request
	// PrivateHits counts the requests the private host served: a sandbox
	// must never reach it.
	PrivateHits atomic.Int64
	// Wheel is the package the index serves: triad_egress_probe 1.0, whose
	// module says PROBE = "fetched".
	Wheel Wheel
}

// NewWorld starts a World; it is removed when the test ends.
func NewWorld(t testing.TB) *World {
	t.Helper()
	Need(t)
	w := &World{Resolver: NewResolver(), CA: NewCA(t), Seen: make(chan *http.Request, 1000)}
	w.Wheel = MakeWheel(t, "triad_egress_probe", "1.0", "PROBE = \"fetched\"\n")
	index := PackageIndex(w.Wheel)
	mux := http.NewServeMux()
	mux.Handle("/simple/", index)
	mux.Handle("/files/", index)
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		w.see(r)
		fmt.Fprintf(rw, "hello from %s\n", r.Host)
	})
	mux.HandleFunc("/bytes", func(rw http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		rw.Header().Set("Content-Length", strconv.Itoa(n))
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, len(buf))
			if _, err := rw.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/redirect", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc(SecretPath, func(rw http.ResponseWriter, r *http.Request) {
		w.see(r)
		fmt.Fprintf(rw, "authorization present: %v\n", r.Header.Get("Authorization") != "")
	})
	public := []string{Allowed, Other, Denied, API, Index, Rebind, Mixed}
	w.Public = NewHost(t, mux, HostOptions{TLS: w.CA.ServerTLS(t, public...)})
	private := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.PrivateHits.Add(1)
		mux.ServeHTTP(rw, r)
	})
	w.Private = NewHost(t, private, HostOptions{Addr: privateAddr(), TLS: w.CA.ServerTLS(t, append([]string{Private}, public...)...)})
	for _, n := range []string{Allowed, Other, Denied, API, Index} {
		w.Resolver.Set(n, w.Public.Addr)
	}
	w.Resolver.Set(Private, w.Private.Addr)
	w.Resolver.Set(Metadata, netip.MustParseAddr("169.254.169.254"))
	w.Resolver.Set(Loopback, netip.MustParseAddr("127.0.0.1"))
	w.Resolver.Sequence(Rebind, []netip.Addr{w.Public.Addr}, []netip.Addr{w.Private.Addr})
	w.Resolver.Set(Mixed, w.Public.Addr, w.Private.Addr)
	return w
}

func (w *World) see(r *http.Request) {
	select {
	case w.Seen <- r:
	default:
	}
}

// privateAddr picks a 10.254.x.y address for a private test host.
func privateAddr() netip.Addr {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return netip.AddrFrom4([4]byte{10, 254, b[0], 2 + b[1]%250})
}
