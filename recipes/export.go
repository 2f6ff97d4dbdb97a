package recipes

import (
	"fmt"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/triadhq/triad/recipes/notebook"
)

// ExportNotebook returns the recipe's starter notebook (nbformat 4.5), for
// `triad recipes export NAME`: the recipe's prose as Markdown cells, a
// parameters cell with the defaults tagged "parameters" (so Papermill can
// inject other values), each python block as a code cell, each write block
// as a code cell that writes the same file, and each search block as a
// Markdown cell showing the search a Triad run makes there. Required params
// without a default get a placeholder value to edit.
//
// The notebook expects the recipe's inputs at their paths relative to the
// notebook; InputFiles returns the bundled defaults to write beside it.
func ExportNotebook(r *Recipe) ([]byte, error) {
	values := map[string]any{}
	for _, p := range r.Params {
		if p.Required {
			values[p.Name] = placeholder(p.Type)
		}
	}
	plan, err := r.Bind(values)
	if err != nil {
		return nil, err
	}
	nb := notebook.New()
	nb.Metadata["triad"] = map[string]any{"recipe": r.Name, "kind": "starter"}
	nb.AddMarkdown("intro", r.intro())
	nb.AddCode(ParametersID, plan.Steps[0].Code, "parameters")
	for _, b := range r.Blocks {
		if b.Doc != "" {
			nb.AddMarkdown(b.ID+"-doc", b.Doc)
		}
		steps := plan.stepsOf(b)
		switch b.Kind {
		case KindExec:
			nb.AddCode(b.ID, steps[0].Code)
		case KindWrite:
			nb.AddCode(b.ID, writeCell(steps[0].Write))
		case KindSearch:
			nb.AddMarkdown(b.ID, searchMarkdown(steps))
		}
	}
	if r.Epilogue != "" {
		nb.AddMarkdown("epilogue", r.Epilogue)
	}
	return nb.Marshal()
}

// InputFiles returns the bundled default of every input that has one, by
// the run path it is seeded at.
func (r *Recipe) InputFiles() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, in := range r.Inputs {
		if in.Default == "" {
			continue
		}
		b, err := in.DefaultData()
		if err != nil {
			return nil, err
		}
		out[in.Path] = b
	}
	return out, nil
}

// RunNotebook returns run.ipynb for an executed plan: results[i] is the
// sandbox result of p.Steps[i], or nil for a step that did not execute in
// the sandbox in this session (a search or write step, or a step resume
// skipped). An exec step without a result becomes a code cell with no
// outputs and a null execution count, as Jupyter shows a cell that did not
// run. Search and write steps become Markdown cells saying what they did.
// meta is added to the notebook's "triad" metadata (a run id, say).
func (p *Plan) RunNotebook(results []*notebook.Exec, meta map[string]any) ([]byte, error) {
	if len(results) > len(p.Steps) {
		return nil, fmt.Errorf("recipes: %d results for %d steps", len(results), len(p.Steps))
	}
	nb := notebook.New()
	tm := map[string]any{"recipe": p.Recipe.Name, "kind": "run"}
	for k, v := range meta {
		tm[k] = v
	}
	nb.Metadata["triad"] = tm
	nb.AddMarkdown("intro", fmt.Sprintf("# %s\n\n%s\n\nThe cells this run of recipe `%s` executed, with their outputs.",
		p.Recipe.Title, p.Recipe.Description, p.Recipe.Name))
	for i, s := range p.Steps {
		var res *notebook.Exec
		if i < len(results) {
			res = results[i]
		}
		var c *notebook.Cell
		switch s.Kind {
		case KindExec:
			tags := []string(nil)
			if s.ID == ParametersID {
				tags = []string{"injected-parameters"}
			}
			c = nb.AddCode(s.ID, s.Code, tags...)
			if res != nil {
				c.SetResult(*res)
			}
		case KindSearch:
			c = nb.AddMarkdown(s.ID, searchMarkdown([]Step{s}))
		case KindWrite:
			c = nb.AddMarkdown(s.ID, fmt.Sprintf("**Step %d: tmp.write** `%s` (%d bytes of text)", s.N, s.Write.Path, len(s.Write.Text)))
		}
		c.Metadata = map[string]any{"triad": map[string]any{"step": s.N, "id": s.ID, "kind": string(s.Kind)}}
	}
	return nb.Marshal()
}

