package main_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/triadhq/triad/internal/testenv"
)

// proc is a triad serve process started by a test.
type proc struct {
	cmd  *exec.Cmd
	logs *testenv.Buffer
	done chan struct{}
	err  error
}

// serve starts the real binary with args and stops it when the test ends.
func serve(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	p := &proc{cmd: cmd, logs: &testenv.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// until polls f every 50 ms until it is true or d has passed.
func until(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func status(c *http.Client, method, url, key, run string, body string) int {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if run != "" {
		req.Header.Set("X-Run-Id", run)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Secure by default: a public address with no key refuses to start and
// says how to fix it; --auth none starts and warns; loopback with no key
// runs open with one warning until `triad keys create` makes the first key.
func TestSecureDefault(t *testing.T) {
	bin := buildTriad(t)

	t.Run("public address, no key", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(freeAddr(t))
		p := serve(t, bin, "--addr", "0.0.0.0:"+port, "--data", t.TempDir(), "--sandbox", "none")
		select {
		case <-p.done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("triad serve on 0.0.0.0 with no key is still running:\n%s", p.logs)
		}
		var ee *exec.ExitError
		if p.err == nil || !asExit(p.err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("exit: got %v, want a non-zero exit", p.err)
		}
		for _, want := range []string{"refusing to serve on 0.0.0.0:" + port, "triad keys create --name NAME", "--auth none"} {
			if !strings.Contains(p.logs.String(), want) {
				t.Errorf("the message lacks %q:\n%s", want, p.logs)
			}
		}
	})

	t.Run("public address, --auth none", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(freeAddr(t))
		p := serve(t, bin, "--addr", "0.0.0.0:"+port, "--data", t.TempDir(), "--sandbox", "none", "--auth", "none")
		url := "http://127.0.0.1:" + port
		if !until(2*time.Minute, func() bool { return status(http.DefaultClient, "GET", url+"/healthz", "", "", "") == 200 }) {
			t.Fatalf("no answer:\n%s", p.logs)
		}
		if got := status(http.DefaultClient, "POST", url+"/tmp/write", "", "r-open", `{"path":"a","text":"a"}`); got != 200 {
			t.Errorf("--auth none, no key: got %d, want 200", got)
		}
		if !strings.Contains(p.logs.String(), "authentication is off (--auth none)") {
			t.Errorf("no warning that authentication is off:\n%s", p.logs)
		}
	})

	t.Run("loopback, open until the first key", func(t *testing.T) {
		data := t.TempDir()
		addr := freeAddr(t)
		p := serve(t, bin, "--addr", addr, "--data", data, "--sandbox", "none")
		url := "http://" + addr
		if !until(2*time.Minute, func() bool { return status(http.DefaultClient, "GET", url+"/healthz", "", "", "") == 200 }) {
			t.Fatalf("no answer:\n%s", p.logs)
		}
		if got := status(http.DefaultClient, "POST", url+"/tmp/write", "", "r-open", `{"path":"a","text":"a"}`); got != 200 {
			t.Fatalf("loopback with no key: got %d, want 200", got)
		}
		if n := strings.Count(p.logs.String(), "no API key exists"); n != 1 {
			t.Errorf("got %d warnings that no key exists, want 1:\n%s", n, p.logs)
		}
		key := createKey(t, bin, data, "--name", "first")
		if !until(5*time.Second, func() bool { return status(http.DefaultClient, "GET", url+"/tmp/list", "", "r-open", "") == 401 }) {
			t.Fatal("5 s after the first key, the server still answers without one")
		}
		if got := status(http.DefaultClient, "GET", url+"/tmp/list", key, "r-open", ""); got != 200 {
			t.Errorf("with the key: got %d, want 200", got)
		}
	})
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}

// triad keys: create prints the key once, list shows it with its last use
// after the server saw it, revoke makes the server refuse it within 5 s.
func TestKeysCommand(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	key := createKey(t, bin, data, "--name", "ci agent", "--tenant", "acme", "--scope", "runs,read")
	id := strings.Split(key, "_")[1]
	list := func() string {
		out, err := exec.Command(bin, "keys", "list", "--data", data).CombinedOutput()
		if err != nil {
			t.Fatalf("triad keys list: %v\n%s", err, out)
		}
		return string(out)
	}
	line := func() string {
		for _, l := range strings.Split(list(), "\n") {
			if strings.HasPrefix(l, id) {
				return l
			}
		}
		t.Fatalf("triad keys list lacks %s:\n%s", id, list())
		return ""
	}
	if l := line(); !strings.Contains(l, "ci agent") || !strings.Contains(l, "acme") || !strings.Contains(l, "runs,read") || !strings.Contains(l, "never") {
		t.Errorf("before use: %q", l)
	}
	if strings.Contains(list(), key[len(key)-52:]) {
		t.Fatal("triad keys list shows the secret")
	}
	s := launch(t, bin, data, "--sandbox", "none")
	if got := status(http.DefaultClient, "POST", s.url+"/tmp/write", key, "r-cli", `{"path":"a","text":"a"}`); got != 200 {
		t.Fatalf("with the key: %d\n%s", got, s.logs)
	}
	if l := line(); strings.Contains(l, "never") || !strings.Contains(l, "active") {
		t.Errorf("after use: %q, want a last-used time", l)
	}
	out, err := exec.Command(bin, "keys", "revoke", "--data", data, id).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "revoked key "+id) {
		t.Fatalf("triad keys revoke: %v\n%s", err, out)
	}
	if !until(5*time.Second, func() bool { return status(http.DefaultClient, "GET", s.url+"/tmp/list", key, "r-cli", "") == 401 }) {
		t.Fatal("the server still accepts the key 5 s after triad keys revoke")
	}
	if l := line(); !strings.Contains(l, "revoked") {
		t.Errorf("after revoke: %q", l)
	}
	if out, err := exec.Command(bin, "keys", "revoke", "--data", data, "nosuchkeyxyz").CombinedOutput(); err == nil {
		t.Errorf("revoking an unknown key succeeded: %s", out)
	}
}

// certificate makes a certificate for 127.0.0.1 signed by ca (or a CA
// itself when ca is nil), with the given serial.
func certificate(t *testing.T, serial int64, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "triad test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	parent, signer := tmpl, key
	if ca == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign
	} else {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	return c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// HTTPS: a client trusting the test CA gets 200 (with HSTS); after the
// files are replaced and the process gets SIGHUP, new connections see the
// new certificate.
func TestTLSAndReload(t *testing.T) {
	bin := buildTriad(t)
	ca, caKey, _, _ := certificate(t, 1, nil, nil)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	install := func(serial int64) {
		_, _, c, k := certificate(t, serial, ca, caKey)
		// Write aside and rename, as a certificate manager does.
		for path, b := range map[string][]byte{certFile: c, keyFile: k} {
			if err := os.WriteFile(path+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(100)
	addr := freeAddr(t)
	p := serve(t, bin, "--addr", addr, "--data", t.TempDir(), "--sandbox", "none", "--tls-cert", certFile, "--tls-key", keyFile)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	url := "https://" + addr
	if !until(2*time.Minute, func() bool { return status(trusting, "GET", url+"/healthz", "", "", "") == 200 }) {
		t.Fatalf("no HTTPS answer:\n%s", p.logs)
	}
	serial := func() int64 {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatalf("TLS handshake with the test CA: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 100 {
		t.Fatalf("serving serial %d, want 100", got)
	}
	resp, err := trusting.Get(url + "/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Strict-Transport-Security"), "max-age=") {
		t.Errorf("HTTPS answer: %d, HSTS %q", resp.StatusCode, resp.Header.Get("Strict-Transport-Security"))
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("a client that does not trust the test CA connected")
	}

	install(200)
	if got := serial(); got != 100 {
		t.Fatalf("the new certificate was served before SIGHUP (serial %d)", got)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !until(10*time.Second, func() bool { return serial() == 200 }) {
		t.Fatalf("after SIGHUP, still serving serial %d:\n%s", serial(), p.logs)
	}
	if status(trusting, "GET", url+"/healthz", "", "", "") != 200 {
		t.Error("no 200 over HTTPS after the reload")
	}
	// A broken file on the next SIGHUP keeps the last good certificate.
	os.WriteFile(certFile, []byte("not a certificate"), 0o600)
	p.cmd.Process.Signal(syscall.SIGHUP)
	if !until(10*time.Second, func() bool { return strings.Contains(p.logs.String(), "still serving the previous one") }) {
		t.Fatalf("no log of the failed reload:\n%s", p.logs)
	}
	if got := serial(); got != 200 {
		t.Errorf("after a failed reload: serial %d, want 200", got)
	}
}

// --metrics-addr puts /metrics on a listener of its own, in the Prometheus
// text format, and off the API's address.
func TestMetricsAddr(t *testing.T) {
	bin := buildTriad(t)
	addr, maddr := freeAddr(t), freeAddr(t)
	p := serve(t, bin, "--addr", addr, "--data", t.TempDir(), "--sandbox", "none", "--metrics-addr", maddr)
	if !until(2*time.Minute, func() bool { return status(http.DefaultClient, "GET", "http://"+addr+"/healthz", "", "", "") == 200 }) {
		t.Fatalf("no answer:\n%s", p.logs)
	}
	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics on --metrics-addr: %d, %v", resp.StatusCode, err)
	}
	if _, ok := fams["triad_http_requests_total"]; !ok {
		t.Errorf("no triad_http_requests_total after a request:\n%s", b)
	}
	if got := status(http.DefaultClient, "GET", "http://"+addr+"/metrics", "", "", ""); got != 404 {
		t.Errorf("/metrics on the API's address with --metrics-addr: got %d, want 404", got)
	}
}
