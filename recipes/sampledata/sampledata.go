// Package sampledata holds the synthetic data sets the standard recipes run on by default, embedded so the binary can seed a run's inputs.
//
// Every file is made by package internal/gen from fixed seeds; the
// committed files are its output (go generate rewrites them, and a test
// checks that they still match). README.md in this directory describes each file and its columns.
package sampledata

import (
	"embed"
	"io/fs"
	"slices"

	"github.com/triadhq/triad/internal/fault"
)

//go:generate go run ./internal/regen

//go:embed *.csv *.json
var files embed.FS

// Read returns the named sample file, or a NotFound fault.
func Read(name string) ([]byte, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fault.Wrap(fault.NotFound, err, "no bundled sample data file "+name,
			"the bundled files are listed by sampledata.Names and described in recipes/sampledata/README.md")
	}
	return b, nil
}

// Has reports whether name is a bundled sample file.
func Has(name string) bool { return slices.Contains(Names(), name) }

// Names lists the bundled sample files, sorted.
func Names() []string {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		// The embedded root always reads.
		panic("sampledata: " + err.Error())
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
