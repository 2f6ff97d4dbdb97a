package recipes

import (
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/recipes/sampledata"
	"github.com/triadhq/triad/wire"
)

// Recipe is a parsed, validated recipe. It is immutable once Parse returns
// it; callers share it and must not modify it.
type Recipe struct {
	// Name identifies the recipe in POST /run and the CLI.
	Name string
	// Title is a short human title.
	Title string
	// Description is a paragraph for listings.
	Description string
	// Backend is the sandbox the recipe's cells need.
	Backend Backend
	// Template is the sandbox template the recipe's runs start from (its
	// image, limits and egress policy); empty is the server's default.
	Template string
	// Params are in declaration order, which is the order of the
	// parameters cell.
	Params []Param
	// Inputs are the files a run is seeded with, in declaration order.
	Inputs []Input
	// Outputs are the deliverables a complete run leaves.
	Outputs []Output
	// Blocks are the step blocks as written, in order.
	Blocks []Block
	// Epilogue is the Markdown after the last block.
	Epilogue string
	// File is the name used in error messages, such as "market-scan.md".
	File string
	// Origin says where the recipe came from: "standard" for an embedded
	// recipe, otherwise the path it was loaded from.
	Origin string
	// Source is the recipe file's text as parsed.
	Source []byte
}

// Backend names the sandbox a recipe needs.
type Backend string

// Backends a recipe may ask for.
const (
	// BackendAny runs on every sandbox, the embedded WASI one included: the
	// cells use only the Python standard library.
	BackendAny Backend = "any"
	// BackendDocker needs the Docker sandbox image (numpy, pandas,
	// statsmodels, matplotlib, weasyprint, ...).
	BackendDocker Backend = "docker"
)

// ParamType is the type of a recipe param.
type ParamType string

// Param types. Values are held as string, int64, float64, bool and []any
// (of those scalars) respectively.
const (
	TypeString ParamType = "string"
	TypeInt    ParamType = "int"
	TypeFloat  ParamType = "float"
	TypeBool   ParamType = "bool"
	TypeList   ParamType = "list"
)

// Param is one declared param.
type Param struct {
	Name        string
	Type        ParamType
	Default     any // normalized as described at ParamType; nil when none
	Required    bool
	Description string
	// Min and Max bound an int or float param (inclusive); MaxLength a
	// string's length, or each item of a list, in characters. The
	// contract states them (the OpenAPI document), and Bind enforces them.
	Min, Max  *float64
	MaxLength int
	Line      int
}

// Input is a file a run is seeded with before its first step.
type Input struct {
	Name string
	// Path is where the file lands in the run's files.
	Path string
	// Default names a file of the bundled sample data (package
	// recipes/sampledata) used when the caller supplies none; "" for none.
	Default string
	// Required inputs have no default, and a run without them is refused.
	Required    bool
	Description string
	Line        int
}

// DefaultData returns the bundled sample file that seeds the input, or a
// NotFound fault when the input has no default.
func (in Input) DefaultData() ([]byte, error) {
	if in.Default == "" {
		return nil, fault.New(fault.NotFound, "input "+in.Name+" has no default data",
			"supply the file for input "+in.Name)
	}
	return sampledata.Read(in.Default)
}

// Output is an expected artifact and the checks the evaluator applies to
// it, with the recipe line that declared it.
type Output struct {
	wire.ExpectedFile
	Line int `json:"-"`
}

// Kind is what a step does.
type Kind string

// Step kinds, one per tool a step calls.
const (
	KindExec   Kind = "exec"   // sandbox.exec
	KindSearch Kind = "search" // browser.search, results saved by tmp.write
	KindWrite  Kind = "write"  // tmp.write
)

// Block is a step block as written in the recipe, templates unexpanded.
type Block struct {
	Kind Kind
	// ID is the block's id attribute, or "step-N" for the N-th block.
	ID string
	// Title is the nearest Markdown heading above the block.
	Title string
	// Doc is the Markdown between the previous block and this one.
	Doc string
	// Line is the 1-based line of the opening fence.
	Line int
	// Body is the text between the fences.
	Body string
	// Language is an exec block's language: "" for python, else "r",
	// "javascript", "typescript" or "bash" (wire.ExecRequest.Language).
	Language string
	// Outputs are the declared output paths (templates unexpanded); for
	// search and write blocks, save_as or path.
	Outputs []string
	// TimeoutSeconds is the python block's timeout attribute; 0 for the
	// runner's default.
	TimeoutSeconds int
	// Raw marks a write block whose text is not templated.
	Raw bool
	// Foreach names the list param a search block iterates over.
	Foreach string

	search *searchSource
	path   string // write: path template
}

// Param returns the named param.
func (r *Recipe) Param(name string) (Param, bool) {
	for _, p := range r.Params {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}

// Output returns the front matter's declaration of path.
func (r *Recipe) Output(path string) (Output, bool) {
	for _, o := range r.Outputs {
		if o.Path == path {
			return o, true
		}
	}
	return Output{}, false
}

// Info describes the recipe on the wire: in short (name, title,
// description, backend, origin), or in full with its params, inputs,
// outputs and steps.
func (rc *Recipe) Info(full bool) wire.RecipeInfo {
	ri := wire.RecipeInfo{Name: rc.Name, Title: rc.Title, Description: rc.Description, Backend: string(rc.Backend), Origin: rc.Origin}
	if !full {
		return ri
	}
	for _, p := range rc.Params {
		ri.Params = append(ri.Params, wire.RecipeParam{Name: p.Name, Type: string(p.Type), Default: p.Default, Required: p.Required, Description: p.Description,
			Minimum: p.Min, Maximum: p.Max, MaxLength: p.MaxLength})
	}
	for _, in := range rc.Inputs {
		ri.Inputs = append(ri.Inputs, wire.RecipeInput{Name: in.Name, Path: in.Path, Default: in.Default, Required: in.Required, Description: in.Description})
	}
	for _, o := range rc.Outputs {
		ri.Outputs = append(ri.Outputs, o.ExpectedFile)
	}
	for _, b := range rc.Blocks {
		ri.Steps = append(ri.Steps, wire.RecipeBlock{ID: b.ID, Kind: string(b.Kind), Title: b.Title, Line: b.Line})
	}
	return ri
}
