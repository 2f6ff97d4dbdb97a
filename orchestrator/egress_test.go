package orchestrator_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/egress/egresstest"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/wire"
)

// egressStack is a Docker stack whose template "net" allows the test
// hosts of an egresstest.World, with a secret for its API host, and whose
// proxy resolves their names with the World's resolver.
type egressStack struct {
	*orchestratortest.Stack
	w      *egresstest.World
	secret string
}

// netTemplate is the template the egress tests run under.
const netTemplate = "net"

func newEgressStack(t testing.TB, backend string) *egressStack {
	t.Helper()
	w := egresstest.NewWorld(t)
	var b [12]byte
	rand.Read(b[:])
	secret := "Bearer sk-egress-" + hex.EncodeToString(b[:])
	var allow []wire.EgressRule
	for _, h := range []string{egresstest.Allowed, egresstest.API, egresstest.Index, egresstest.Private, egresstest.Metadata,
		egresstest.Loopback, egresstest.Rebind, egresstest.Mixed, egresstest.Nowhere} {
		allow = append(allow, wire.EgressRule{Host: h})
	}
	pol, err := egress.Compile(wire.EgressPolicy{Allow: allow}, []egress.Secret{{Host: egresstest.API, Header: "Authorization", Value: secret}})
	if err != nil {
		t.Fatal(err)
	}
	set := template.NewSet(&template.Template{Name: netTemplate, Description: "the egress tests' hosts", Egress: pol})
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: backend, Templates: set,
		Egress:      egress.New(egress.Config{Resolver: w.Resolver, RootCAs: w.CA.Pool}),
		EgressTrust: w.CA.PEM})
	return &egressStack{Stack: s, w: w, secret: secret}
}

// newRun sets up a run with the given template and egress request.
func (s *egressStack) newRun(t testing.TB, tmpl string, eg *wire.EgressPolicy) runid.ID {
	t.Helper()
	run := runid.New()
	if err := s.Orch.Create(s.Ctx(t), run); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Orch.SetRunSetup(s.Ctx(t), run, wire.RunSetup{Template: tmpl, Egress: eg}); err != nil {
		t.Fatal(err)
	}
	return run
}

