package docker

import (
	"testing"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// TestDisplayBookkeeping: output arrives message by message, yet a sink
// that applies EventClear ends with the displays a notebook shows
// (sandboxtest.RunDisplays).
func TestDisplayBookkeeping(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	sandboxtest.RunDisplays(t, startKernel(t, b, sandbox.Spec{Owner: "run-displays"}))
}
