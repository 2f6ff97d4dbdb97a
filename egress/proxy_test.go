package egress_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/egress/egresstest"
	"github.com/triadhq/triad/wire"
)

// world is the test hosts of egresstest, and a proxy that resolves their
// names.
type world struct {
	*egresstest.World
	proxy *egress.Proxy
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{World: egresstest.NewWorld(t)}
	w.proxy = egress.New(egress.Config{Resolver: w.Resolver, RootCAs: w.CA.Pool})
	return w
}

// session serves a session on a loopback listener, as a sandbox's relay
// would hand it connections, and returns a client using it as its proxy.
func (w *world) session(t *testing.T, pol wire.EgressPolicy, secrets ...egress.Secret) (*egress.Session, *http.Client) {
	t.Helper()
	p, err := egress.Compile(pol, secrets)
	if err != nil {
		t.Fatal(err)
	}
	s, err := w.proxy.Session("run-"+t.Name(), p)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ctx, func(ctx context.Context) (net.Conn, error) { return l.Accept() })
	}()
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-done
		s.Close()
	})
	roots := x509.NewCertPool()
	roots.AddCert(w.CA.Cert)
	if pem := s.CACert(); pem != nil {
		roots.AppendCertsFromPEM(pem)
	}
	proxyURL := &url.URL{Scheme: "http", Host: l.Addr().String()}
	return s, &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
}

func allow(hosts ...string) wire.EgressPolicy {
	var p wire.EgressPolicy
	for _, h := range hosts {
		p.Allow = append(p.Allow, wire.EgressRule{Host: h})
	}
	return p
}

func get(t *testing.T, c *http.Client, u string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestAllowed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("allowed.test"))
	for _, u := range []string{"http://allowed.test/x", "https://allowed.test/y"} {
		status, body, err := get(t, c, u)
		if err != nil || status != 200 || !strings.Contains(body, "hello from allowed.test") {
			t.Errorf("GET %s: %d %q %v, want 200 hello", u, status, body, err)
		}
	}
	recs := take(t, s, 2)
	for i, want := range []struct{ kind, url string }{{egress.KindHTTP, "http://allowed.test/x"}, {egress.KindTunnel, "https://allowed.test/"}} {
		r := recs[i]
		if r.Kind != want.kind || r.URL != want.url || r.Verdict != wire.VerdictAllowed || r.Host != "allowed.test" || r.Sent == 0 || r.Received == 0 ||
			r.Addr != netip.AddrPortFrom(w.Public.Addr, uint16(r.Port)).String() || r.Open {
			t.Errorf("record %d = %+v, want %s %s allowed to %s with bytes both ways", i, r, want.kind, want.url, w.Public.Addr)
		}
	}
	if again := s.Take(); len(again) != 0 {
		t.Errorf("a second Take got %+v, want nothing", again)
	}
	// What the session moved, for the run's accounting, is what its
	// records moved, earlier use it was charged with aside.
	s.Charge(1000, 5)
	sent, received := s.Moved()
	if want := recs[0].Sent + recs[1].Sent; sent != want {
		t.Errorf("Moved sent %d, want the records' %d", sent, want)
	}
	if want := recs[0].Received + recs[1].Received; received != want {
		t.Errorf("Moved received %d, want the records' %d", received, want)
	}
}

