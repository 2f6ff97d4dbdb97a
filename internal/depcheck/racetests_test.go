package depcheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// scripts/test.sh runs race_tests of ./orchestrator and ./api under the
// race detector and skips them (by name, across every package) in the
// run without it: each name must be a test of exactly one of those two
// packages, or the skip would drop another package's test from CI.
func TestRaceTestsAreUnique(t *testing.T) {
	root := filepath.Join("..", "..")
	sh, err := os.ReadFile(filepath.Join(root, "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^race_tests='\^\(([^)]*)\)\$'$`).FindSubmatch(sh)
	if m == nil {
		t.Fatal("scripts/test.sh sets no race_tests='^(A|B)$'")
	}
	names := strings.Split(string(m[1]), "|")
	where := map[string][]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, n := range names {
			if regexp.MustCompile(`(?m)^func ` + n + `\(t \*testing\.T\)`).Match(b) {
				rel, _ := filepath.Rel(root, filepath.Dir(p))
				where[n] = append(where[n], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		dirs := where[n]
		if len(dirs) != 1 || (dirs[0] != "orchestrator" && dirs[0] != "api") {
			t.Errorf("race test %s is defined in %v; want exactly once, in orchestrator or api", n, dirs)
		}
	}
}