// stepsOf returns the plan's steps made from block b.
func (p *Plan) stepsOf(b Block) []Step {
	var out []Step
	for _, s := range p.Steps {
		if s.Line == b.Line && s.ID != ParametersID {
			out = append(out, s)
		}
	}
	return out
}

func (r *Recipe) intro() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n%s\n\nStarter notebook of the Triad recipe `%s`. `triad run %s` runs it with each step journaled and graded; here you can run and edit the cells yourself.\n",
		r.Title, r.Description, r.Name, r.Name)
	if len(r.Params) > 0 {
		b.WriteString("\n**Parameters** (edit the next cell):\n\n| name | type | default | description |\n|---|---|---|---|\n")
		for _, p := range r.Params {
			def := "*required*"
			if !p.Required {
				def = "`" + pyLiteral(valueOrZero(p)) + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Name, p.Type, mdCell(def), mdCell(p.Description))
		}
	}
	if len(r.Inputs) > 0 {
		b.WriteString("\n**Inputs**, read from these paths beside the notebook:\n\n")
		for _, in := range r.Inputs {
			src := "supply it"
			if in.Default != "" {
				src = "bundled sample `" + in.Default + "`"
			}
			fmt.Fprintf(&b, "- `%s`: %s (%s)\n", in.Path, in.Description, src)
		}
	}
	if len(r.Outputs) > 0 {
		b.WriteString("\n**Deliverables:**\n\n")
		for _, o := range r.Outputs {
			fmt.Fprintf(&b, "- `%s`\n", o.Path)
		}
	}
	return b.String()
}

func valueOrZero(p Param) any {
	if p.Default != nil {
		return p.Default
	}
	return zero(p.Type)
}

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if len(s) > 200 {
		s = s[:197] + "..."
	}
	return strings.ReplaceAll(s, "\n", " ")
}

// searchMarkdown shows a search block's calls: a search runs outside the
// kernel, so a notebook can only say what was (or would be) searched.
func searchMarkdown(steps []Step) string {
	var b strings.Builder
	b.WriteString("**browser.search** (runs outside the kernel; a Triad run saves each answer, `{results: [{url, title, snippet, published_at, content}], citations_id}`, to the path shown):\n")
	for _, s := range steps {
		y, err := yaml.Marshal(s.Search)
		if err != nil {
			y = []byte(s.Search.Query)
		}
		fmt.Fprintf(&b, "\n```yaml\n# saved to %s\n%s```\n", s.SaveAs, y)
	}
	return b.String()
}

// writeCell is the Python that does what a write step does.
func writeCell(w *WriteArgs) string {
	return fmt.Sprintf("# tmp.write in a Triad run; the same file written from the notebook.\nfrom pathlib import Path\n"+
		"path = Path(%s)\npath.parent.mkdir(parents=True, exist_ok=True)\npath.write_text(%s)\n",
		pyLiteral(w.Path), pyText(w.Text))
}

// pyText renders s as a Python literal a reader can read: a raw
// triple-quoted string holding s verbatim when s allows one (no run of three
// single quotes, no NUL or CR, no trailing quote or backslash, which would
// end or escape the literal), else pyLiteral's escaped form.
func pyText(s string) string {
	if strings.Contains(s, "'''") || strings.ContainsAny(s, "\x00\r") ||
		strings.HasSuffix(s, "'") || strings.HasSuffix(s, `\`) {
		return pyLiteral(s)
	}
	return "r'''" + s + "'''"
}