// TestRefused: each way to reach what the policy does not allow is
// refused with a reason the sandbox's client shows, and a denied record.
func TestRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("allowed.test", "private.test", "metadata.test", "loopback.test", "rebind.test", "mixed.test", "nowhere.test"))
	ip := w.Public.Addr.String()
	for _, tc := range []struct {
		url     string
		code    string
		verdict string
		says    string
	}{
		{"https://denied.test/", egress.CodeNotAllowed, wire.VerdictDenied, "denied.test is not allowed"},
		{"http://denied.test/", egress.CodeNotAllowed, wire.VerdictDenied, "denied.test is not allowed"},
		{"https://" + ip + "/", egress.CodeIPLiteral, wire.VerdictDenied, "is an IP address"},
		{"http://" + ip + "/", egress.CodeIPLiteral, wire.VerdictDenied, "is an IP address"},
		{"https://allowed.test:8443/", egress.CodePort, wire.VerdictDenied, "port 8443"},
		{"https://private.test/", egress.CodeAddress, wire.VerdictDenied, "a private address"},
		{"http://private.test/", egress.CodeAddress, wire.VerdictDenied, "a private address"},
		{"https://metadata.test/", egress.CodeAddress, wire.VerdictDenied, "a cloud metadata address"},
		{"https://loopback.test/", egress.CodeAddress, wire.VerdictDenied, "a loopback address"},
		{"https://mixed.test/", egress.CodeAddress, wire.VerdictDenied, "a private address"},
		{"https://nowhere.test/", egress.CodeDNS, wire.VerdictFailed, "does not resolve"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			status, body, err := get(t, c, tc.url)
			msg := fmt.Sprint(status, body, err)
			if err == nil && status < 400 {
				t.Fatalf("GET %s: %s, want a refusal", tc.url, msg)
			}
			if !strings.Contains(msg, tc.says) {
				t.Errorf("GET %s: the client saw %q, want it to say %q", tc.url, msg, tc.says)
			}
			recs := take(t, s, 1)
			if len(recs) != 1 || recs[0].Verdict != tc.verdict || !strings.Contains(recs[0].Reason, tc.says) {
				t.Errorf("GET %s: records %+v, want one %s saying %q", tc.url, recs, tc.verdict, tc.says)
			}
		})
	}
	if n := w.PrivateHits.Load(); n != 0 {
		t.Errorf("the private host served %d request(s)", n)
	}
}

// TestRebinding: a name that resolves to a public address and then to a
// private one is resolved once per connection, and the connection goes
// to the address that was checked.
func TestRebinding(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("rebind.test"))
	status, _, err := get(t, c, "https://rebind.test/first")
	if err != nil || status != 200 {
		t.Fatalf("first GET: %d %v, want 200 from the public address", status, err)
	}
	if n := w.Resolver.Lookups("rebind.test"); n != 1 {
		t.Errorf("one connection looked the name up %d times, want 1", n)
	}
	_, _, err = get(t, c, "https://rebind.test/second")
	if err == nil || !strings.Contains(err.Error(), "a private address") {
		t.Errorf("second GET: %v, want a refusal naming the private address", err)
	}
	recs := take(t, s, 2)
	if len(recs) != 2 || recs[0].Addr != netip.AddrPortFrom(w.Public.Addr, 443).String() || recs[1].Verdict != wire.VerdictDenied {
		t.Errorf("records %+v, want the first pinned to %s and the second denied", recs, w.Public.Addr)
	}
}

// TestRedirect: a redirect from an allowed host to a denied one is
// followed by the client, and the proxy refuses the second request.
func TestRedirect(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("allowed.test"))
	for _, u := range []string{
		"http://allowed.test/redirect?to=http://denied.test/",
		"https://allowed.test/redirect?to=https://denied.test/",
		"https://allowed.test/redirect?to=https://" + w.Private.Addr.String() + "/",
	} {
		_, body, err := get(t, c, u)
		msg := fmt.Sprint(body, err)
		if !strings.Contains(msg, "Triad egress denied") {
			t.Errorf("GET %s: %q, want the proxy's refusal of the redirect's target", u, msg)
		}
		recs := take(t, s, 2)
		if len(recs) != 2 || recs[0].Verdict != wire.VerdictAllowed || recs[1].Verdict != wire.VerdictDenied {
			t.Errorf("GET %s: records %+v, want the allowed redirect and the denied target", u, recs)
		}
	}
}

// TestSNIMismatch: a tunnel whose TLS names another host than its
// CONNECT is cut, and recorded as denied.
func TestSNIMismatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("allowed.test"))
	tr := c.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.ServerName = "denied.test"
	_, _, err := get(t, &http.Client{Transport: tr}, "https://allowed.test/")
	if err == nil {
		t.Fatal("a tunnel to allowed.test carrying TLS for denied.test succeeded")
	}
	recs := take(t, s, 1)
	if len(recs) != 1 || recs[0].Verdict != wire.VerdictDenied || !strings.Contains(recs[0].Reason, "SNI") {
		t.Errorf("records %+v, want one denied for its SNI", recs)
	}
}

