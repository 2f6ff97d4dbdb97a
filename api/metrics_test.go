package api_test

import (
	"bytes"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
)

// series is a scrape: each sample's value by family and labels
// ("name{k=v,...}").
type series map[string]float64

// scrape reads /metrics and parses it with Prometheus's own text parser.
func scrape(t *testing.T, c *client) (series, map[string]*dto.MetricFamily) {
	t.Helper()
	a := c.as("").do("GET", "/metrics", "", nil)
	if a.status != 200 || !strings.HasPrefix(a.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s", a.status, a.header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(a.body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := series{}
	for name, f := range fams {
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			k := name + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				out[k] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[k] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[k] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out, fams
}

// sum adds the samples of a family whose labels include every one given.
func (s series) sum(family string, labels ...string) float64 {
	var n float64
	for k, v := range s {
		name, ls, _ := strings.Cut(k, "{")
		if name != family {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && (strings.Contains(ls, l+",") || strings.Contains(ls, l+"}"))
		}
		if ok {
			n += v
		}
	}
	return n
}

// After a scripted mix of calls, /metrics parses with the Prometheus text
// parser and each family has moved by what the script did; no label holds a
// run id, a path or a key.
func TestMetrics(t *testing.T) {
	m := metrics.New()
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true, Metrics: m})
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Keys: s.Keys, Metrics: m, MetricsHandler: m.Handler()})
	before, _ := scrape(t, c)

	const run = "r-metrics-secret-run"
	for i := range 3 {
		c.write(run, "kept/file"+string(rune('a'+i))+".txt", "hello")
	}
	c.do("GET", "/tmp/read?path=kept/nope.txt", run, nil)
	for _, code := range []string{"x = 1", "x + 1"} {
		if out, a := c.exec(run, map[string]any{"code": code}); !out.OK {
			t.Fatalf("exec: %d %s", a.status, a.body)
		}
	}
	for range 2 {
		if a := c.post("/browser/search", run, map[string]any{"query": "acme analytics"}); a.status != 200 {
			t.Fatalf("search: %d %s", a.status, a.body)
		}
	}
	s.Tavily.Inject(tavilytest.PlanLimit())
	if a := c.post("/browser/search", run, map[string]any{"query": "acme analytics"}); a.status != 429 {
		t.Fatalf("search against a plan limit: %d %s", a.status, a.body)
	}
	c.as("").do("GET", "/tmp/list", run, nil)
	c.as(c.key[:len(c.key)-1]+"x").do("GET", "/tmp/list", run, nil)

	after, fams := scrape(t, c)
	for _, tc := range []struct {
		family string
		labels []string
		want   float64
	}{
		{"triad_tool_calls_total", []string{"tool=tmp.write", "outcome=ok"}, 3},
		{"triad_tool_calls_total", []string{"tool=tmp.read", "outcome=not_found"}, 1},
		{"triad_tool_calls_total", []string{"tool=sandbox.exec", "outcome=ok"}, 2},
		{"triad_tool_calls_total", []string{"tool=browser.search", "outcome=ok"}, 2},
		{"triad_tool_calls_total", []string{"tool=browser.search", "outcome=quota"}, 1},
		{"triad_tool_call_duration_seconds", []string{"tool=tmp.write"}, 3},
		{"triad_http_requests_total", []string{"route=/tmp/write", "method=POST", "status=200"}, 3},
		{"triad_http_requests_total", []string{"route=/tmp/read", "method=GET", "status=404"}, 1},
		{"triad_http_requests_total", []string{"route=/sandbox/exec", "method=POST", "status=200"}, 2},
		{"triad_http_requests_total", []string{"route=/browser/search", "method=POST", "status=429"}, 1},
		{"triad_http_requests_total", []string{"route=/tmp/list", "method=GET", "status=401"}, 2},
		{"triad_http_request_duration_seconds", []string{"route=/tmp/write"}, 3},
		{"triad_kernel_starts_total", []string{"backend=wasm", "outcome=ok"}, 1},
		{"triad_kernel_start_duration_seconds", []string{"backend=wasm"}, 1},
		{"triad_kernels", []string{"backend=wasm", "state=live"}, 1},
		{"triad_evaluations_total", nil, 9}, // every recorded call: 3 writes, 1 read, 2 cells, 3 searches
		{"triad_evaluation_duration_seconds", nil, 9},
		{"triad_search_calls_total", []string{"outcome=ok"}, 2},
		{"triad_search_calls_total", []string{"outcome=quota"}, 1},
		{"triad_search_upstream_errors_total", []string{"kind=quota"}, 1},
		{"triad_runs_total", []string{"status=open"}, 1},
	} {
		if got := after.sum(tc.family, tc.labels...) - before.sum(tc.family, tc.labels...); got != tc.want {
			t.Errorf("%s%v moved by %v, want %v", tc.family, tc.labels, got, tc.want)
		}
	}
	if d := after.sum("triad_store_bytes_total", "backend=local", "direction=write") - before.sum("triad_store_bytes_total", "backend=local", "direction=write"); d < 15 {
		t.Errorf("store bytes written moved by %v, want at least the 15 bytes written", d)
	}
	if d := after.sum("triad_store_operations_total", "backend=local") - before.sum("triad_store_operations_total", "backend=local"); d < 10 {
		t.Errorf("store operations moved by %v", d)
	}
	for _, f := range []string{"triad_warm_pool_size", "triad_cells_running", "triad_kernels", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := fams[f]; !ok {
			t.Errorf("family %s is missing", f)
		}
	}
	if after.sum("triad_cells_running") != 0 {
		t.Errorf("cells running after every call returned: %v", after.sum("triad_cells_running"))
	}
	// No label names a run, a path or a key.
	for k := range after {
		for _, bad := range []string{run, "kept/", "file", c.key[4:16], "trd_"} {
			if strings.Contains(k, bad) {
				t.Errorf("series %s holds %q", k, bad)
			}
		}
	}
}
