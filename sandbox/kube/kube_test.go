package kube_test

import (
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestConformance runs the sandbox conformance suite against kernel pods
// on the test cluster, one deployment (owner) per backend.
func TestConformance(t *testing.T) {
	c := needCluster(t)
	sandboxtest.Run(t, sandboxtest.Options{
		New: func(t *testing.T) sandbox.Backend {
			// A generous grace, as for Docker: the suite's kernels share
			// two cores with the cluster itself.
			return c.newBackend(t, kube.Config{InterruptGrace: 10 * time.Second})
		},
		Interrupts: true,
	})
}
