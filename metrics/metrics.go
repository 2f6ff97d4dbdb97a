// Package metrics exports what Triad does as Prometheus metrics: tool calls, HTTP requests, kernels, verdicts, store operations, searches and runs.
//
// One Metrics holds every family in its own registry (no global state). It
// implements the hooks the orchestrator and the HTTP API declare
// (orchestrator.Metrics, api.Metrics), and wraps the store's seams and the
// sandbox backend to count what passes through them. Labels are small,
// fixed sets (tool names, outcomes, route templates, backends, and the
// tenants of the usage families): never a run id, a path or a key, so the
// number of series stays bounded however many runs there are.
package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// Metrics is the set of Triad's metric families.
type Metrics struct {
	reg *prometheus.Registry

	toolCalls    *prometheus.CounterVec
	toolLatency  *prometheus.HistogramVec
	httpRequests *prometheus.CounterVec
	httpLatency  *prometheus.HistogramVec
	kernelStarts *prometheus.CounterVec
	kernelStart  *prometheus.HistogramVec
	cellsRunning prometheus.Gauge
	evaluations  *prometheus.CounterVec
	evalLatency  prometheus.Histogram
	storeOps     *prometheus.CounterVec
	storeErrors  *prometheus.CounterVec
	storeBytes   *prometheus.CounterVec
	searches     *prometheus.CounterVec
	searchErrors *prometheus.CounterVec
	runs         *prometheus.CounterVec
	quota        *prometheus.CounterVec
	reclaims     prometheus.Counter
	egressConns  *prometheus.CounterVec
	egressBytes  *prometheus.CounterVec
	egressOpen   prometheus.Gauge
	tenantCPU    *prometheus.CounterVec
	tenantMemory *prometheus.CounterVec
	tenantEgress *prometheus.CounterVec
	tenantStored *prometheus.GaugeVec
}

