package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/wire"
)

func mustCompile(t *testing.T, p wire.EgressPolicy, secrets ...Secret) *Policy {
	t.Helper()
	pol, err := Compile(p, secrets)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func TestNormalizeHost(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"PyPI.org.":        "pypi.org",
		" files.example ":  "files.example",
		"a_b.example.com":  "a_b.example.com",
		"xn--bcher-kva.ch": "xn--bcher-kva.ch",
	} {
		got, err := NormalizeHost(in)
		if err != nil || got != want {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "198.51.100.7", "[::1]", "::1", "2130706433", "0x7f.1", "127.1", "bücher.ch", "-a.com", "a..com", "a.com:80", strings.Repeat("a", 64) + ".com"} {
		if got, err := NormalizeHost(in); err == nil {
			t.Errorf("NormalizeHost(%q) = %q, want an error", in, got)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	pol := mustCompile(t, wire.EgressPolicy{Allow: []wire.EgressRule{
		{Host: "pypi.org"},
		{Host: "*.example.com", Ports: []int{443}},
		{Host: "api.read.test", Ports: []int{443}, Methods: []string{"get", "HEAD"}},
	}}, Secret{Host: "api.secret.test", Header: "authorization", Value: "Bearer x"})
	for _, c := range []struct {
		host      string
		port      int
		method    string
		ok        bool
		code      string
		intercept bool
	}{
		{"pypi.org", 443, "", true, CodeAllowed, false},
		{"pypi.org", 80, "GET", true, CodeAllowed, false},
		{"pypi.org", 8080, "", false, CodePort, false},
		{"files.pypi.org", 443, "", false, CodeNotAllowed, false},
		{"a.example.com", 443, "", true, CodeAllowed, false},
		{"a.b.example.com", 443, "", true, CodeAllowed, false},
		{"example.com", 443, "", false, CodeNotAllowed, false},
		{"a.example.com", 80, "", false, CodePort, false},
		{"api.read.test", 443, "", true, CodeAllowed, true},
		{"api.read.test", 443, "GET", true, CodeAllowed, true},
		{"api.read.test", 443, "POST", false, CodeMethod, false},
		{"api.secret.test", 443, "", false, CodeNotAllowed, false}, // a secret alone allows nothing
	} {
		d := pol.check(c.host, c.port, c.method)
		if d.ok != c.ok || d.code != c.code || d.intercept != c.intercept {
			t.Errorf("check(%s, %d, %q) = ok %v code %s intercept %v (%s); want ok %v code %s intercept %v",
				c.host, c.port, c.method, d.ok, d.code, d.intercept, d.reason, c.ok, c.code, c.intercept)
		}
	}
	if d := (*Policy)(nil).check("pypi.org", 443, ""); d.ok || d.code != CodeNoPolicy {
		t.Errorf("a nil policy: got %+v, want no_policy", d)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	const value = "Bearer top-secret-value"
	pol := mustCompile(t, wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "api.test"}}}, Secret{Host: "api.test", Header: "Authorization", Value: value})
	for _, s := range []string{fmt.Sprint(pol.secrets), fmt.Sprintf("%+v", pol.secrets), fmt.Sprintf("%#v", pol.secrets), fmt.Sprintf("%+v", pol.Wire())} {
		if strings.Contains(s, "top-secret") {
			t.Errorf("a secret's value printed: %s", s)
		}
	}
	want := []wire.EgressSecret{{Host: "api.test", Header: "Authorization"}}
	if diff := cmp.Diff(want, pol.Wire().Secrets); diff != "" {
		t.Errorf("Wire().Secrets (-want +got):\n%s", diff)
	}
}

func TestCompileRefuses(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		p wire.EgressPolicy
		s []Secret
	}{
		"ip rule":         {p: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "198.51.100.7"}}}},
		"bad wildcard":    {p: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "a.*.com"}}}},
		"port":            {p: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "a.com", Ports: []int{70000}}}}},
		"method":          {p: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "a.com", Methods: []string{"CONNECT"}}}}},
		"deny":            {p: wire.EgressPolicy{Deny: []string{"nope"}}},
		"secret anywhere": {s: []Secret{{Host: "*", Header: "Authorization", Value: "x"}}},
		"secret newline":  {s: []Secret{{Host: "a.com", Header: "Authorization", Value: "x\r\nEvil: 1"}}},
		"secret header":   {s: []Secret{{Host: "a.com", Header: "Bad Header", Value: "x"}}},
	} {
		if _, err := Compile(c.p, c.s); err == nil {
			t.Errorf("%s: Compile succeeded, want an error", name)
		}
	}
}

