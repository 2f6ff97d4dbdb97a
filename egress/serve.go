package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/triadhq/triad/wire"
)

// Kinds of wire.Connection.
const (
	KindTunnel      = "tunnel"
	KindHTTP        = "http"
	KindIntercepted = "intercepted"
)

// ServeConn serves one connection from the sandbox, as an HTTP proxy:
// CONNECT tunnels and absolute-form plain HTTP requests, until the
// sandbox hangs up or the session closes.
func (s *Session) ServeConn(c net.Conn) {
	c = withDeadlines(c)
	defer c.Close()
	if !s.track(c) {
		writeRaw(c, http.StatusServiceUnavailable, "Triad egress: too many connections from this sandbox are open; close some", "")
		return
	}
	defer s.untrack(c)
	serveHTTP(c, http.HandlerFunc(s.handle))
}

// serveHTTP runs an HTTP/1.1 server over one connection and returns when
// the connection has ended, hijacked handlers included.
func serveHTTP(c net.Conn, h http.Handler) {
	l := &oneConn{ch: make(chan net.Conn, 1), closed: make(chan struct{})}
	l.ch <- c
	var handlers sync.WaitGroup
	srv := &http.Server{
		// A handler is counted before it can hijack, and Serve returns
		// only after a hijack or the connection's close, so Wait below
		// waits for every handler.
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			h.ServeHTTP(w, r)
		}),
		ErrorLog: log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				l.Close()
			}
		},
		MaxHeaderBytes: 1 << 20,
	}
	_ = srv.Serve(l)
	handlers.Wait()
}

// oneConn is a listener that accepts one connection, then waits until
// closed.
type oneConn struct {
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *oneConn) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return helloAddr{} }

// handle is the proxy's HTTP handler.
func (s *Session) handle(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		s.connect(w, r)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		host, port, f := target(r.URL.Host, 80)
		rec := s.begin(KindHTTP, orRaw(host, r.URL.Hostname()), port, r.Method, r.URL.String())
		if f != nil {
			rec.refuse(f)
			refuseHTTP(w, f)
			return
		}
		s.forward(w, r, rec, host, port, false)
	default:
		rec := s.begin(KindHTTP, r.Host, 0, r.Method, r.URL.String())
		f := &refusal{code: CodeBadRequest, reason: "this is Triad's egress proxy: send http:// requests in absolute form, and https:// through CONNECT (set HTTP_PROXY and HTTPS_PROXY)"}
		rec.refuse(f)
		refuseHTTP(w, f)
	}
}

// target splits and validates a request's host:port.
func target(hostport string, defPort int) (string, int, *refusal) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		host, ps = strings.Trim(hostport, "[]"), ""
	}
	port := defPort
	if ps != "" {
		p, err := strconv.Atoi(ps)
		if err != nil || p < 1 || p > 65535 {
			return host, 0, &refusal{code: CodeBadRequest, reason: fmt.Sprintf("%q names no valid port", hostport)}
		}
		port = p
	}
	h, err := NormalizeHost(host)
	if err != nil {
		if _, perr := netip.ParseAddr(strings.Trim(host, "[]")); perr == nil || strings.Contains(err.Error(), "IP address") {
			return host, port, &refusal{code: CodeIPLiteral, reason: fmt.Sprintf("%s is an IP address: egress is allowed by name only", host)}
		}
		return host, port, &refusal{code: CodeBadRequest, reason: err.Error()}
	}
	return h, port, nil
}

func orRaw(host, raw string) string {
	if host != "" {
		return host
	}
	return raw
}

func tunnelURL(host string, port int) string {
	if port == 443 {
		return "https://" + host + "/"
	}
	return "https://" + host + ":" + strconv.Itoa(port) + "/"
}

