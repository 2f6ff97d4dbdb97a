// Package notebook writes Jupyter notebooks in nbformat 4.5 from cells and their sandbox outputs, and checks notebooks against nbformat's schema rules.
package notebook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/triadhq/triad/wire"
)

// The nbformat version written. Minor 5 is the first with cell ids, which
// JupyterLab uses to track cells.
const (
	Major = 4
	Minor = 5
)

// Cell types.
const (
	Code     = "code"
	Markdown = "markdown"
)

// Notebook is a notebook being built. The zero value is not usable; call
// New.
type Notebook struct {
	// Metadata is the notebook's top-level metadata. New fills kernelspec
	// and language_info for Python 3; callers may add keys (Triad puts its
	// own under "triad").
	Metadata map[string]any
	Cells    []*Cell
	ids      map[string]bool
}

// Cell is one notebook cell.
type Cell struct {
	// ID is unique in the notebook; Add* methods derive it from a hint.
	ID     string
	Type   string
	Source string
	// Tags go in metadata.tags; "parameters" marks Papermill's parameters
	// cell.
	Tags []string
	// Metadata holds further cell metadata (Tags are added to it).
	Metadata map[string]any
	// ExecutionCount is the kernel's counter for an executed code cell;
	// 0 means not executed, written as null.
	ExecutionCount int
	Outputs        []Output
}

// Output is one code cell output. Type is "stream", "display_data",
// "execute_result" or "error"; the other fields are those of that type.
type Output struct {
	Type string
	// stream
	Name string // "stdout" or "stderr"
	Text string
	// display_data and execute_result
	Data     map[string]json.RawMessage
	Metadata map[string]json.RawMessage
	// execute_result
	ExecutionCount int
	// error
	Ename, Evalue string
	Traceback     []string
}

// New returns an empty Python 3 notebook.
func New() *Notebook {
	return &Notebook{
		Metadata: map[string]any{
			"kernelspec": map[string]any{
				"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python",
			},
			"language_info": map[string]any{"name": "python"},
		},
		ids: map[string]bool{},
	}
}

// AddMarkdown appends a Markdown cell. idHint seeds the cell's id.
func (nb *Notebook) AddMarkdown(idHint, text string) *Cell {
	return nb.add(&Cell{Type: Markdown, Source: text}, idHint)
}

// AddCode appends an unexecuted code cell with tags.
func (nb *Notebook) AddCode(idHint, source string, tags ...string) *Cell {
	return nb.add(&Cell{Type: Code, Source: source, Tags: tags}, idHint)
}

func (nb *Notebook) add(c *Cell, hint string) *Cell {
	c.ID = nb.uniqueID(hint)
	nb.Cells = append(nb.Cells, c)
	return c
}

var idUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// uniqueID turns hint into a valid cell id (1-64 of [a-zA-Z0-9-_]) not yet
// used in the notebook.
func (nb *Notebook) uniqueID(hint string) string {
	base := strings.Trim(idUnsafe.ReplaceAllString(hint, "-"), "-")
	if base == "" {
		base = "cell"
	}
	if len(base) > 56 {
		base = base[:56]
	}
	id := base
	for n := 2; nb.ids[id]; n++ {
		id = fmt.Sprintf("%s-%d", base, n)
	}
	nb.ids[id] = true
	return id
}

// Exec is what executing a code cell produced, as the notebook needs it:
// the sandbox.exec answer, and the bytes of the images its bundles
// reference by run path.
type Exec struct {
	Answer *wire.ExecResponse
	// Images are image bytes by the run path the answer's FileRefs name.
	Images map[string][]byte
}

// SetResult records what executing the cell produced: its execution count
// and its outputs.
func (c *Cell) SetResult(e Exec) {
	c.ExecutionCount = e.Answer.ExecutionCount
	c.Outputs = Outputs(e)
}