// cell runs code, which must succeed, and returns its stdout and the
// connections its step recorded.
func (s *egressStack) cell(t testing.TB, run runid.ID, code string) (string, []wire.Connection) {
	t.Helper()
	out, err := s.Orch.Exec(s.Ctx(t), run, wire.ExecRequest{Code: code, TimeoutS: ptr(300.0)})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if !out.OK {
		t.Fatalf("cell failed: %+v\nstdout: %s\nstderr: %s", out.Error, out.Stdout, out.Stderr)
	}
	tr, err := s.Trace(s.Ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	return out.Stdout, tr[len(tr)-1].Egress
}

// fetch is a cell that fetches url with requests, no proxy named: the
// kernel's environment routes it through Triad's proxy.
func fetch(url string) string {
	return fmt.Sprintf(`import requests
try:
    r = requests.get(%q, timeout=120)
    print("STATUS", r.status_code, r.text.strip())
except Exception as e:
    print("ERROR", type(e).__name__, e)
`, url)
}

// TestEgressRun is the must-show list on Docker and on
// Kubernetes, through the one orchestration path: an allowed name from
// requests and from pip; a denied name, an IP literal, a private and a
// metadata address, a rebinding name and a redirect to a denied host each
// refused with a clear error in the cell and a denied record in the
// journal; a secret that reaches its host and nothing else.
func TestEgressRun(t *testing.T) {
	for _, backend := range []string{"docker", "kube"} {
		t.Run(backend, func(t *testing.T) { testEgressRun(t, backend) })
	}
}

func testEgressRun(t *testing.T, backend string) {
	s := newEgressStack(t, backend)
	run := s.newRun(t, netTemplate, nil)

	t.Run("requests", func(t *testing.T) {
		got, conns := s.cell(t, run, fetch("https://allowed.test/hello"))
		if !strings.Contains(got, "STATUS 200 hello from allowed.test") {
			t.Fatalf("requests through the proxy: %q", got)
		}
		if len(conns) == 0 || conns[0].Host != egresstest.Allowed || conns[0].Verdict != wire.VerdictAllowed || conns[0].Received == 0 {
			t.Errorf("the step's connections: %+v, want allowed.test allowed with bytes", conns)
		}
	})

	t.Run("pip", func(t *testing.T) {
		got, conns := s.cell(t, run, `import subprocess, sys
p = subprocess.run([sys.executable, "-m", "pip", "install", "--index-url", "https://pypi.test/simple", "triad_egress_probe"], capture_output=True, text=True)
print(p.returncode, p.stdout[-400:], p.stderr[-800:])
import triad_egress_probe
print("PROBE", triad_egress_probe.PROBE)`)
		if !strings.Contains(got, "PROBE fetched") {
			t.Fatalf("pip install from the test index: %s", got)
		}
		var sawIndex bool
		for _, c := range conns {
			sawIndex = sawIndex || c.Host == egresstest.Index && c.Verdict == wire.VerdictAllowed
		}
		if !sawIndex {
			t.Errorf("the pip step's connections %+v do not show pypi.test", conns)
		}
	})

	ip := s.w.Public.Addr.String()
	for _, tc := range []struct{ name, url, says string }{
		{"denied name", "https://denied.test/", "denied.test is not allowed by this run's egress policy"},
		{"ip literal", "https://" + ip + "/", ip + " is an IP address"},
		{"private address", "https://private.test/", "a private address"},
		{"metadata address", "https://metadata.test/", "a cloud metadata address"},
		{"redirect to a denied host", "https://allowed.test/redirect?to=https://denied.test/", "denied.test is not allowed"},
		{"rebinding", "https://rebind.test/", "a private address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := fetch(tc.url)
			if tc.name == "rebinding" {
				// The first lookup answers the public address: that
				// connection is allowed and goes there; the second answers
				// the private one, and is refused.
				code = fetch(tc.url) + fetch(tc.url)
			}
			got, conns := s.cell(t, run, code)
			if !strings.Contains(got, "ERROR ProxyError") || !strings.Contains(got, tc.says) {
				t.Errorf("the cell saw %q, want a ProxyError saying %q", got, tc.says)
			}
			last := conns[len(conns)-1]
			if last.Verdict != wire.VerdictDenied || !strings.Contains(last.Reason, tc.says) {
				t.Errorf("the step's last connection %+v, want denied saying %q", last, tc.says)
			}
		})
	}
	if n := s.w.PrivateHits.Load(); n != 0 {
		t.Errorf("the private host served %d request(s)", n)
	}

	t.Run("secret", func(t *testing.T) {
		got, conns := s.cell(t, run, fetch("https://api.test"+egresstest.SecretPath))
		if !strings.Contains(got, "authorization present: True") && !strings.Contains(got, "authorization present: true") {
			t.Fatalf("the secret did not reach api.test: %q", got)
		}
		// (A connection of an earlier cell that ended since may be
		// recorded in this step too.)
		var api []wire.Connection
		for _, c := range conns {
			if c.Host == egresstest.API {
				api = append(api, c)
			}
		}
		if len(api) != 1 || api[0].Kind != egress.KindIntercepted || len(api[0].Injected) != 1 || api[0].Injected[0] != "Authorization" {
			t.Errorf("connections %+v, want one intercepted request to api.test with Authorization injected", conns)
		}
		// Nowhere in the kernel: its environment, its files, any
		// process's environment or command line.
		needle := s.secret[len("Bearer "):]
		got, _ = s.cell(t, run, fmt.Sprintf(`import os
needle = %q.encode()
found = []
if any(needle in (k + "=" + v).encode() for k, v in os.environ.items()):
    found.append("os.environ")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("environ", "cmdline"):
            try:
                if needle in open("/proc/%%s/%%s" %% (pid, f), "rb").read():
                    found.append("/proc/%%s/%%s" %% (pid, f))
            except OSError:
                pass
for top in ("/tmp", "/work", "/run", "/etc", "/opt", "/home", "/root", "/var"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and needle in open(p, "rb").read():
                    found.append(p)
            except OSError:
                pass
print("FOUND", found)`, needle))
		if !strings.Contains(got, "FOUND []") {
			t.Errorf("the secret is in the kernel: %s", got)
		}
		// Nowhere in the journal or any answer about the run.
		for _, p := range []string{"CEL.md", "trace.jsonl", "run.setup.json"} {
			b, _, err := s.Store.ReadAll(s.Ctx(t), run, p)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), needle) {
				t.Errorf("%s holds the secret", p)
			}
		}
		view, err := s.Orch.Status(s.Ctx(t), run)
		if err != nil {
			t.Fatal(err)
		}
		rr, err := s.Orch.ReadRun(s.Ctx(t), run)
		if err != nil {
			t.Fatal(err)
		}
		setup, _, err := rr.Setup(s.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]any{"GET /runs/{id}": view, "run setup": setup, "templates": s.Orch.Offer().Templates} {
			b, _ := json.Marshal(v)
			if strings.Contains(string(b), needle) {
				t.Errorf("%s holds the secret: %s", name, b)
			}
		}
		if view.Template != netTemplate || view.Egress == nil || len(view.Egress.Secrets) != 1 || view.Egress.Secrets[0].Header != "Authorization" {
			t.Errorf("GET /runs/{id}: template %q egress %+v, want %s with the secret named", view.Template, view.Egress, netTemplate)
		}
	})

	// The run's usage counts the bytes its egress moved: what its
	// connections' records say, each counted once (a connection still
	// open at its last record has moved at least that).
	tr, err := s.Trace(s.Ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]wire.Connection{}
	for _, rec := range tr {
		for _, c := range rec.Egress {
			last[c.ID] = c
		}
	}
	var sent, received int64
	open := false
	for _, c := range last {
		sent, received, open = sent+c.Sent, received+c.Received, open || c.Open
	}
	view, err := s.Orch.Status(s.Ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("connections' records: %d bytes out, %d in (one still open: %v); usage: %v out, %v in", sent, received, open, ptrVal(view.Usage.EgressBytesOut), ptrVal(view.Usage.EgressBytesIn))
	if u := view.Usage; u == nil || u.EgressBytesOut == nil || u.EgressBytesIn == nil || received == 0 ||
		*u.EgressBytesOut < sent || *u.EgressBytesIn < received || !open && (*u.EgressBytesOut != sent || *u.EgressBytesIn != received) {
		t.Errorf("usage %+v, want egress of %d bytes out and %d in, as its connections' records", u, sent, received)
	}

	// The journal lists the connections in the steps that made them.
	b, _, err := s.Store.ReadAll(s.Ctx(t), run, "CEL.md")
	if err != nil {
		t.Fatal(err)
	}
	cel := string(b)
	for _, want := range []string{"template `net`", "**Egress:** allowed", "**Network:**", "allowed: https://allowed.test/", "denied: https://denied.test/ — denied.test is not allowed",
		"denied: https://169.254.169.254/", "the proxy adds Authorization for api.test"} {
		if !strings.Contains(cel, want) && !(want == "denied: https://169.254.169.254/" && strings.Contains(cel, "denied: https://metadata.test/")) {
			t.Errorf("CEL.md lacks %q", want)
		}
	}
}

