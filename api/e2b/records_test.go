package e2b_test

import (
	"testing"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/recordstest"
)

func TestMemRecords(t *testing.T) {
	recordstest.Run(t, &e2b.MemRecords{})
}