// connect serves a CONNECT: a tunnel passed through by host and SNI, or
// an intercepted one when the policy adds secrets or checks methods.
func (s *Session) connect(w http.ResponseWriter, r *http.Request) {
	host, port, f := target(r.Host, 443)
	rec := s.begin(KindTunnel, host, port, "", "")
	if f != nil {
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	rec.set(func(c *wire.Connection) { c.URL = tunnelURL(host, port) })
	d := s.pol.check(host, port, "")
	if !d.ok {
		f := &refusal{code: d.code, reason: d.reason}
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	if d.intercept {
		s.intercept(w, r, rec, host, port)
		return
	}
	if f := rec.admit(); f != nil {
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	up, f := s.dial(r.Context(), rec, host, port)
	if f != nil {
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	defer up.Close()
	client, err := hijack(w)
	if err != nil {
		rec.finish(wire.VerdictFailed, CodeBadRequest, "the sandbox's connection could not be taken over: "+err.Error())
		return
	}
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		rec.finish(wire.VerdictFailed, CodeUpstream, "the sandbox hung up")
		return
	}
	sni, hello, ok := peekHello(client)
	if !ok {
		rec.finish(wire.VerdictDenied, CodeTLS, fmt.Sprintf("the tunnel to %s:%d did not start with a TLS ClientHello: only TLS passes through a tunnel", host, port))
		return
	}
	if n, err := NormalizeHost(sni); err != nil || n != host {
		rec.finish(wire.VerdictDenied, CodeTLS, fmt.Sprintf("the TLS SNI %q does not match the CONNECT host %s", sni, host))
		return
	}
	if _, err := up.Write(hello); err != nil {
		rec.finish(wire.VerdictFailed, CodeUpstream, fmt.Sprintf("%s:%d hung up: %v", host, port, err))
		return
	}
	splice(client, up)
	rec.finish(wire.VerdictAllowed, CodeAllowed, d.reason)
}

// intercept terminates the sandbox's TLS with the run's CA and forwards
// each request inside to the real server, adding the policy's secrets and
// checking its methods. The tunnel itself is not a record: each request
// is, with its own upstream connection.
func (s *Session) intercept(w http.ResponseWriter, r *http.Request, rec *rec, host string, port int) {
	client, err := hijack(w)
	if err != nil {
		rec.finish(wire.VerdictFailed, CodeBadRequest, "the sandbox's connection could not be taken over: "+err.Error())
		return
	}
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		rec.finish(wire.VerdictFailed, CodeUpstream, "the sandbox hung up")
		return
	}
	tc := tls.Server(client, s.sandboxTLS(host))
	if err := tc.HandshakeContext(r.Context()); err != nil {
		rec.finish(wire.VerdictDenied, CodeTLS, fmt.Sprintf("TLS with the sandbox for %s failed (the run's CA terminates it, to add a secret or check methods; the kernel must trust that CA): %v", host, err))
		return
	}
	rec.discard()
	serveHTTP(tc, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		url := strings.TrimSuffix(tunnelURL(host, port), "/") + r.URL.RequestURI()
		rec := s.begin(KindIntercepted, host, port, r.Method, url)
		if h, _, f := target(r.Host, port); f != nil || h != host {
			f := &refusal{code: CodeTLS, reason: fmt.Sprintf("the request's Host %q is not the tunnel's host %s", r.Host, host)}
			rec.refuse(f)
			refuseHTTP(w, f)
			return
		}
		s.forward(w, r, rec, host, port, true)
	}))
}

// discard drops a record that stands for nothing the run should see (an
// intercepted tunnel, whose requests are recorded instead).
func (r *rec) discard() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r.done = true
	for i, x := range s.recs {
		if x == r {
			s.recs = append(s.recs[:i], s.recs[i+1:]...)
			break
		}
	}
}