// New returns Metrics registered in a registry of their own, with the Go
// runtime's and the process's collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m.toolCalls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_tool_calls_total",
		Help: "Tool calls by tool and outcome (ok, or the error's kind)."}, []string{"tool", "outcome"})
	m.toolLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "triad_tool_call_duration_seconds",
		Help: "Tool call latency, journal and verdict included.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}, []string{"tool"})
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_http_requests_total",
		Help: "HTTP requests by route template, method and status."}, []string{"route", "method", "status"})
	m.httpLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "triad_http_request_duration_seconds",
		Help: "HTTP request latency by route template.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 12)}, []string{"route", "method"})
	m.kernelStarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_kernel_starts_total",
		Help: "Kernels started by backend and outcome (ok or error)."}, []string{"backend", "outcome"})
	m.kernelStart = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "triad_kernel_start_duration_seconds",
		Help: "How long a kernel takes to start and answer.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 10)}, []string{"backend"})
	m.cellsRunning = prometheus.NewGauge(prometheus.GaugeOpts{Name: "triad_cells_running", Help: "Cells running now."})
	m.evaluations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_evaluations_total",
		Help: "Evaluator verdicts: pass, fail, or ungraded (the evaluator could not answer in time; the step is graded again, and its late verdict counted as pass or fail)."}, []string{"verdict"})
	m.evalLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "triad_evaluation_duration_seconds",
		Help: "Evaluator latency per step.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10)})
	m.storeOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_store_operations_total",
		Help: "File store operations by backend and operation."}, []string{"backend", "op"})
	m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_store_errors_total",
		Help: "File store operations that failed (not-found answers excluded), by backend and operation."}, []string{"backend", "op"})
	m.storeBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_store_bytes_total",
		Help: "Bytes written to and read from the blob store, by backend and direction."}, []string{"backend", "direction"})
	m.searches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_search_calls_total",
		Help: "Live searches by outcome (ok, or the error's kind)."}, []string{"outcome"})
	m.searchErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_search_upstream_errors_total",
		Help: "Searches the upstream (Tavily) failed, by error kind."}, []string{"kind"})
	m.runs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_runs_total",
		Help: "Runs entering each status: open (a new run), and a recipe run's queued, running, succeeded, failed."}, []string{"status"})
	m.quota = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_quota_refusals_total",
		Help: "Calls refused by a tenant quota, by limit."}, []string{"limit"})
	m.reclaims = prometheus.NewCounter(prometheus.CounterOpts{Name: "triad_kernels_reclaimed_total",
		Help: "Idle kernels stopped to start another run's kernel at its tenant's kernel quota."})
	m.egressConns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_egress_connections_total",
		Help: "Sandbox connections and requests through the egress proxy, by verdict (allowed, denied, failed) and code (why)."}, []string{"verdict", "code"})
	m.egressBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_egress_bytes_total",
		Help: "Bytes the egress proxy moved for sandboxes, by direction (sent upstream, received from upstream)."}, []string{"direction"})
	m.egressOpen = prometheus.NewGauge(prometheus.GaugeOpts{Name: "triad_egress_open_connections", Help: "Upstream connections the egress proxy holds open."})
	// Per-run accounting, summed by tenant: a run's own figures are in
	// GET /runs/{id}, never in a label.
	m.tenantCPU = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_tenant_cpu_seconds_total",
		Help: "CPU time the tenant's kernels used, where the sandbox backend measures it, as this process read them."}, []string{"tenant"})
	m.tenantMemory = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_tenant_memory_byte_seconds_total",
		Help: "Memory the tenant's kernels held over time, in byte-seconds, where the sandbox backend measures it, as this process read them."}, []string{"tenant"})
	m.tenantEgress = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "triad_tenant_egress_bytes_total",
		Help: "Bytes the tenant's sandboxes moved through the egress proxy of this process, by direction (out, in)."}, []string{"tenant", "direction"})
	m.tenantStored = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "triad_tenant_stored_bytes",
		Help: "Bytes the tenant's runs store, as this process last read or wrote its usage record."}, []string{"tenant"})
	for _, c := range []prometheus.Collector{m.tenantCPU, m.tenantMemory, m.tenantEgress, m.tenantStored, m.egressConns, m.egressBytes, m.egressOpen, m.toolCalls, m.toolLatency, m.httpRequests, m.httpLatency, m.kernelStarts, m.kernelStart,
		m.cellsRunning, m.evaluations, m.evalLatency, m.storeOps, m.storeErrors, m.storeBytes, m.searches, m.searchErrors, m.runs, m.quota, m.reclaims,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the registry the families live in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ToolCall implements orchestrator.Metrics.
func (m *Metrics) ToolCall(tool, outcome string, d time.Duration) {
	m.toolCalls.WithLabelValues(tool, outcome).Inc()
	m.toolLatency.WithLabelValues(tool).Observe(d.Seconds())
}

// Evaluated implements orchestrator.Metrics.
func (m *Metrics) Evaluated(verdict string, d time.Duration) {
	m.evaluations.WithLabelValues(verdict).Inc()
	m.evalLatency.Observe(d.Seconds())
}

// Search implements orchestrator.Metrics.
func (m *Metrics) Search(outcome string) {
	m.searches.WithLabelValues(outcome).Inc()
	if outcome != "ok" {
		m.searchErrors.WithLabelValues(outcome).Inc()
	}
}

// RunStatus implements orchestrator.Metrics.
func (m *Metrics) RunStatus(status string) { m.runs.WithLabelValues(status).Inc() }

// QuotaRefused implements orchestrator.Metrics.
func (m *Metrics) QuotaRefused(limit string) { m.quota.WithLabelValues(limit).Inc() }

// KernelReclaimed implements orchestrator.Metrics.
func (m *Metrics) KernelReclaimed() { m.reclaims.Inc() }

// TenantUsed implements orchestrator.Metrics.
func (m *Metrics) TenantUsed(tenant string, cpuSeconds, memoryByteSeconds float64, egressOut, egressIn int64) {
	m.tenantCPU.WithLabelValues(tenant).Add(max(cpuSeconds, 0))
	m.tenantMemory.WithLabelValues(tenant).Add(max(memoryByteSeconds, 0))
	m.tenantEgress.WithLabelValues(tenant, "out").Add(float64(max(egressOut, 0)))
	m.tenantEgress.WithLabelValues(tenant, "in").Add(float64(max(egressIn, 0)))
}

// TenantStored implements orchestrator.Metrics.
func (m *Metrics) TenantStored(tenant string, bytes int64) {
	m.tenantStored.WithLabelValues(tenant).Set(float64(bytes))
}

// CellRunning implements orchestrator.Metrics.
func (m *Metrics) CellRunning(delta int) { m.cellsRunning.Add(float64(delta)) }

// EgressConnection implements egress.Metrics.
func (m *Metrics) EgressConnection(verdict, code string) {
	m.egressConns.WithLabelValues(verdict, code).Inc()
}

// EgressBytes implements egress.Metrics.
func (m *Metrics) EgressBytes(sent, received int64) {
	if sent > 0 {
		m.egressBytes.WithLabelValues("sent").Add(float64(sent))
	}
	if received > 0 {
		m.egressBytes.WithLabelValues("received").Add(float64(received))
	}
}

// EgressOpen implements egress.Metrics.
func (m *Metrics) EgressOpen(delta int) { m.egressOpen.Add(float64(delta)) }

// Request implements api.Metrics.
func (m *Metrics) Request(route, method string, status int, d time.Duration) {
	m.httpRequests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.httpLatency.WithLabelValues(route, method).Observe(d.Seconds())
}

// Kernels reports a kernel pool's kernels by state at each scrape: live
// (assigned to a run) and warm (ready in the pool, also exported as the
// warm pool's size).
func (m *Metrics) Kernels(backend string, live, warm func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "triad_kernels", Help: "Kernels by backend and state.",
		ConstLabels: prometheus.Labels{"backend": backend, "state": "live"}}, func() float64 { return float64(live()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "triad_kernels", Help: "Kernels by backend and state.",
		ConstLabels: prometheus.Labels{"backend": backend, "state": "warm"}}, func() float64 { return float64(warm()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "triad_warm_pool_size", Help: "Ready kernels in the warm pool.",
		ConstLabels: prometheus.Labels{"backend": backend}}, func() float64 { return float64(warm()) }))
}

