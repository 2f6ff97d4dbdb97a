package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"time"
)

// authority is a run's CA: it signs certificates for the destinations the
// proxy intercepts, and only for those (the CA's name constraints). Its
// key lives in this process's memory and nowhere else; see "Egress" in
// docs/DECISIONS.md for the choice and its risk.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	pem     []byte
	leafKey crypto.Signer

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// caLifetime is how long a run's CA and its certificates are valid: a run
// that lives longer gets a new CA when its kernel is set up again.
const caLifetime = 30 * 24 * time.Hour

func newAuthority(run string, hosts []string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"Triad"}, CommonName: "Triad egress CA for run " + truncate(run, 40)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	// Name constraints: the CA can vouch only for the intercepted
	// destinations, so the trust the kernel gives it reaches no further.
	// A rule for "*" with methods intercepts every name and cannot be
	// constrained.
	constrained := true
	for _, h := range hosts {
		switch {
		case h == "*":
			constrained = false
		case strings.HasPrefix(h, "*."):
			tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h[1:])
		default:
			tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h)
		}
	}
	if constrained {
		tmpl.PermittedDNSDomainsCritical = true
	} else {
		tmpl.PermittedDNSDomains = nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, leafKey: leafKey,
		pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), leaves: map[string]*tls.Certificate{}}, nil
}

// leaf returns a certificate for host signed by the run's CA.
func (a *authority) leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.leaves[host]; ok {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    a.cert.NotBefore,
		NotAfter:     a.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, a.leafKey.Public(), a.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: a.leafKey}
	a.leaves[host] = c
	return c, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// errHello ends the handshake peekHello starts once the ClientHello is read.
var errHello = errors.New("egress: client hello read")

// maxHello bounds what peekHello reads: a ClientHello fits in a few
// kilobytes, and records beyond it are not read.
const maxHello = 64 << 10

// peekHello reads the TLS ClientHello at the start of a tunnel and
// returns its SNI and every byte it read, to be sent upstream as they
// came. ok is false when the bytes are not a TLS ClientHello.
func peekHello(r io.Reader) (sni string, raw []byte, ok bool) {
	rec := &recorder{r: io.LimitReader(r, maxHello)}
	_ = tls.Server(helloConn{rec}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, ok = h.ServerName, true
		return nil, errHello
	}}).Handshake()
	return sni, rec.buf.Bytes(), ok
}

type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// helloConn is the read side of a tunnel as a net.Conn for crypto/tls to
// parse a ClientHello from; what the TLS server writes (an alert) goes
// nowhere.
type helloConn struct{ r io.Reader }

func (c helloConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c helloConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c helloConn) Close() error                       { return nil }
func (c helloConn) LocalAddr() net.Addr                { return helloAddr{} }
func (c helloConn) RemoteAddr() net.Addr               { return helloAddr{} }
func (c helloConn) SetDeadline(t time.Time) error      { return nil }
func (c helloConn) SetReadDeadline(t time.Time) error  { return nil }
func (c helloConn) SetWriteDeadline(t time.Time) error { return nil }

type helloAddr struct{}

func (helloAddr) Network() string { return "egress" }
func (helloAddr) String() string  { return "sandbox" }

// upstreamTLS is the client configuration for an intercepted
// destination's real server.
func (s *Session) upstreamTLS(host string) *tls.Config {
	return &tls.Config{ServerName: host, RootCAs: s.p.cfg.RootCAs, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
}

// sandboxTLS is the server configuration the sandbox sees for an
// intercepted destination: a certificate from the run's CA, for host only.
func (s *Session) sandboxTLS(host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if sni, err := NormalizeHost(h.ServerName); err != nil || sni != host {
				return nil, fmt.Errorf("TLS SNI %q does not match the CONNECT host %s", h.ServerName, host)
			}
			return s.ca.leaf(host)
		},
	}
}
