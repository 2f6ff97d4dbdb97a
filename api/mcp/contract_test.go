package mcp

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"testing"

	"github.com/triadhq/triad/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden contract files in testdata/")

// tools/list is a reviewed contract: testdata/tools.json is the answer
// a client gets, so a change to a tool, a wire type, a description or a
// constraint shows in its diff, and CI fails until the file is updated
// with it: go test ./api/mcp -run '^TestToolsListGolden$' -update.
func TestToolsListGolden(t *testing.T) {
	s := newStack(t, stackOptions{})
	cs := connectStdio(t, s)
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, filepath.Join("testdata", "tools.json"), append(got, '\n'), *update)
}