func TestNarrow(t *testing.T) {
	t.Parallel()
	tmpl := mustCompile(t, wire.EgressPolicy{
		Allow: []wire.EgressRule{
			{Host: "pypi.org", Ports: []int{443}},
			{Host: "*.example.com"},
			{Host: "api.test", Ports: []int{443}, Methods: []string{"GET", "POST"}},
		},
		MaxBytes: 1000,
	}, Secret{Host: "api.test", Header: "Authorization", Value: "Bearer x"})
	for name, c := range map[string]struct {
		req     wire.EgressPolicy
		widen   bool
		want    wire.EgressPolicy
		outside bool
	}{
		"nothing asked keeps the template": {
			req:  wire.EgressPolicy{},
			want: tmpl.Wire(),
		},
		"empty allow reaches nothing": {
			req:  wire.EgressPolicy{Allow: []wire.EgressRule{}},
			want: wire.EgressPolicy{MaxBytes: 1000},
		},
		"a host within a wildcard": {
			req:  wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "a.example.com", Ports: []int{443}}}},
			want: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "a.example.com", Ports: []int{443}}}, MaxBytes: 1000},
		},
		"ports left out are the template's": {
			req:  wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "pypi.org"}}},
			want: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "pypi.org", Ports: []int{443}}}, MaxBytes: 1000},
		},
		"methods narrow, and the secret stays": {
			req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "api.test", Methods: []string{"get"}}}},
			want: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "api.test", Ports: []int{443}, Methods: []string{"GET"}}}, MaxBytes: 1000,
				Secrets: []wire.EgressSecret{{Host: "api.test", Header: "Authorization"}}},
		},
		"deny adds, limits shrink": {
			req: wire.EgressPolicy{Deny: []string{"198.51.100.0/24"}, MaxBytes: 10},
			want: func() wire.EgressPolicy {
				w := tmpl.Wire()
				w.Deny, w.MaxBytes = []string{"198.51.100.0/24"}, 10
				return w
			}(),
		},
		"another host":            {req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "evil.test"}}}, outside: true},
		"the apex of a wildcard":  {req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "example.com"}}}, outside: true},
		"a wider wildcard":        {req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "*"}}}, outside: true},
		"another port":            {req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "pypi.org", Ports: []int{80}}}}, outside: true},
		"another method":          {req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "api.test", Methods: []string{"DELETE"}}}}, outside: true},
		"more bytes":              {req: wire.EgressPolicy{MaxBytes: 2000}, outside: true},
		"a secret from a request": {req: wire.EgressPolicy{Secrets: []wire.EgressSecret{{Host: "api.test", Header: "X"}}}, outside: true},
		"an admin widens": {
			req: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "evil.test", Ports: []int{443}}}}, widen: true,
			want: wire.EgressPolicy{Allow: []wire.EgressRule{{Host: "evil.test", Ports: []int{443}}}, MaxBytes: 1000},
		},
	} {
		got, err := tmpl.Narrow(c.req, c.widen)
		if c.outside {
			if !errors.Is(err, ErrOutside) {
				t.Errorf("%s: got %v, want ErrOutside", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if diff := cmp.Diff(c.want, got.Wire()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}

func TestRefusedAddresses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr string
		why  string
	}{
		{"169.254.169.254", "metadata"},
		{"100.100.100.200", "metadata"},
		{"fd00:ec2::254", "metadata"},
		{"127.0.0.1", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::ffff:10.1.2.3", "private"},
		{"64:ff9b::a9fe:a9fe", "metadata"},
		{"2002:0a00:0001::1", "private"},
		{"10.1.2.3", "private"},
		{"172.20.0.1", "private"},
		{"192.168.1.1", "private"},
		{"169.254.1.1", "link-local"},
		{"fe80::1", "link-local"},
		{"fc00::1", "private"},
		{"0.0.0.0", "unspecified"},
		{"100.64.0.1", "shared"},
		{"224.0.0.1", "multicast"},
		{"198.51.100.7", ""},
		{"203.0.113.9", ""},
		{"1.1.1.1", ""},
		{"2606:4700::1111", ""},
	} {
		got := refusedWhy(netip.MustParseAddr(c.addr))
		if c.why == "" && got != "" || c.why != "" && !strings.Contains(got, c.why) {
			t.Errorf("refusedWhy(%s) = %q, want %q", c.addr, got, c.why)
		}
	}
}
