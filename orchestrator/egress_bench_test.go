package orchestrator_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/triadhq/triad/egress/egresstest"
)

// egressProbe downloads big and fetches small (a new connection each
// time) reps times, and prints the median time of each as JSON. The same
// script runs in a kernel, through Triad's egress proxy (its environment
// names the proxy and the CA bundle), and on the host, straight to the test
// host (names mapped to its address, since the host has no DNS for them).
const egressProbe = `import json, os, socket, ssl, statistics, time, urllib.request
def _probe(big, small, reps, names):
    if names:
        real = socket.getaddrinfo
        socket.getaddrinfo = lambda host, *a, **k: real(names.get(host, host), *a, **k)
    ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
    def get(url):
        t0 = time.perf_counter()
        n = 0
        with urllib.request.urlopen(url, context=ctx, timeout=600) as r:
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                n += len(b)
        return time.perf_counter() - t0, n
    get(small)
    dl = [get(big) for _ in range(reps)]
    sm = [get(small)[0] for _ in range(3 * reps)]
    print("PROBE " + json.dumps({"download_s": statistics.median(d for d, _ in dl), "bytes": dl[0][1], "setup_s": statistics.median(sm)}))
`

type probe struct {
	DownloadS float64 `json:"download_s"`
	Bytes     int64   `json:"bytes"`
	SetupS    float64 `json:"setup_s"`
}

func parseProbe(b testing.TB, out string) probe {
	b.Helper()
	_, j, ok := strings.Cut(out, "PROBE ")
	var p probe
	if !ok || json.Unmarshal([]byte(strings.TrimSpace(j)), &p) != nil {
		b.Fatalf("probe: %s", out)
	}
	return p
}

// BenchmarkEgress measures the egress proxy against the host itself, in
// the same run: a 10 MB HTTPS download from a test host through the proxy
// (from a kernel, over the relay, passed through by SNI) against the same
// download from the host straight to the test host; and a new connection's
// setup (a small HTTPS GET on a fresh connection) both ways. It reports
// each side's median and their ratios (throughput: proxy / direct, the
// goal ≥ 0.8; setup: proxy / direct, times slower).
//
//	go test -run XXX -bench Egress -benchtime 3x ./orchestrator
func BenchmarkEgress(b *testing.B) {
	for _, backend := range []string{"docker", "kube"} {
		b.Run(backend, func(b *testing.B) {
			s := newEgressStack(b, backend)
			run := s.newRun(b, netTemplate, nil)
			const size = 10 << 20
			big := fmt.Sprintf("https://%s/bytes?n=%d", egresstest.Allowed, size)
			small := "https://" + egresstest.Allowed + "/"
			const reps = 5
			ca := filepath.Join(b.TempDir(), "ca.pem")
			if err := os.WriteFile(ca, s.w.CA.PEM, 0o644); err != nil {
				b.Fatal(err)
			}
			names, _ := json.Marshal(map[string]string{egresstest.Allowed: s.w.Public.Addr.String()})
			call := fmt.Sprintf("_probe(%q, %q, %d, %s)", big, small, reps, names)
			var proxied, direct []probe
			for b.Loop() {
				out, _ := s.cell(b, run, egressProbe+fmt.Sprintf("_probe(%q, %q, %d, {})", big, small, reps))
				proxied = append(proxied, parseProbe(b, out))
				cmd := exec.Command("python3", "-c", egressProbe+call)
				cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "SSL_CERT_FILE=" + ca}
				o, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("probe on the host: %v: %s", err, o)
				}
				direct = append(direct, parseProbe(b, string(o)))
			}
			med := func(ps []probe, f func(probe) float64) float64 {
				v := make([]float64, len(ps))
				for i, p := range ps {
					v[i] = f(p)
				}
				sort.Float64s(v)
				return v[len(v)/2]
			}
			pd, dd := med(proxied, func(p probe) float64 { return p.DownloadS }), med(direct, func(p probe) float64 { return p.DownloadS })
			ps, ds := med(proxied, func(p probe) float64 { return p.SetupS }), med(direct, func(p probe) float64 { return p.SetupS })
			if proxied[0].Bytes != size || direct[0].Bytes != size {
				b.Fatalf("downloaded %d and %d bytes, want %d", proxied[0].Bytes, direct[0].Bytes, size)
			}
			b.ReportMetric(float64(size)/pd/1e6, "proxy_MB/s")
			b.ReportMetric(float64(size)/dd/1e6, "direct_MB/s")
			b.ReportMetric(dd/pd, "throughput_ratio")
			b.ReportMetric(ps*1000, "proxy_setup_ms")
			b.ReportMetric(ds*1000, "direct_setup_ms")
			b.ReportMetric(ps/ds, "setup_ratio")
		})
	}
}
