// Package recordstest is the conformance suite every e2b.Records implementation passes.
package recordstest

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/internal/runid"
)

// Run checks recs: records put are got back and listed, replaced by a
// second put, gone after delete, and a missing record is ErrNoRecord.
// recs must start empty.
func Run(t *testing.T, recs e2b.Records) {
	t.Helper()
	ctx := t.Context()
	a, b := runid.New(), runid.New()
	if _, err := recs.Get(ctx, a); !errors.Is(err, e2b.ErrNoRecord) {
		t.Fatalf("Get of a missing record: got %v, want ErrNoRecord", err)
	}
	if all, err := recs.All(ctx); err != nil || len(all) != 0 {
		t.Fatalf("All of empty records: got %d, %v", len(all), err)
	}
	for _, put := range []struct {
		id runid.ID
		b  string
	}{{a, `{"id":"a","v":1}`}, {b, `{"id":"b"}`}, {a, `{"id":"a","v":2}`}} {
		if err := recs.Put(ctx, put.id, []byte(put.b)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := recs.Get(ctx, a)
	if err != nil || string(got) != `{"id":"a","v":2}` {
		t.Fatalf("Get after a second Put: got %s, %v", got, err)
	}
	all, err := recs.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(all, bytes.Compare)
	if len(all) != 2 || string(all[0]) != `{"id":"a","v":2}` || string(all[1]) != `{"id":"b"}` {
		t.Fatalf("All: got %q", all)
	}
	if err := recs.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := recs.Delete(ctx, a); err != nil {
		t.Fatalf("deleting a missing record: got %v, want nil", err)
	}
	if _, err := recs.Get(ctx, a); !errors.Is(err, e2b.ErrNoRecord) {
		t.Fatalf("Get after Delete: got %v, want ErrNoRecord", err)
	}
	if all, _ := recs.All(ctx); len(all) != 1 {
		t.Fatalf("All after Delete: got %q", all)
	}
}