// TestSecret: a header attached to a destination reaches it, and appears
// in no record and no answer the sandbox gets.
func TestSecret(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const value = "Bearer sk-test-5ecret-value"
	s, c := w.session(t, allow("api.test", "allowed.test"), egress.Secret{Host: "api.test", Header: "Authorization", Value: value})
	if s.CACert() == nil {
		t.Fatal("a policy with a secret has no CA")
	}
	status, body, err := get(t, c, "https://api.test"+egresstest.SecretPath)
	if err != nil || status != 200 || !strings.Contains(body, "authorization present: true") {
		t.Fatalf("GET api.test: %d %q %v, want the header present", status, body, err)
	}
	var got *http.Request
	for r := range w.Seen {
		if r.URL.Path == egresstest.SecretPath {
			got = r
			break
		}
	}
	if got.Header.Get("Authorization") != value {
		t.Errorf("the test host got Authorization %q, want the secret", got.Header.Get("Authorization"))
	}
	// Not for another host, even one the policy allows.
	_, body, _ = get(t, c, "https://allowed.test"+egresstest.SecretPath)
	if !strings.Contains(body, "authorization present: false") {
		t.Errorf("allowed.test got the secret: %q", body)
	}
	recs := take(t, s, 2)
	b, _ := json.Marshal(recs)
	if bytes.Contains(b, []byte("5ecret")) {
		t.Errorf("the records hold the secret: %s", b)
	}
	if len(recs) != 2 || recs[0].Kind != egress.KindIntercepted || recs[0].URL != "https://api.test/secret" || len(recs[0].Injected) != 1 || recs[0].Injected[0] != "Authorization" || recs[0].Status != 200 {
		t.Errorf("records %s, want the intercepted request with Authorization injected, then the tunnel", b)
	}
	if pb, _ := json.Marshal(s.Policy().Wire()); bytes.Contains(pb, []byte("5ecret")) {
		t.Errorf("the policy's wire form holds the secret: %s", pb)
	}
	// The CA may sign for api.test only.
	block, _ := pemDecode(s.CACert())
	ca, err := x509.ParseCertificate(block)
	if err != nil || len(ca.PermittedDNSDomains) != 1 || ca.PermittedDNSDomains[0] != "api.test" || !ca.PermittedDNSDomainsCritical {
		t.Errorf("the run's CA constrains names to %v (%v), want api.test only", ca.PermittedDNSDomains, err)
	}
}