// Outputs converts an exec answer to notebook outputs. The answer keeps
// streams apart from displays, so their interleaving is not preserved.
// Images referenced by path are inlined from e.Images (base64, SVG as
// text); a reference with no bytes is left out of its bundle.
func Outputs(e Exec) []Output {
	r := e.Answer
	var out []Output
	if r.Stdout != "" {
		out = append(out, Output{Type: "stream", Name: "stdout", Text: r.Stdout})
	}
	if r.Stderr != "" {
		out = append(out, Output{Type: "stream", Name: "stderr", Text: r.Stderr})
	}
	for _, d := range r.Display {
		out = append(out, Output{Type: "display_data", Data: bundleData(d, e.Images), Metadata: d.Metadata})
	}
	if r.Result != nil {
		out = append(out, Output{Type: "execute_result", Data: bundleData(*r.Result, e.Images), Metadata: r.Result.Metadata,
			ExecutionCount: r.ExecutionCount})
	}
	if r.Error != nil {
		e := Output{Type: "error", Ename: r.Error.Ename, Evalue: r.Error.Evalue, Traceback: r.Error.Traceback}
		if e.Ename == "" {
			// Timeouts and dead kernels have no Python exception; name
			// them so the notebook says what happened.
			e.Ename = map[string]string{wire.CellTimeout: "Timeout", wire.CellKernelDied: "KernelDied",
				wire.CellOutputLimit: "OutputLimitExceeded", wire.CellInterrupted: "Interrupted"}[r.Error.Kind]
			if e.Ename == "" {
				e.Ename = "Error"
			}
			if e.Evalue == "" {
				e.Evalue = r.Error.Reason
			}
		}
		if e.Traceback == nil {
			e.Traceback = []string{}
		}
		out = append(out, e)
	}
	return out
}

// bundleData turns an answer's bundle back into Jupyter's form: images
// inline again.
func bundleData(b wire.Bundle, images map[string][]byte) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for mime, v := range b.Data {
		switch x := v.(type) {
		case wire.FileRef:
			data, ok := images[x.Path]
			if !ok {
				continue
			}
			s := base64.StdEncoding.EncodeToString(data)
			if mime == "image/svg+xml" {
				s = string(data)
			}
			out[mime], _ = json.Marshal(s)
		case json.RawMessage:
			out[mime] = x
		default:
			out[mime], _ = json.Marshal(x)
		}
	}
	return out
}

// Marshal returns the notebook as JSON the way Jupyter writes it: keys
// sorted, one-space indent, multi-line strings as lists of lines.
func (nb *Notebook) Marshal() ([]byte, error) {
	cells := make([]any, len(nb.Cells))
	for i, c := range nb.Cells {
		cells[i] = c.wire()
	}
	doc := map[string]any{
		"nbformat": Major, "nbformat_minor": Minor,
		"metadata": nb.Metadata, "cells": cells,
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("notebook: marshal: %w", err)
	}
	return b.Bytes(), nil
}

func (c *Cell) wire() map[string]any {
	meta := map[string]any{}
	for k, v := range c.Metadata {
		meta[k] = v
	}
	if len(c.Tags) > 0 {
		meta["tags"] = c.Tags
	}
	w := map[string]any{"id": c.ID, "cell_type": c.Type, "metadata": meta, "source": lines(c.Source)}
	if c.Type == Code {
		var count any
		if c.ExecutionCount > 0 {
			count = c.ExecutionCount
		}
		outs := make([]any, len(c.Outputs))
		for i, o := range c.Outputs {
			outs[i] = o.wire()
		}
		w["execution_count"], w["outputs"] = count, outs
	}
	return w
}

func (o Output) wire() map[string]any {
	w := map[string]any{"output_type": o.Type}
	switch o.Type {
	case "stream":
		w["name"], w["text"] = o.Name, lines(o.Text)
	case "display_data", "execute_result":
		data := o.Data
		if data == nil {
			data = map[string]json.RawMessage{}
		}
		meta := o.Metadata
		if meta == nil {
			meta = map[string]json.RawMessage{}
		}
		w["data"], w["metadata"] = data, meta
		if o.Type == "execute_result" {
			var count any
			if o.ExecutionCount > 0 {
				count = o.ExecutionCount
			}
			w["execution_count"] = count
		}
	case "error":
		w["ename"], w["evalue"], w["traceback"] = o.Ename, o.Evalue, o.Traceback
	}
	return w
}

// lines splits s as Python's splitlines(keepends=True) does for "\n",
// which is how nbformat stores multi-line strings.
func lines(s string) []string {
	out := []string{}
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}
