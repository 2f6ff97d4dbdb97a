package api_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// burn is a cell that does a fixed amount of work, keeps 200 MB (every
// page written), and prints the CPU time the work took as the sandbox
// sees it. Under gVisor that is the sandbox's own estimate, which a
// loaded host can inflate well past what the host's cgroup counts for the
// container, so the test asks only for a clear fraction of it.
const burn = `import time
t0 = time.process_time()
x = 0
for i in range(4_000_000):
    x += i * i
keep = b'x' * (200 << 20)
print(time.process_time() - t0)`

// usageOf is a run's usage as GET /runs/{id} reports it.
func (c *client) usageOf(run string) wire.RunUsage {
	c.t.Helper()
	var v wire.RunView
	c.do("GET", "/runs/"+run, "", nil).json(c.t, &v)
	if v.Usage == nil {
		c.t.Fatalf("GET /runs/%s has no usage", run)
	}
	return *v.Usage
}

// burnCPU runs burn in run and returns the process's CPU seconds.
func (c *client) burnCPU(run string) float64 {
	c.t.Helper()
	out, a := c.exec(run, map[string]any{"code": burn})
	if !out.OK {
		c.t.Fatalf("burn: %d %s", a.status, a.body)
	}
	p, err := strconv.ParseFloat(strings.TrimSpace(out.Stdout), 64)
	if err != nil {
		c.t.Fatalf("burn printed %q", out.Stdout)
	}
	return p
}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// Issue 27, what each run cost, on the Docker backend: a run's CPU time,
// peak and time-integrated memory, stored bytes and egress are kept with
// the run and served by GET /runs/{id} and GET /runs; a kernel restart
// neither resets nor double counts its CPU; GET /usage sums the tenant's
// runs and no other tenant's, which cannot read them; /metrics has the
// tenant's series.
func TestRunUsage(t *testing.T) {
	m := metrics.New()
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Metrics: m, InterruptGrace: 30 * time.Second})
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Keys: s.Keys, Metrics: m, MetricsHandler: m.Handler()})
	const run, run2 = "r-usage-one", "r-usage-two"

	c.write(run, "notes.txt", strings.Repeat("a line of notes\n", 100))
	if out, a := c.exec(run, map[string]any{"code": "started = True"}); !out.OK {
		t.Fatalf("first cell: %d %s", a.status, a.body)
	}
	u0 := c.usageOf(run) // the kernel's boot and a cell
	if u0.CPUSeconds == nil || *u0.CPUSeconds <= 0 {
		t.Fatalf("cpu_seconds after the first cell: %v, want some", u0.CPUSeconds)
	}
	p1 := c.burnCPU(run)
	u1 := c.usageOf(run)
	if u1.CPUSeconds == nil || *u1.CPUSeconds-*u0.CPUSeconds < 0.3*p1 {
		t.Errorf("cpu_seconds went from %v to %v over the work, want at least 30%% of the %.2f s it took", *u0.CPUSeconds, u1.CPUSeconds, p1)
	}
	if u1.MemoryPeakBytes == nil || *u1.MemoryPeakBytes < 200<<20 {
		t.Errorf("memory_peak_bytes %v, want at least the 200 MB the cell keeps", u1.MemoryPeakBytes)
	}
	if u1.MemoryByteSeconds == nil || *u1.MemoryByteSeconds <= 0 {
		t.Errorf("memory_byte_seconds %v, want some", u1.MemoryByteSeconds)
	}
	if u1.EgressBytesOut == nil || *u1.EgressBytesOut != 0 || u1.EgressBytesIn == nil || *u1.EgressBytesIn != 0 {
		t.Errorf("egress %v out, %v in; want 0 each (the run reaches nothing)", u1.EgressBytesOut, u1.EgressBytesIn)
	}
	var files wire.RunFiles
	c.do("GET", "/runs/"+run+"/files", "", nil).json(t, &files)
	var sum int64
	for _, f := range files.Files {
		sum += f.Size
	}
	if u1.StoredBytes != sum || sum == 0 {
		t.Errorf("stored_bytes %d, want the sum of the run's %d files' sizes, %d", u1.StoredBytes, len(files.Files), sum)
	}

	// A restart starts the container's count again: what it used before
	// stays counted, once.
	if a := c.do("POST", "/sandbox/restart", run, nil); a.status != 200 {
		t.Fatalf("restart: %d %s", a.status, a.body)
	}
	p2 := c.burnCPU(run)
	u2 := c.usageOf(run)
	var kl wire.KernelList
	c.do("GET", "/kernels", "", nil).json(t, &kl)
	if len(kl.Kernels) != 1 || kl.Kernels[0].CPUSeconds == nil {
		t.Fatalf("GET /kernels: %+v, want the run's kernel with its CPU time", kl)
	}
	since := *kl.Kernels[0].CPUSeconds // the restarted kernel's own count
	t.Logf("the work took %.2f s and %.2f s as the sandbox sees it; usage %s, after the work %s, after the restart and the work again %s; the restarted kernel's count %.2f s",
		p1, p2, show(u0), show(u1), show(u2), since)
	grew := *u2.CPUSeconds - *u1.CPUSeconds
	if grew < 0.3*p2 {
		t.Errorf("cpu_seconds grew by %.2f s across the restart and a second burn, want at least 30%% of the %.2f s the work took", grew, p2)
	}
	// Counting the first kernel's time again would add all of u1.
	if grew > since+0.5**u1.CPUSeconds {
		t.Errorf("cpu_seconds grew by %.2f s, more than the restarted kernel's %.2f s and a little: counted twice", grew, since)
	}
	if *u2.MemoryByteSeconds <= *u1.MemoryByteSeconds {
		t.Errorf("memory_byte_seconds went from %v to %v, want more", *u1.MemoryByteSeconds, *u2.MemoryByteSeconds)
	}

	// Another tenant's run is its own: not in this tenant's sums, and
	// this tenant's runs and sums are not its to read.
	other := c.as(c.newKey("globex", auth.Runs))
	if out, a := other.exec("r-usage-globex", map[string]any{"code": "print(1)"}); !out.OK {
		t.Fatalf("globex's cell: %d %s", a.status, a.body)
	}
	if a := other.do("GET", "/runs/"+run, "", nil); a.status != 404 {
		t.Errorf("another tenant's GET /runs/%s: %d, want 404", run, a.status)
	}
	if a := other.do("GET", "/usage?tenant=acme", "", nil); a.status != 403 {
		t.Errorf("another tenant's GET /usage?tenant=acme: %d, want 403", a.status)
	}

	if out, a := c.exec(run2, map[string]any{"code": "print(2)"}); !out.OK {
		t.Fatalf("second run: %d %s", a.status, a.body)
	}
	v2 := c.usageOf(run2)
	u2 = c.usageOf(run)
	var tu wire.TenantUsage
	c.do("GET", "/usage", "", nil).json(t, &tu)
	if tu.Tenant != "acme" || !near(tu.CPUSeconds, *u2.CPUSeconds+*v2.CPUSeconds) || !near(tu.MemoryByteSeconds, *u2.MemoryByteSeconds+*v2.MemoryByteSeconds) ||
		tu.StoredBytes != u2.StoredBytes+v2.StoredBytes || tu.EgressBytesOut != 0 || tu.EgressBytesIn != 0 {
		t.Errorf("GET /usage: got %+v, want the sums of its two runs' %+v and %+v", tu, u2, v2)
	}
	var gu wire.TenantUsage
	other.do("GET", "/usage", "", nil).json(t, &gu)
	if gu.Tenant != "globex" || gu.CPUSeconds <= 0 || gu.CPUSeconds >= tu.CPUSeconds {
		t.Errorf("globex's GET /usage: got %+v, want its own one small cell", gu)
	}

	// GET /runs lists each run with the usage GET /runs/{id} has.
	var list wire.RunList
	c.do("GET", "/runs", "", nil).json(t, &list)
	got := map[string]wire.RunUsage{}
	for _, r := range list.Runs {
		if r.Usage != nil {
			got[r.RunID] = *r.Usage
		}
	}
	for id, want := range map[string]wire.RunUsage{run: u2, run2: v2} {
		g, ok := got[id]
		if !ok || g.CPUSeconds == nil || !near(*g.CPUSeconds, *want.CPUSeconds) || *g.MemoryPeakBytes != *want.MemoryPeakBytes || g.StoredBytes != want.StoredBytes {
			t.Errorf("GET /runs lists %s with usage %s, want %s", id, show(g), show(want))
		}
	}

	// /metrics: the tenants' series, by tenant, never by run.
	after, _ := scrape(t, c)
	if got := after.sum("triad_tenant_cpu_seconds_total", "tenant=acme"); !near(got, tu.CPUSeconds) {
		t.Errorf("triad_tenant_cpu_seconds_total{tenant=acme} = %v, want GET /usage's %v", got, tu.CPUSeconds)
	}
	if got := after.sum("triad_tenant_memory_byte_seconds_total", "tenant=acme"); !near(got, tu.MemoryByteSeconds) {
		t.Errorf("triad_tenant_memory_byte_seconds_total{tenant=acme} = %v, want GET /usage's %v", got, tu.MemoryByteSeconds)
	}
	if got := after.sum("triad_tenant_stored_bytes", "tenant=acme"); got != float64(tu.StoredBytes) {
		t.Errorf("triad_tenant_stored_bytes{tenant=acme} = %v, want GET /usage's %d", got, tu.StoredBytes)
	}
	if _, ok := after[`triad_tenant_egress_bytes_total{direction=out,tenant=acme}`]; !ok {
		t.Errorf("no triad_tenant_egress_bytes_total series for acme")
	}
	if got := after.sum("triad_tenant_cpu_seconds_total", "tenant=globex"); !near(got, gu.CPUSeconds) {
		t.Errorf("triad_tenant_cpu_seconds_total{tenant=globex} = %v, want its GET /usage's %v", got, gu.CPUSeconds)
	}
	for k := range after {
		if strings.Contains(k, "r-usage") {
			t.Errorf("series %s names a run", k)
		}
	}
}