// ActiveRuns reports the recipe runs in flight by status at each scrape.
func (m *Metrics) ActiveRuns(counts func() map[string]int) {
	m.reg.MustRegister(&activeRuns{counts: counts, desc: prometheus.NewDesc("triad_runs_active",
		"Recipe runs in flight in this process, by status.", []string{"status"}, nil)})
}

type activeRuns struct {
	counts func() map[string]int
	desc   *prometheus.Desc
}

func (a *activeRuns) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

func (a *activeRuns) Collect(ch chan<- prometheus.Metric) {
	c := a.counts()
	for _, st := range []string{"queued", "running"} {
		ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, float64(c[st]), st)
	}
}

// Backend wraps a sandbox backend to time its kernel starts.
func (m *Metrics) Backend(b sandbox.Backend) sandbox.Backend { return &backend{Backend: b, m: m} }

type backend struct {
	sandbox.Backend
	m *Metrics
}

// Unwrap implements sandbox.Wrapper: the backend's optional abilities (its
// own warm pool, its image and runtime) stay visible through the wrapper.
func (b *backend) Unwrap() sandbox.Backend { return b.Backend }

func (b *backend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	t0 := time.Now()
	k, err := b.Backend.Start(ctx, spec)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	} else {
		b.m.kernelStart.WithLabelValues(b.Name()).Observe(time.Since(t0).Seconds())
	}
	b.m.kernelStarts.WithLabelValues(b.Name(), outcome).Inc()
	return k, err
}

// Store wraps a store's blobs and index to count operations, errors and
// bytes under the backend's name ("local", "s3"). The wrapped index keeps
// the store's records outside runs (tmpfs.Meta) when the index does.
func (m *Metrics) Store(name string, b tmpfs.Blobs, x tmpfs.Index) (tmpfs.Blobs, tmpfs.Index) {
	ib := &blobs{b: b, m: m, name: name}
	ix := &index{x: x, m: m, name: name}
	if mx, ok := x.(tmpfs.Meta); ok {
		return ib, &metaIndex{index: ix, meta: mx}
	}
	return ib, ix
}

func (m *Metrics) op(name, op string, err error) {
	m.storeOps.WithLabelValues(name, op).Inc()
	if err != nil && !isNotFound(err) {
		m.storeErrors.WithLabelValues(name, op).Inc()
	}
}

func isNotFound(err error) bool {
	return err != nil && (errors.Is(err, tmpfs.ErrNotFound) || errors.Is(err, tmpfs.ErrPrecondition))
}

type blobs struct {
	b    tmpfs.Blobs
	m    *Metrics
	name string
}

func (b *blobs) Put(ctx context.Context, r io.Reader, limit int64) (tmpfs.Digest, int64, error) {
	d, n, err := b.b.Put(ctx, r, limit)
	b.m.op(b.name, "blob_put", err)
	if err == nil {
		b.m.storeBytes.WithLabelValues(b.name, "write").Add(float64(n))
	}
	return d, n, err
}

// Append implements tmpfs.Appender when the wrapped blobs do; otherwise it
// reports errors.ErrUnsupported and the store writes whole blobs.
func (b *blobs) Append(ctx context.Context, base tmpfs.Digest, baseSize int64, tail []byte, chain string) (tmpfs.Digest, int64, error) {
	a, ok := b.b.(tmpfs.Appender)
	if !ok {
		return tmpfs.Digest{}, 0, errors.ErrUnsupported
	}
	d, n, err := a.Append(ctx, base, baseSize, tail, chain)
	if errors.Is(err, errors.ErrUnsupported) {
		return d, n, err
	}
	b.m.op(b.name, "blob_append", err)
	if err == nil {
		b.m.storeBytes.WithLabelValues(b.name, "write").Add(float64(len(tail)))
	}
	return d, n, err
}

