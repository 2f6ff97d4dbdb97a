// Package egresstest gives egress tests hosts of their own to reach: servers in network namespaces with addresses of their own, names for them in a resolver of their own, a CA for their certificates, and a package index.
//
// A Host is a real server behind a veth pair in its own network namespace
// (ip netns, veth, a /32 route on the host), at an address from the
// documentation ranges (TEST-NET-2 and -3) unless the test asks for a
// private one. Nothing a test makes here ever sends a packet beyond the
// machine. Making hosts needs root and iproute2: a test without them
// skips locally and fails under CI (internal/testenv).
package egresstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/triadhq/triad/internal/testenv"
)

// Resolver answers names from a table the test fills: the proxy's
// resolver in tests, so that test names need no DNS. It is safe for
// concurrent use.
type Resolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr
	lookups map[string]int
}

// NewResolver returns an empty Resolver: every name is unknown.
func NewResolver() *Resolver {
	return &Resolver{answers: map[string][][]netip.Addr{}, lookups: map[string]int{}}
}

// Set makes name resolve to addrs.
func (r *Resolver) Set(name string, addrs ...netip.Addr) { r.Sequence(name, addrs) }

// Sequence makes name's lookups answer each list in turn, the last one
// from then on: a rebinding name answers a public address first and a
// private one after.
func (r *Resolver) Sequence(name string, answers ...[]netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[strings.ToLower(name)] = answers
}

// Lookups is how many times name was looked up.
func (r *Resolver) Lookups(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups[strings.ToLower(name)]
}

// LookupNetIP implements egress.Resolver.
func (r *Resolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	seq, ok := r.answers[host]
	if !ok || len(seq) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	n := r.lookups[host]
	r.lookups[host] = n + 1
	return append([]netip.Addr(nil), seq[min(n, len(seq)-1)]...), nil
}

// CA is a certificate authority for test hosts' certificates.
type CA struct {
	Cert *x509.Certificate
	// PEM is the CA certificate, for a kernel's trust bundle.
	PEM []byte
	// Pool holds the CA certificate, for a Go client's RootCAs.
	Pool *x509.CertPool
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Triad egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: pool, key: key}
}

// ServerTLS returns a server configuration with a certificate for names.
func (ca *CA) ServerTLS(t testing.TB, names ...string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key}}}
}

// Host is an HTTP server (port 80) and, when given a TLS configuration,
// an HTTPS server (port 443) at an address of its own, in a network
// namespace of its own.
type Host struct {
	// Addr is the host's address.
	Addr netip.Addr
	ns   string
	link string
}

// HostOptions configure NewHost.
type HostOptions struct {
	// Addr is the host's address; zero picks a free one in TEST-NET-2 or
	// TEST-NET-3. A private address (10.x) makes a private host.
	Addr netip.Addr
	// TLS, when set, serves HTTPS on port 443 too.
	TLS *tls.Config
}

// Need stops the test unless this process can make hosts: root and the ip
// command. Under CI it fails instead (scripts/host-deps.sh installs
// iproute2).
func Need(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (egress test hosts live in network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "the ip command (iproute2)")
	}
}

// NewHost starts h at a new host. The test's cleanup removes the host.
func NewHost(t testing.TB, h http.Handler, opts HostOptions) *Host {
	t.Helper()
	Need(t)
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	id := fmt.Sprintf("%x", suffix)
	host := &Host{ns: "triad-eg-" + id, link: "teg" + id}
	t.Cleanup(host.remove)
	if err := run("ip", "netns", "add", host.ns); err != nil {
		t.Fatal(err)
	}
	if err := run("ip", "link", "add", host.link, "type", "veth", "peer", "name", host.link+"n", "netns", host.ns); err != nil {
		t.Fatal(err)
	}
	steps := [][]string{
		{"ip", "link", "set", host.link, "up"},
		{"ip", "-n", host.ns, "link", "set", "lo", "up"},
		{"ip", "-n", host.ns, "link", "set", host.link + "n", "up"},
		{"ip", "-n", host.ns, "route", "add", "default", "dev", host.link + "n"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			t.Fatal(err)
		}
	}
	// An address, and the host's route to it: a collision with another
	// test's host shows as an existing route, and another address is tried.
	for try := 0; ; try++ {
		addr := opts.Addr
		if !addr.IsValid() {
			addr = pick()
		}
		err := run("ip", "route", "add", addr.String()+"/32", "dev", host.link)
		if err == nil {
			host.Addr = addr
			break
		}
		if opts.Addr.IsValid() || try > 20 {
			t.Fatalf("route to test host %s: %v", addr, err)
		}
	}
	if err := run("ip", "-n", host.ns, "addr", "add", host.Addr.String()+"/32", "dev", host.link+"n"); err != nil {
		t.Fatal(err)
	}
	serve := func(port int, cfg *tls.Config) {
		l, err := listenIn(host.ns, netip.AddrPortFrom(host.Addr, uint16(port)).String())
		if err != nil {
			t.Fatalf("listen in %s: %v", host.ns, err)
		}
		if cfg != nil {
			l = tls.NewListener(l, cfg)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	serve(80, nil)
	if opts.TLS != nil {
		serve(443, opts.TLS)
	}
	return host
}

// URL returns scheme://name/path for a name the test's resolver maps to
// this host.
func (h *Host) URL(scheme, name, path string) string { return scheme + "://" + name + path }

func (h *Host) remove() {
	if h.link != "" {
		_ = run("ip", "link", "del", h.link)
	}
	_ = run("ip", "netns", "del", h.ns)
}

var pickMu sync.Mutex

// pick returns an address in TEST-NET-2 or TEST-NET-3 that no route names yet.
func pick() netip.Addr {
	pickMu.Lock()
	defer pickMu.Unlock()
	var b [2]byte
	_, _ = rand.Read(b[:])
	nets := [][3]byte{{198, 51, 100}, {203, 0, 113}}
	n := nets[b[0]%2]
	return netip.AddrFrom4([4]byte{n[0], n[1], n[2], 2 + b[1]%252})
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// listenIn opens a TCP listener inside the named network namespace: the
// socket belongs to the namespace it was made in, whichever thread serves
// it afterwards.
func listenIn(ns, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This goroutine's thread enters the namespace and, if it cannot
		// come back, dies with the goroutine (the thread stays locked).
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		l, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if l != nil {
				l.Close()
			}
			ch <- result{nil, errors.Join(lerr, fmt.Errorf("setns back: %w", err))}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l, lerr}
	}()
	r := <-ch
	return r.l, r.err
}