// TestEgressNoPolicy: a run without an egress policy reaches nothing,
// exactly as without the proxy: no proxy in its environment, names do not
// resolve, no connection is recorded.
func TestEgressNoPolicy(t *testing.T) {
	for _, backend := range []string{"docker", "kube"} {
		t.Run(backend, func(t *testing.T) { testEgressNoPolicy(t, backend) })
	}
}

func testEgressNoPolicy(t *testing.T, backend string) {
	s := newEgressStack(t, backend)
	run := s.newRun(t, "", nil)
	got, conns := s.cell(t, run, `import os, socket
print("PROXY", os.environ.get("HTTPS_PROXY"))
`+fetch("https://allowed.test/")+`
try:
    socket.create_connection(("`+s.w.Public.Addr.String()+`", 443), timeout=10)
    print("CONNECTED")
except OSError as e:
    print("SOCKET", e)`)
	if !strings.Contains(got, "PROXY None") || !strings.Contains(got, "ERROR ConnectionError") || strings.Contains(got, "CONNECTED") {
		t.Errorf("a run without egress: %s", got)
	}
	if len(conns) != 0 {
		t.Errorf("connections %+v, want none", conns)
	}
}

// TestEgressChoice: an unknown template is bad input naming the templates
// there are; a request beyond the template's policy is forbidden; one
// within narrows it, and the narrowed run is refused what it left out.
func TestEgressChoice(t *testing.T) {
	s := newEgressStack(t, "docker")
	fresh := func() runid.ID {
		run := runid.New()
		if err := s.Orch.Create(s.Ctx(t), run); err != nil {
			t.Fatal(err)
		}
		return run
	}
	_, err := s.Orch.SetRunSetup(s.Ctx(t), fresh(), wire.RunSetup{Template: "nope"})
	if fe := fault.As(err); fe == nil || fe.Kind != fault.BadInput || !strings.Contains(fe.Suggestion, "default, net") {
		t.Errorf("unknown template: %v, want bad input naming default and net", err)
	}
	_, err = s.Orch.SetRunSetup(s.Ctx(t), fresh(), wire.RunSetup{Template: netTemplate, Egress: &wire.EgressPolicy{Allow: []wire.EgressRule{{Host: egresstest.Denied}}}})
	if fe := fault.As(err); fe == nil || fe.Kind != fault.Forbidden || !errors.Is(err, egress.ErrOutside) {
		t.Errorf("beyond the template: %v, want forbidden", err)
	}
	run := s.newRun(t, netTemplate, &wire.EgressPolicy{Allow: []wire.EgressRule{{Host: egresstest.API, Ports: []int{443}}}})
	got, _ := s.cell(t, run, fetch("https://allowed.test/"))
	if !strings.Contains(got, "allowed.test is not allowed") {
		t.Errorf("a narrowed run reached allowed.test: %s", got)
	}
}

func ptrVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
