package sampledata_test

import (
	"bytes"
	"encoding/csv"
	"os"
	"slices"
	"testing"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/recipes/sampledata"
	"github.com/triadhq/triad/recipes/sampledata/internal/gen"
)

// TestCommittedFilesAreTheGeneratorsOutput fails when someone edits a
// sample file by hand or changes the generator without running go generate.
func TestCommittedFilesAreTheGeneratorsOutput(t *testing.T) {
	files := gen.Files()
	var names []string
	for name, want := range files {
		names = append(names, name)
		got, err := sampledata.Read(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the embedded file differs from the generator's output; run go generate ./recipes/sampledata", name)
		}
		onDisk, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(onDisk, want) {
			t.Errorf("%s: the file on disk differs from the generator's output; run go generate ./recipes/sampledata", name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, sampledata.Names()) {
		t.Errorf("got embedded files %v, want exactly the generated %v", sampledata.Names(), names)
	}
}

func TestGeneratorIsDeterministic(t *testing.T) {
	a, b := gen.Files(), gen.Files()
	for name := range a {
		if !bytes.Equal(a[name], b[name]) {
			t.Errorf("%s: two runs of the generator differ", name)
		}
	}
}

func TestShapes(t *testing.T) {
	tests := []struct {
		name    string
		header  []string
		minRows int
	}{
		{"leads.csv", []string{"lead_id", "created_date", "channel", "campaign", "region", "stage", "deal_value"}, 3000},
		{"spend.csv", []string{"month", "channel", "spend"}, 18 * 6},
		{"monthly_revenue.csv", []string{"month", "revenue"}, 48},
		{"options.csv", []string{"option_id", "option", "description", "capex", "annual_opex", "annual_benefit",
			"benefit_low", "benefit_high", "implementation_months", "ramp_months", "risk", "strategic_fit"}, 3},
	}
	for _, tt := range tests {
		b, err := sampledata.Read(tt.name)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !slices.Equal(rows[0], tt.header) {
			t.Errorf("%s: got header %v, want %v", tt.name, rows[0], tt.header)
		}
		if len(rows)-1 < tt.minRows {
			t.Errorf("%s: got %d rows, want at least %d", tt.name, len(rows)-1, tt.minRows)
		}
	}
}

func TestReadUnknown(t *testing.T) {
	_, err := sampledata.Read("nope.csv")
	if fe := fault.As(err); fe == nil || fe.Kind != fault.NotFound {
		t.Errorf("got %v, want NotFound", err)
	}
	if sampledata.Has("nope.csv") || !sampledata.Has("leads.csv") {
		t.Error("Has is wrong")
	}
}
