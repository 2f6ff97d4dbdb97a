package orchestrator_test

import (
	"fmt"
	"testing"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
)

// Every error a store reports reaches a caller as a fault of the kind it
// can act on, never as an internal error: a store that answers with one of
// tmpfs's errors, however wrapped, is a caller's 4xx or a 503.
func TestStoreErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault.Kind
	}{
		{tmpfs.ErrNotFound, fault.NotFound},
		{tmpfs.ErrTooLarge, fault.TooLarge},
		{tmpfs.ErrConflict, fault.Conflict},
		{tmpfs.ErrUnavailable, fault.StoreUnavailable},
		{tmpfs.ErrDigestMismatch, fault.Corrupt},
		{tmpfs.ErrQuarantined, fault.Corrupt},
		{tmpfs.ErrReplaced, fault.Conflict},
	} {
		err := orchestrator.StoreError(fmt.Errorf("read blob 1234: %w; open it again", tc.err), runid.New(), "a.csv")
		f := fault.As(err)
		if f == nil || f.Kind != tc.want || f.Message == "" || f.Suggestion == "" {
			t.Errorf("%v: got %#v, want kind %s with a message and a suggestion", tc.err, f, tc.want)
		}
	}
}