func (b *blobs) Open(ctx context.Context, d tmpfs.Digest) (tmpfs.Blob, error) {
	bl, err := b.b.Open(ctx, d)
	b.m.op(b.name, "blob_open", err)
	if err != nil {
		return nil, err
	}
	return &countedBlob{Blob: bl, c: b.m.storeBytes.WithLabelValues(b.name, "read")}, nil
}

func (b *blobs) Stat(ctx context.Context, d tmpfs.Digest) (int64, error) {
	n, err := b.b.Stat(ctx, d)
	b.m.op(b.name, "blob_stat", err)
	return n, err
}

func (b *blobs) Ping(ctx context.Context) error {
	err := b.b.Ping(ctx)
	b.m.op(b.name, "ping", err)
	return err
}

// Close closes the wrapped blobs if they can be.
func (b *blobs) Close() error {
	if c, ok := b.b.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

type countedBlob struct {
	tmpfs.Blob
	c prometheus.Counter
}

func (c *countedBlob) Read(p []byte) (int, error) {
	n, err := c.Blob.Read(p)
	c.c.Add(float64(n))
	return n, err
}

type index struct {
	x    tmpfs.Index
	m    *Metrics
	name string
}

func (x *index) Get(ctx context.Context, run runid.ID, path string) (tmpfs.File, error) {
	f, err := x.x.Get(ctx, run, path)
	x.m.op(x.name, "index_get", err)
	return f, err
}

// FilesUnder implements tmpfs.DirCounter when the wrapped index does, and
// otherwise counts from a listing.
func (x *index) FilesUnder(ctx context.Context, run runid.ID, dir string) (int, error) {
	if dc, ok := x.x.(tmpfs.DirCounter); ok {
		return dc.FilesUnder(ctx, run, dir)
	}
	fs, err := x.x.List(ctx, run, dir+"/")
	return len(fs), err
}

func (x *index) Put(ctx context.Context, run runid.ID, f tmpfs.File) error {
	err := x.x.Put(ctx, run, f)
	x.m.op(x.name, "index_put", err)
	return err
}

// PutAll implements tmpfs.Batcher when the wrapped index does, and
// otherwise puts one by one: a wrapper must not cost the store its group
// commit (tmpfs.Store.Commit).
func (x *index) PutAll(ctx context.Context, run runid.ID, files []tmpfs.File) error {
	var err error
	if b, ok := x.x.(tmpfs.Batcher); ok {
		err = b.PutAll(ctx, run, files)
	} else {
		for _, f := range files {
			if err = x.x.Put(ctx, run, f); err != nil {
				break
			}
		}
	}
	x.m.op(x.name, "index_put", err)
	return err
}

func (x *index) Delete(ctx context.Context, run runid.ID, path string) error {
	err := x.x.Delete(ctx, run, path)
	x.m.op(x.name, "index_delete", err)
	return err
}

func (x *index) List(ctx context.Context, run runid.ID, prefix string) ([]tmpfs.File, error) {
	fs, err := x.x.List(ctx, run, prefix)
	x.m.op(x.name, "index_list", err)
	return fs, err
}

// Forget implements tmpfs.Forgetter by passing it on: an index that caches
// runs must still be told when one went stale or idle.
func (x *index) Forget(run runid.ID) {
	if f, ok := x.x.(tmpfs.Forgetter); ok {
		f.Forget(run)
	}
}

// Cached passes on the wrapped index's count of runs in memory.
func (x *index) Cached() int {
	if c, ok := x.x.(interface{ Cached() int }); ok {
		return c.Cached()
	}
	return 0
}

var _ tmpfs.Forgetter = (*index)(nil)

type metaIndex struct {
	*index
	meta tmpfs.Meta
}

func (x *metaIndex) GetMeta(ctx context.Context, key string) ([]byte, string, error) {
	b, v, err := x.meta.GetMeta(ctx, key)
	x.m.op(x.name, "meta_get", err)
	return b, v, err
}

func (x *metaIndex) PutMeta(ctx context.Context, key string, value []byte, cond tmpfs.Cond) (string, error) {
	v, err := x.meta.PutMeta(ctx, key, value, cond)
	x.m.op(x.name, "meta_put", err)
	return v, err
}

func (x *metaIndex) DeleteMeta(ctx context.Context, key string) error {
	err := x.meta.DeleteMeta(ctx, key)
	x.m.op(x.name, "meta_delete", err)
	return err
}

func (x *metaIndex) ListMeta(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	ks, err := x.meta.ListMeta(ctx, prefix, after, limit)
	x.m.op(x.name, "meta_list", err)
	return ks, err
}
