package metrics_test

import (
	"slices"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/s3"
	"github.com/triadhq/triad/tmpfs/tmpfstest"
)

// Metrics is what the orchestrator and the HTTP API report to.
var (
	_ orchestrator.Metrics = (*metrics.Metrics)(nil)
	_ api.Metrics          = (*metrics.Metrics)(nil)
	_ egress.Metrics       = (*metrics.Metrics)(nil)
)

// TestEgress: the proxy's events are families in /metrics.
func TestEgress(t *testing.T) {
	m := metrics.New()
	m.EgressConnection("denied", egress.CodeAddress)
	m.EgressBytes(10, 20)
	m.EgressOpen(1)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, s := range f.Metric {
			switch {
			case s.Counter != nil:
				got[f.GetName()] += s.Counter.GetValue()
			case s.Gauge != nil:
				got[f.GetName()] += s.Gauge.GetValue()
			}
		}
	}
	for name, want := range map[string]float64{"triad_egress_connections_total": 1, "triad_egress_bytes_total": 30, "triad_egress_open_connections": 1} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// A store whose seams are counted is still a store: the conformance suite,
// records outside runs included, passes through the wrappers, and the
// counters see the traffic.
func TestCountedStoreConforms(t *testing.T) {
	m := metrics.New()
	dir := t.TempDir()
	tmpfstest.Run(t, func(t *testing.T) *tmpfs.Store {
		b, err := local.NewBlobs(dir)
		if err != nil {
			t.Fatal(err)
		}
		x, err := local.NewIndex(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		cb, cx := m.Store("local", b, x)
		return tmpfs.New(cb, cx, nil)
	})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "triad_store_operations_total" {
			continue
		}
		for _, s := range f.Metric {
			for _, l := range s.Label {
				if l.GetName() == "op" {
					ops[l.GetValue()] += s.Counter.GetValue()
				}
			}
		}
	}
	for _, op := range []string{"blob_put", "blob_open", "index_put", "index_list", "meta_get", "meta_put", "meta_list", "meta_delete"} {
		if ops[op] == 0 {
			t.Errorf("no %s counted after the conformance suite: %v", op, ops)
		}
	}
}

// A counted S3 store still forgets: a replica that wraps its store for
// metrics must see what another replica wrote once the run's lock says so,
// which TestReplicasAlternate in deploy/kubernetes depends on.
func TestCountedStoreForgets(t *testing.T) {
	srv := miniotest.Shared(t)
	ctx := t.Context()
	cfg := s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
	open := func(counted bool) *tmpfs.Store {
		b, x, err := s3.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close(); x.Close() })
		if !counted {
			return tmpfs.New(b, x, nil)
		}
		cb, cx := metrics.New().Store("s3", b, x)
		return tmpfs.New(cb, cx, nil)
	}
	a, other := open(true), open(false)
	run := runid.New()
	if _, err := a.WriteBytes(ctx, run, "one.txt", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := other.WriteBytes(ctx, run, "two.txt", []byte("2")); err != nil {
		t.Fatal(err)
	}
	a.Forget(run)
	fs, err := a.List(ctx, run, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fs {
		got = append(got, f.Path)
	}
	if !slices.Equal(got, []string{"one.txt", "two.txt"}) {
		t.Errorf("counted store after Forget lists %v, want [one.txt two.txt]", got)
	}
}