// TestMethods: a rule that limits methods is enforced on HTTPS by
// intercepting it.
func TestMethods(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "api.test", Methods: []string{"GET"}}}})
	if status, _, err := get(t, c, "https://api.test/"); err != nil || status != 200 {
		t.Fatalf("GET: %d %v, want 200", status, err)
	}
	resp, err := c.Post("https://api.test/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Status, "POST to api.test is not allowed") {
		t.Errorf("POST: %s, want 403 naming the method", resp.Status)
	}
	recs := take(t, s, 2)
	if len(recs) != 2 || recs[0].Verdict != wire.VerdictAllowed || recs[1].Verdict != wire.VerdictDenied || recs[1].Method != "POST" {
		t.Errorf("records %+v, want GET allowed and POST denied", recs)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	t.Run("connections", func(t *testing.T) {
		pol := allow("allowed.test")
		pol.MaxConnections = 2
		s, c := w.session(t, pol)
		for i := range 3 {
			status, _, err := get(t, c, "https://allowed.test/")
			if ok := err == nil && status == 200; ok != (i < 2) {
				t.Errorf("connection %d: %d %v", i+1, status, err)
			}
		}
		recs := take(t, s, 3)
		if len(recs) != 3 || recs[2].Verdict != wire.VerdictDenied || !strings.Contains(recs[2].Reason, "limit of 2 connections") {
			t.Errorf("records %+v, want the third denied by the limit", recs)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		pol := allow("allowed.test")
		pol.MaxBytes = 256 << 10
		s, c := w.session(t, pol)
		_, body, err := get(t, c, "https://allowed.test/bytes?n=1048576")
		if err == nil && len(body) >= 1<<20 {
			t.Fatalf("a 1 MiB download passed a 256 KiB limit")
		}
		recs := take(t, s, 1)
		if len(recs) != 1 || !strings.Contains(recs[0].Reason, "cut") || recs[0].Received > 2*pol.MaxBytes {
			t.Errorf("records %+v, want the download cut near the limit", recs)
		}
		if _, _, err := get(t, c, "https://allowed.test/"); err == nil || !strings.Contains(err.Error(), "egress limit") {
			t.Errorf("a connection after the limit: %v, want a refusal naming the limit", err)
		}
	})
}

// TestOpenRecords: a connection still open when records are taken is
// reported open, then again when it closes.
func TestOpenRecords(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, c := w.session(t, allow("allowed.test"))
	tr := c.Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = false
	kc := &http.Client{Transport: tr}
	if status, _, err := get(t, kc, "https://allowed.test/"); err != nil || status != 200 {
		t.Fatal(status, err)
	}
	recs := s.Take()
	if len(recs) != 1 || !recs[0].Open || recs[0].Received == 0 {
		t.Fatalf("records %+v, want one open connection with bytes", recs)
	}
	if again := s.Take(); len(again) != 0 {
		t.Errorf("an open connection reported twice: %+v", again)
	}
	tr.CloseIdleConnections()
	var closed []wire.Connection
	for len(closed) == 0 {
		closed = s.Take() // the tunnel ends once the proxy sees the close
		if len(closed) == 0 {
			waitABit()
		}
	}
	if closed[0].ID != recs[0].ID || closed[0].Open || closed[0].Verdict != wire.VerdictAllowed {
		t.Errorf("after close: %+v, want record %d closed and allowed", closed, recs[0].ID)
	}
}

// TestNoPolicy: a session with no policy refuses everything.
func TestNoPolicy(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	s, err := w.proxy.Session("nothing", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client, server := net.Pipe()
	go s.ServeConn(server)
	fmt.Fprintf(client, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
	b, _ := io.ReadAll(client)
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 403 Triad egress denied: this run's egress policy allows nothing")) {
		t.Errorf("got %q, want a 403 saying the policy allows nothing", b)
	}
}

// take returns the session's next n closed records, by id, waiting for
// the proxy to see the connections end.
func take(t *testing.T, s *egress.Session, n int) []wire.Connection {
	t.Helper()
	var got []wire.Connection
	for {
		for _, r := range s.Take() {
			if !r.Open {
				got = append(got, r)
			}
		}
		if len(got) >= n {
			slices.SortFunc(got, func(a, b wire.Connection) int { return a.ID - b.ID })
			return got
		}
		waitABit()
	}
}

func pemDecode(b []byte) ([]byte, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	return block.Bytes, nil
}

// waitABit yields while a test waits for the proxy to see a close, which
// it does on its own goroutine: the test waits for that event, not for a
// time.
func waitABit() { time.Sleep(10 * time.Millisecond) }

// noDeadlines is a connection that cannot take deadlines, as a
// Kubernetes port-forward stream cannot.
type noDeadlines struct{ net.Conn }

func (noDeadlines) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (noDeadlines) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (noDeadlines) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

// TestConnWithoutDeadlines: a CONNECT over a relay that cannot take
// deadlines is answered (net/http's server interrupts its own read with
// one when the proxy takes the connection over).
func TestConnWithoutDeadlines(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p, err := egress.Compile(allow("allowed.test"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := w.proxy.Session("nodeadlines", p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr := &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: "relay"}),
		TLSClientConfig: &tls.Config{RootCAs: w.CA.Pool},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			client, server := net.Pipe()
			go s.ServeConn(noDeadlines{server})
			return client, nil
		},
	}
	defer tr.CloseIdleConnections()
	status, body, err := get(t, &http.Client{Transport: tr}, "https://allowed.test/hello")
	if err != nil || status != 200 || !strings.Contains(body, "hello from allowed.test") {
		t.Errorf("through a relay without deadlines: %d %q %v", status, body, err)
	}
}
