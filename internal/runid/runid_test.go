package runid_test

import (
	"testing"

	"github.com/triadhq/triad/internal/runid"
)

func TestReserved(t *testing.T) {
	for id, want := range map[string]bool{
		"triad-e2b-sandboxes": true, "TRIAD-x": true, "Triad-": true,
		"triad": false, "triadx": false, "r-triad-x": false, "mcp-abc": false, runid.New().String(): false,
	} {
		if got := runid.Must(id).Reserved(); got != want {
			t.Errorf("%q reserved: got %v, want %v", id, got, want)
		}
	}
}
