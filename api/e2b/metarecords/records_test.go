package metarecords_test

import (
	"path/filepath"
	"testing"

	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/api/e2b/recordstest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
)

func TestRecords(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	b, err := local.NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err := local.NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	recordstest.Run(t, metarecords.New(tmpfs.New(b, x, nil).Meta()))
}
