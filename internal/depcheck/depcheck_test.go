package depcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/triadhq/triad/"

// The layers, bottom up. A package may import packages of lower layers
// freely, packages of its own layer only where sameLayer allows it, and
// never a package of a higher layer. A new package must be placed here
// before its tests pass: placing it is the decision this test asks for.
var layers = [][]string{
	// 0: leaf helpers.
	{"auth", "bench/internal/benchenv", "internal/compress", "internal/crashpoint", "internal/fault", "internal/runid", "internal/keyedmutex", "internal/dockerarchive", "internal/safepath", "internal/version", "internal/testenv",
		"internal/miniotest", "internal/procmem", "internal/apifuzz", "internal/bodyread", "internal/depcheck", "sandbox/internal/loopfs", "recipes/sampledata/internal/gen", "recipes/sampledata/internal/regen"},
	// 1: the contract and the seams: wire types, the records' names, and
	// the interfaces the tools implement.
	{"wire", "runfiles", "tmpfs", "sandbox", "sandbox/internal/emit", "sandbox/internal/supervisor", "sandbox/cmdfs",
		// Generated protocol types of E2B's envd (filesystem and process).
		"api/e2b/envd", "api/e2b/envd/filesystem", "api/e2b/envd/filesystem/filesystemconnect",
		"api/e2b/envd/process", "api/e2b/envd/process/processconnect"},
	// 2: tools and records.
	{"auth/keys", "auth/share", "auth/session", "auth/seal", "metrics",
		"browser", "browser/replay", "browser/tavily", "browser/tavilytest",
		"tmpfs/local", "tmpfs/s3", "tmpfs/tmpfstest",
		"sandbox/docker", "sandbox/image", "sandbox/image/imagetest", "sandbox/jupyter", "sandbox/jupyter/zmtp",
		"sandbox/jupyter/jupytertest", "sandbox/wasm",
		"sandbox/hostdir", "sandbox/sandboxtest", "sandbox/kube", "sandbox/kube/csi", "sandbox/internal/jupytercell", "sandbox/internal/relay",
		"cel", "evaluator",
		"recipes", "recipes/notebook", "recipes/sampledata",
		"egress", "egress/egresstest", "sandbox/template", "sandbox/template/templatetest"},
	// 3: the orchestration core.
	{"orchestrator", "orchestrator/tenancy", "orchestrator/journal", "orchestrator/internal/storeerr",
		"orchestrator/kernels", "orchestrator/workspace", "orchestrator/orchestratortest", "orchestrator/replay", "orchestrator/kubelease", "recipes/runner"},
	// 4: surfaces. They share only the wire contract, never each other.
	{"api", "api/mcp", "api/e2b", "api/e2b/tmpfsrecords", "api/e2b/metarecords", "api/e2b/recordstest", "console", "console/consoletest"},
	// 5: binaries and benchmarks: wiring only.
	{"cmd/triad", "bench/console", "bench/sandbox", "bench/store", "bench/neighbour", "bench/scale", "bench/burst", "bench/abexec", "bench/gvisor", "deploy/kubernetes"},
}