// forward sends one HTTP request upstream and its response back: plain
// HTTP, or a request inside an intercepted tunnel (secure).
func (s *Session) forward(w http.ResponseWriter, r *http.Request, rec *rec, host string, port int, secure bool) {
	d := s.pol.check(host, port, r.Method)
	if !d.ok {
		f := &refusal{code: d.code, reason: d.reason}
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	if f := rec.admit(); f != nil {
		rec.refuse(f)
		refuseHTTP(w, f)
		return
	}
	var secrets []Secret
	if secure {
		// Secrets go only over TLS to the named host; a plain HTTP
		// request to it goes without them.
		secrets = s.pol.secretsFor(host)
	}
	var injected []string
	for _, sec := range secrets {
		injected = append(injected, sec.Header)
	}
	hostport := net.JoinHostPort(host, strconv.Itoa(port))
	scheme := "http"
	if secure {
		scheme = "https"
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 1 << 20,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, f := s.dial(ctx, rec, host, port)
			if f != nil {
				return nil, f
			}
			return c, nil
		},
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, f := s.dial(ctx, rec, host, port)
			if f != nil {
				return nil, f
			}
			tc := tls.Client(c, s.upstreamTLS(host))
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, &refusal{code: CodeUpstream, reason: fmt.Sprintf("TLS with %s failed: %v", hostport, err)}
			}
			return tc, nil
		},
	}
	defer tr.CloseIdleConnections()
	var failed bool
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = scheme, hostport
			pr.Out.Host = hostport
			if port == 80 && !secure || port == 443 && secure {
				pr.Out.Host = host
			}
			for _, sec := range secrets {
				pr.Out.Header.Set(sec.Header, sec.Value)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ModifyResponse: func(resp *http.Response) error {
			rec.set(func(c *wire.Connection) { c.Status = resp.StatusCode })
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			failed = true
			var f *refusal
			if !errors.As(err, &f) {
				f = &refusal{code: CodeUpstream, reason: fmt.Sprintf("%s failed: %v", hostport, err)}
			}
			rec.refuse(f)
			refuseHTTP(w, f)
		},
	}
	rec.set(func(c *wire.Connection) { c.Injected = injected })
	rp.ServeHTTP(w, r)
	if !failed {
		reason := d.reason
		if len(injected) > 0 {
			reason += "; added " + strings.Join(injected, ", ")
		}
		rec.finish(wire.VerdictAllowed, CodeAllowed, reason)
	}
}

// hijack takes over the sandbox's connection, with whatever the server
// had buffered from it.
func hijack(w http.ResponseWriter) (net.Conn, error) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, err
	}
	if brw.Reader.Buffered() > 0 {
		return &bufConn{Conn: c, r: brw.Reader}, nil
	}
	return c, nil
}

// bufConn reads what a server buffered before the connection itself.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufConn) CloseWrite() error { return closeWrite(c.Conn) }

// refuseHTTP answers a refused request with a status whose reason phrase
// says why, so that the error a client raises in the cell (urllib3's
// "Tunnel connection failed: 403 …", requests' HTTPError) explains itself,
// and closes the connection.
func refuseHTTP(w http.ResponseWriter, f *refusal) {
	status := http.StatusForbidden
	switch f.code {
	case CodeUpstream, CodeDNS:
		status = http.StatusBadGateway
	case CodeBadRequest:
		status = http.StatusBadRequest
	case CodeLimit:
		status = http.StatusTooManyRequests
	}
	verdict := "denied"
	if status == http.StatusBadGateway {
		verdict = "failed"
	}
	c, err := hijack(w)
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Triad-Egress", verdict)
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		fmt.Fprintf(w, "Triad egress %s: %s\n", verdict, f.reason)
		return
	}
	defer c.Close()
	writeRaw(c, status, "Triad egress "+verdict+": "+f.reason, verdict)
}

// writeRaw writes a whole response and nothing more.
func writeRaw(c net.Conn, status int, msg, verdict string) {
	phrase := strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return ' '
		}
		return r
	}, msg)
	if len(phrase) > 400 {
		phrase = phrase[:400]
	}
	body := msg + "\n"
	hdr := ""
	if verdict != "" {
		hdr = "X-Triad-Egress: " + verdict + "\r\n"
	}
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		status, phrase, len(body), hdr, body)
}

// splice copies both ways until both directions end, half-closing each
// side as its source ends, and closes both on an error.
func splice(client, up net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(up, client)
	}()
	copyHalf(client, up)
	<-done
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// copyHalf copies src to dst; at src's end it half-closes dst (or closes
// it, when it cannot), and on an error closes both.
func copyHalf(dst, src net.Conn) {
	bp := bufPool.Get().(*[]byte)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *bp)
	bufPool.Put(bp)
	if err != nil {
		dst.Close()
		src.Close()
		return
	}
	if closeWrite(dst) != nil {
		dst.Close()
	}
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