// On wasm the backend measures the interpreter's memory but not its CPU
// time: cpu_seconds is absent (unknown), never 0, and the rest is there.
func TestRunUsageWasm(t *testing.T) {
	t.Parallel()
	c := sandboxServer(t, "wasm")
	const run = "r-usage-wasm"
	if out, a := c.exec(run, map[string]any{"code": "keep = bytearray(8 << 20)\nopen('out.txt', 'w').write('kept')"}); !out.OK {
		t.Fatalf("cell: %d %s", a.status, a.body)
	}
	a := c.do("GET", "/runs/"+run, "", nil)
	if strings.Contains(string(a.body), `"cpu_seconds"`) {
		t.Errorf("GET /runs/%s reports cpu_seconds on wasm, which does not measure it: %s", run, a.body)
	}
	u := c.usageOf(run)
	if u.MemoryPeakBytes == nil || *u.MemoryPeakBytes < 8<<20 || u.MemoryByteSeconds == nil {
		t.Errorf("memory: peak %v, %v byte-seconds; want the interpreter's, at least 8 MiB", u.MemoryPeakBytes, u.MemoryByteSeconds)
	}
	var files wire.RunFiles
	c.do("GET", "/runs/"+run+"/files", "", nil).json(t, &files)
	var sum int64
	for _, f := range files.Files {
		sum += f.Size
	}
	if u.StoredBytes != sum || sum == 0 {
		t.Errorf("stored_bytes %d, want the sum of the run's files' sizes, %d", u.StoredBytes, sum)
	}
}

// show prints a usage's known figures.
func show(u wire.RunUsage) string {
	f := func(p *float64) string {
		if p == nil {
			return "?"
		}
		return fmt.Sprint(*p)
	}
	peak := "?"
	if u.MemoryPeakBytes != nil {
		peak = fmt.Sprint(*u.MemoryPeakBytes)
	}
	return fmt.Sprintf("{cpu %s s, peak %s B, %s B·s, stored %d B}", f(u.CPUSeconds), peak, f(u.MemoryByteSeconds), u.StoredBytes)
}
