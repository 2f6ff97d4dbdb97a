// Command regen rewrites the sample data files from gen.Files; go generate runs it in the sampledata directory.
package main

import (
	"fmt"
	"os"
	"sort"

	"github.com/triadhq/triad/recipes/sampledata/internal/gen"
)

func main() {
	files := gen.Files()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(name, files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "regen:", err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s (%d bytes)\n", name, len(files[name]))
	}
}
