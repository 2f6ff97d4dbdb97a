package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// TestREADMEListsEveryFlag keeps the configuration table (docs/configuration.md) true:
// every flag of triad serve (serveFlagSet, which registers the common,
// E2B and sandbox flags too) has a row naming the flag and its TRIAD_* twin, and every
// flag a row names exists (serve's, or the client's --api-key of triad run
// and triad replay). A row may name several flags: "| `--a`, `--b` |".
func TestREADMEListsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(l, "| `--") {
			continue
		}
		cell, _, _ := strings.Cut(strings.TrimPrefix(l, "| "), " |")
		for _, name := range strings.Split(cell, ", ") {
			rows[strings.TrimSuffix(strings.TrimPrefix(name, "`--"), "`")] = l
		}
	}
	var c config
	fs := c.serveFlagSet()
	fs.VisitAll(func(f *flag.Flag) {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("--%s has no row in docs/configuration.md's table", f.Name)
			return
		}
		if env := "`" + envName(f.Name) + "`"; !strings.Contains(row, env) {
			t.Errorf("docs/configuration.md's row for --%s does not name %s:\n%s", f.Name, env, row)
		}
		delete(rows, f.Name)
	})
	delete(rows, "api-key") // triad run's and triad replay's, for --server
	for name := range rows {
		if fs.Lookup(name) == nil {
			t.Errorf("docs/configuration.md has a row for --%s, which triad serve does not have", name)
		}
	}
}
