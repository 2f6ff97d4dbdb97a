// Package notebook writes Jupyter notebooks in nbformat 4.5 from cells and their sandbox outputs, and checks notebooks against nbformat's schema rules.
package notebook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/triadhq/triad/sandbox"
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

// Result is what executing a cell produced, as a notebook records it: how
// it ended and its outputs, streams kept apart from displays.
type Result struct {
	OK             bool
	Stdout         string
	Stderr         string
	Display        []sandbox.Bundle
	Value          *sandbox.Bundle
	Error          *sandbox.ExecError
	ExecutionCount int
	Restarted      bool
	Duration       time.Duration
}

// SetResult records what executing the cell produced: its execution count
// and outputs in the order Jupyter shows them (stdout, stderr, displays,
// the result, the error).
func (c *Cell) SetResult(r *Result) {
	c.ExecutionCount = r.ExecutionCount
	c.Outputs = Outputs(r)
}

// Outputs converts a sandbox result to notebook outputs. The sandbox keeps
// streams apart from displays, so their interleaving is not preserved.
func Outputs(r *Result) []Output {
	var out []Output
	if r.Stdout != "" {
		out = append(out, Output{Type: "stream", Name: "stdout", Text: r.Stdout})
	}
	if r.Stderr != "" {
		out = append(out, Output{Type: "stream", Name: "stderr", Text: r.Stderr})
	}
	for _, d := range r.Display {
		out = append(out, Output{Type: "display_data", Data: d.Data, Metadata: d.Metadata})
	}
	if r.Value != nil {
		out = append(out, Output{Type: "execute_result", Data: r.Value.Data, Metadata: r.Value.Metadata,
			ExecutionCount: r.ExecutionCount})
	}
	if r.Error != nil {
		e := Output{Type: "error", Ename: r.Error.Ename, Evalue: r.Error.Evalue, Traceback: r.Error.Traceback}
		if e.Ename == "" {
			// Timeouts and dead kernels have no Python exception; name
			// them so the notebook says what happened.
			e.Ename = map[string]string{sandbox.KindTimeout: "Timeout", sandbox.KindKernelDied: "KernelDied"}[r.Error.Kind]
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