// sameLayer lists the imports allowed within a layer: an implementation
// and its helpers, a seam's own sub-packages.
var sameLayer = map[string][]string{
	"api/e2b/envd/filesystem/filesystemconnect": {"api/e2b/envd/filesystem"},
	"api/e2b/envd/process/processconnect":       {"api/e2b/envd/process"},
	"api/e2b/tmpfsrecords":                      {"api/e2b"},
	"api/e2b/metarecords":                       {"api/e2b"},
	"api/e2b/recordstest":                       {"api/e2b"},
	"internal/runid":                            {"internal/fault"},
	"internal/safepath":                         {"internal/fault"},
	"internal/bodyread":                         {"internal/fault"},
	"internal/miniotest":                        {"internal/testenv"},
	"wire":                                      {"tmpfs"},
	"sandbox/internal/emit":                     {"sandbox"},
	"sandbox/cmdfs":                             {"sandbox"},
	"sandbox/internal/supervisor":               {"sandbox", "sandbox/internal/emit"},
	"browser/replay":                            {"browser"},
	"browser/tavily":                            {"browser"},
	"sandbox/docker":                            {"sandbox/image", "sandbox/jupyter", "sandbox/jupyter/zmtp", "sandbox/hostdir", "sandbox/internal/jupytercell", "sandbox/internal/relay"},
	"sandbox/internal/jupytercell":              {"sandbox/jupyter"},
	"sandbox/image/imagetest":                   {"sandbox/image"},
	"sandbox/template":                          {"sandbox/image", "egress"},
	"sandbox/template/templatetest":             {"sandbox/template", "sandbox/image", "sandbox/image/imagetest", "egress/egresstest"},
	"sandbox/wasm":                              {"sandbox/hostdir"},
	"sandbox/jupyter":                           {"sandbox/jupyter/zmtp"},
	"sandbox/kube":                              {"sandbox/image", "sandbox/jupyter", "sandbox/jupyter/zmtp", "sandbox/hostdir", "sandbox/internal/jupytercell", "sandbox/internal/relay", "sandbox/kube/csi"},
	"recipes":                                   {"browser", "recipes/notebook", "recipes/sampledata"},
	"orchestrator":                              {"orchestrator/tenancy", "orchestrator/journal", "orchestrator/internal/storeerr", "orchestrator/kernels", "orchestrator/workspace"},
	"orchestrator/tenancy":                      {"orchestrator/internal/storeerr"},
	"orchestrator/journal":                      {"orchestrator/internal/storeerr"},
	"orchestrator/kernels":                      {"orchestrator/workspace"},
	"orchestrator/orchestratortest":             {"orchestrator", "orchestrator/kernels"},
	"orchestrator/replay":                       {"orchestrator"},
	"orchestrator/kubelease":                    {"orchestrator"},
	"recipes/runner":                            {"orchestrator"},
	"recipes/sampledata/internal/regen":         {"recipes/sampledata/internal/gen"},
	"cmd/triad":                                 nil,
	"bench/sandbox":                             nil,
	"bench/gvisor":                              nil,
	"bench/store":                               nil,
	"bench/neighbour":                           nil,
	"bench/scale":                               nil,
	"bench/burst":                               nil,
	"bench/abexec":                              nil,
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// goList lists the module's packages with their non-test imports.
func goList(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "github.com/triadhq/triad/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

// check returns one line per import that runs back up or sideways without
// leave, and per package that has no layer.
func check(pkgs []pkg) []string {
	layer := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layer[p] = i
		}
	}
	var bad []string
	for _, p := range pkgs {
		from := strings.TrimPrefix(p.ImportPath, module)
		lf, ok := layer[from]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s has no layer: place it in depcheck's layers", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			lt, ok := layer[to]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s imports %s, which has no layer", from, to))
			case lt > lf:
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d): an arrow back up", from, lf, to, lt))
			case lt == lf && !slices.Contains(sameLayer[from], to):
				bad = append(bad, fmt.Sprintf("%s imports %s in its own layer %d without leave in sameLayer", from, to, lf))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

func TestLayers(t *testing.T) {
	for _, b := range check(goList(t)) {
		t.Error(b)
	}
}

// TestCheckFindsBackArrows proves the check can fail: a core package that
// imports a surface, a surface that imports another, and an unplaced
// package are each reported.
func TestCheckFindsBackArrows(t *testing.T) {
	got := check([]pkg{
		{ImportPath: module + "orchestrator", Imports: []string{module + "api", "fmt"}},
		{ImportPath: module + "api/mcp", Imports: []string{module + "api"}},
		{ImportPath: module + "newthing"},
		{ImportPath: module + "wire", Imports: []string{module + "tmpfs"}},
	})
	want := []string{
		"api/mcp imports api in its own layer 4 without leave in sameLayer",
		"newthing has no layer: place it in depcheck's layers",
		"orchestrator (layer 3) imports api (layer 4): an arrow back up",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
