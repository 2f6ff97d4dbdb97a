package metrics_test

import (
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/tmpfstest"
)

// Metrics is what the orchestrator and the HTTP API report to.
var (
	_ orchestrator.Metrics = (*metrics.Metrics)(nil)
	_ api.Metrics          = (*metrics.Metrics)(nil)
)

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
