package recipes

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/triadhq/triad/internal/fault"
)

//go:embed standard/*.md
var standardFS embed.FS

// Standard returns the recipes embedded in the binary, sorted by name. They
// are parsed once; a standard recipe that does not parse is a build defect
// caught by this package's tests, so Standard panics on one.
func Standard() []*Recipe { return slices.Clone(standard()) }

var standard = sync.OnceValue(func() []*Recipe {
	rs, err := loadFS(standardFS, "standard", "standard")
	if err != nil {
		panic("recipes: embedded standard recipe: " + err.Error())
	}
	return rs
})

// LoadDir parses every *.md file directly in dir (not in subdirectories)
// as a recipe, except README.md, which a recipe directory usually has. A
// recipe's name must equal its file name without ".md", so the file to
// edit is always obvious. Any file that does not parse fails the load.
func LoadDir(dir string) ([]*Recipe, error) {
	rs, err := loadFS(os.DirFS(dir), ".", dir)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

func loadFS(fsys fs.FS, dir, origin string) ([]*Recipe, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fault.Wrap(fault.BadInput, err, "cannot read recipe directory "+origin,
			"pass an existing directory of *.md recipes with --recipes")
	}
	var out []*Recipe
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".md") || strings.EqualFold(name, "README.md") {
			continue
		}
		data, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, name)))
		if err != nil {
			return nil, fault.Wrap(fault.BadInput, err, "cannot read recipe "+name, "check the file's permissions")
		}
		r, err := Parse(name, data)
		if err != nil {
			return nil, err
		}
		if want := strings.TrimSuffix(name, ".md"); r.Name != want {
			return nil, fault.Badf("rename the file or the recipe so they agree",
				"%s:%d: recipe name %q differs from its file name; name it %q", name, lineOf(data, "name:"), r.Name, want)
		}
		if origin == "standard" {
			r.Origin = "standard"
		} else {
			r.Origin = filepath.Join(origin, name)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Catalog is the set of recipes a server or CLI offers: the standard ones
// and those of --recipes DIR.
//
// A user recipe may not take the name of a standard one. Silently
// shadowing would make "market-scan" mean different things on two servers,
// and a failed load tells the author at once; a variant gets its own name.
type Catalog struct {
	byName map[string]*Recipe
	names  []string
}

// NewCatalog returns a catalog of the standard recipes plus user. A user
// recipe whose name is taken, by a standard recipe or another user recipe,
// is a fault.Conflict naming both origins.
func NewCatalog(user ...*Recipe) (*Catalog, error) {
	c := &Catalog{byName: map[string]*Recipe{}}
	for _, r := range append(Standard(), user...) {
		if prev, ok := c.byName[r.Name]; ok {
			return nil, fault.New(fault.Conflict,
				fmt.Sprintf("recipe %s from %s has the name of the recipe from %s", r.Name, r.Origin, prev.Origin),
				"give the user recipe its own name (and file name); standard recipes cannot be replaced")
		}
		c.byName[r.Name] = r
		c.names = append(c.names, r.Name)
	}
	sort.Strings(c.names)
	return c, nil
}

// Get returns the named recipe, or a fault.NotFound listing the names.
func (c *Catalog) Get(name string) (*Recipe, error) {
	if r, ok := c.byName[name]; ok {
		return r, nil
	}
	return nil, fault.New(fault.NotFound, fmt.Sprintf("no recipe %q", name),
		"known recipes: "+strings.Join(c.names, ", ")+"; GET /recipes lists them")
}

// List returns every recipe, sorted by name.
func (c *Catalog) List() []*Recipe {
	out := make([]*Recipe, len(c.names))
	for i, n := range c.names {
		out[i] = c.byName[n]
	}
	return out
}

// lineOf returns the 1-based line of the first line of src that starts
// with prefix, or 1.
func lineOf(src []byte, prefix string) int {
	for i, l := range splitLines(src) {
		if strings.HasPrefix(l, prefix) {
			return i + 1
		}
	}
	return 1
}
