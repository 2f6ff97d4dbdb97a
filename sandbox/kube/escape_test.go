package kube_test

import (
	"testing"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestEscape runs the escape-class probes Docker runs
// (sandboxtest.EscapeProbes) in kernel pods under the cluster's default
// runtime (runc) and under the gvisor RuntimeClass, each with Triad's
// Localhost seccomp profile, as triad serve runs them. The test cluster is
// one node on this machine, so the host the probes compare against is the
// node. Subtests are named "<probe> (needs <runtime>)/<runtime>".
func TestEscape(t *testing.T) {
	c := needCluster(t)
	gvisor := c.config(t, kube.Config{}).RuntimeClass
	if gvisor == "" {
		gvisor = "gvisor" // scripts/kube.sh makes it
	}
	host := sandboxtest.ReadHost(t)
	code := sandboxtest.EscapeCell(t)
	views := map[string]sandboxtest.CellView{}
	for rt, class := range map[string]string{sandboxtest.RuntimeRunc: runtimeDefault, sandboxtest.RuntimeRunsc: gvisor} {
		b := c.newBackend(t, kube.Config{RuntimeClass: class})
		k := startKernel(t, b, sandbox.Spec{Owner: "escape-" + rt})
		res, col := run(t, k, code, 0)
		if !res.OK {
			t.Fatalf("%s: the probe failed: %+v stderr=%q", rt, res.Error, col.Stderr.String())
		}
		views[rt] = sandboxtest.ParseCellView(t, col.Stdout.String())
	}
	sandboxtest.RunEscape(t, views, host)
}
