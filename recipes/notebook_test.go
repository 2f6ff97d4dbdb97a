package recipes

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triadhq/triad/recipes/notebook"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// validateNotebook checks nb with this module's validator and, when
// Debian's python3-nbformat is installed, with nbformat's own JSON schema.
func validateNotebook(t *testing.T, nb []byte) {
	t.Helper()
	if err := notebook.Validate(nb); err != nil {
		t.Fatalf("notebook.Validate: %v", err)
	}
	nbformatValidate(t, nb)
}

// nbformatValidate validates nb with nbformat's own JSON schema: with
// Debian's python3-nbformat on the host when it is installed, else in the
// sandbox image, which has it too.
func nbformatValidate(t *testing.T, nb []byte) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nb.ipynb"), nb, 0o644); err != nil {
		t.Fatal(err)
	}
	// NO_CONVERT keeps the notebook's own version, so validate checks it
	// against the 4.5 schema.
	script := `import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)
nbformat.validate(nb)
print(nb.nbformat, nb.nbformat_minor, len(nb.cells))`
	var cmd *exec.Cmd
	if err := exec.Command("/usr/bin/python3", "-c", "import nbformat").Run(); err == nil {
		cmd = exec.Command("/usr/bin/python3", "-c", script, filepath.Join(dir, "nb.ipynb"))
	} else {
		img := sandboxImage(t)
		cmd = exec.Command("docker", "run", "--rm", "--network", "none", "-u", "1000:1000", "-v", dir+":/nb:ro",
			img, "python3", "-c", script, "/nb/nb.ipynb")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nbformat.validate: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); len(got) < 2 || got[0] != "4" || got[1] != "5" {
		t.Errorf("nbformat read version %q, want 4 5", out)
	}
}

func TestExportNotebookOfEveryStandardRecipe(t *testing.T) {
	for _, r := range Standard() {
		t.Run(r.Name, func(t *testing.T) {
			b, err := ExportNotebook(r)
			if err != nil {
				t.Fatal(err)
			}
			validateNotebook(t, b)
			var nb struct {
				Cells []struct {
					CellType string         `json:"cell_type"`
					Source   []string       `json:"source"`
					Metadata map[string]any `json:"metadata"`
				} `json:"cells"`
			}
			if err := json.Unmarshal(b, &nb); err != nil {
				t.Fatal(err)
			}
			code, params := 0, 0
			for _, c := range nb.Cells {
				if c.CellType != "code" {
					continue
				}
				code++
				if tags, _ := c.Metadata["tags"].([]any); len(tags) == 1 && tags[0] == "parameters" {
					params++
					if !strings.Contains(strings.Join(c.Source, ""), "objective = ") {
						t.Errorf("parameters cell does not assign objective:\n%s", strings.Join(c.Source, ""))
					}
				}
			}
			if params != 1 {
				t.Errorf("got %d cells tagged parameters, want 1", params)
			}
			if code < 5 {
				t.Errorf("got %d code cells, want at least 5", code)
			}
		})
	}
}

func TestRunNotebookOutputs(t *testing.T) {
	r := mustParse(t, "demo.md", demoRecipe)
	plan, err := r.Bind(nil)
	if err != nil {
		t.Fatal(err)
	}
	png, err := os.ReadFile("testdata/chart.png")
	if err != nil {
		t.Fatal(err)
	}
	// The answer references the image by run path; the notebook inlines
	// its bytes again (base64, as Jupyter keeps image/png).
	chart := wire.FileRef{Path: "outputs/exec-0002-display-1.png", Size: int64(len(png)), SHA256: tmpfs.DigestOf(png)}
	results := make([]*notebook.Exec, len(plan.Steps))
	results[0] = &notebook.Exec{Answer: &wire.ExecResponse{OK: true, ExecutionCount: 1}}
	results[1] = &notebook.Exec{Answer: &wire.ExecResponse{
		OK: true, ExecutionCount: 2, Stdout: "facts=3 saved\nsecond line\n", Stderr: "a warning\n",
		Display: []wire.Bundle{{Data: map[string]any{
			"image/png": chart, "text/plain": "<Figure size 640x480 with 1 Axes>",
		}}},
		Result: &wire.Bundle{Data: map[string]any{
			"text/plain": "42", "application/json": json.RawMessage(`{"answer": 42}`),
		}},
	}, Images: map[string][]byte{chart.Path: png}}
	// Steps 3 and 4 are searches; step 5 failed; step 6 is a write.
	results[4] = &notebook.Exec{Answer: &wire.ExecResponse{OK: false, ExecutionCount: 3, Error: &wire.ExecError{
		Kind: wire.CellExecution, Ename: "KeyError", Evalue: "'url'",
		Traceback: []string{"Traceback (most recent call last):", "KeyError: 'url'"},
	}}}
	b, err := plan.RunNotebook(results, map[string]any{"run_id": "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	validateNotebook(t, b)
	type runNotebook struct {
		Metadata map[string]any `json:"metadata"`
		Cells    []struct {
			ID             string `json:"id"`
			CellType       string `json:"cell_type"`
			ExecutionCount *int   `json:"execution_count"`
			Outputs        []struct {
				OutputType string         `json:"output_type"`
				Name       string         `json:"name"`
				Text       []string       `json:"text"`
				Data       map[string]any `json:"data"`
				Ename      string         `json:"ename"`
			} `json:"outputs"`
		} `json:"cells"`
	}
	var nb runNotebook
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, c := range nb.Cells {
		types = append(types, c.CellType)
	}
	if got, want := strings.Join(types, ","), "markdown,code,code,markdown,markdown,code,markdown"; got != want {
		t.Fatalf("got cells %s, want %s", got, want)
	}
	cell := nb.Cells[2]
	var outs []string
	for _, o := range cell.Outputs {
		outs = append(outs, o.OutputType+":"+o.Name)
	}
	if got, want := strings.Join(outs, ","), "stream:stdout,stream:stderr,display_data:,execute_result:"; got != want {
		t.Errorf("got outputs %s, want %s", got, want)
	}
	if got := cell.Outputs[0].Text; len(got) != 2 || got[0] != "facts=3 saved\n" {
		t.Errorf("got stream lines %q, want two lines with their newlines", got)
	}
	if got := cell.Outputs[2].Data["image/png"]; got == nil || !strings.HasPrefix(got.(string), "iVBORw0KGgo") {
		t.Errorf("got image/png %.20v, want base64 PNG", got)
	}
	if f := nb.Cells[5]; len(f.Outputs) != 1 || f.Outputs[0].Ename != "KeyError" {
		t.Errorf("got failing cell outputs %+v, want one KeyError", f.Outputs)
	}
	if tm, _ := nb.Metadata["triad"].(map[string]any); tm["run_id"] != "r-1" || tm["recipe"] != "demo" {
		t.Errorf("got triad metadata %v", tm)
	}

	// A run that stopped after step 2 leaves later cells unexecuted.
	b, err = plan.RunNotebook(results[:2], nil)
	if err != nil {
		t.Fatal(err)
	}
	validateNotebook(t, b)
	nb = runNotebook{}
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	if c := nb.Cells[5]; c.ExecutionCount != nil || len(c.Outputs) != 0 {
		t.Errorf("unexecuted cell: got count %v and %d outputs, want null and none", c.ExecutionCount, len(c.Outputs))
	}
}

func TestNotebookValidateRejects(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{
			"nbformat": 4, "nbformat_minor": 5,
			"metadata": map[string]any{"kernelspec": map[string]any{"name": "python3", "display_name": "Python 3"}},
			"cells": []any{
				map[string]any{"id": "a", "cell_type": "markdown", "metadata": map[string]any{}, "source": "# hi"},
				map[string]any{"id": "b", "cell_type": "code", "metadata": map[string]any{}, "source": []any{"x = 1\n"},
					"execution_count": nil, "outputs": []any{
						map[string]any{"output_type": "stream", "name": "stdout", "text": "1\n"},
					}},
			},
		}
	}
	cell := func(nb map[string]any, i int) map[string]any { return nb["cells"].([]any)[i].(map[string]any) }
	tests := []struct {
		name   string
		mutate func(nb map[string]any)
		want   string
	}{
		{"valid", func(map[string]any) {}, ""},
		{"old minor", func(nb map[string]any) { nb["nbformat_minor"] = 4 }, "nbformat_minor"},
		{"no cell id", func(nb map[string]any) { delete(cell(nb, 0), "id") }, `lacks "id"`},
		{"duplicate id", func(nb map[string]any) { cell(nb, 1)["id"] = "a" }, "not unique"},
		{"bad id", func(nb map[string]any) { cell(nb, 0)["id"] = "a b" }, "id"},
		{"outputs on markdown", func(nb map[string]any) { cell(nb, 0)["outputs"] = []any{} }, `key "outputs"`},
		{"code without execution_count", func(nb map[string]any) { delete(cell(nb, 1), "execution_count") }, "execution_count"},
		{"source not text", func(nb map[string]any) { cell(nb, 1)["source"] = 5 }, "source"},
		{"stream without name", func(nb map[string]any) {
			delete(cell(nb, 1)["outputs"].([]any)[0].(map[string]any), "name")
		}, `lacks "name"`},
		{"unknown output type", func(nb map[string]any) {
			cell(nb, 1)["outputs"].([]any)[0].(map[string]any)["output_type"] = "pyout"
		}, "output_type"},
		{"bad mime key", func(nb map[string]any) {
			cell(nb, 1)["outputs"] = []any{map[string]any{"output_type": "display_data", "metadata": map[string]any{},
				"data": map[string]any{"png": "x"}}}
		}, "MIME"},
		{"kernelspec without display_name", func(nb map[string]any) {
			nb["metadata"] = map[string]any{"kernelspec": map[string]any{"name": "python3"}}
		}, "kernelspec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nb := good()
			tt.mutate(nb)
			b, _ := json.Marshal(nb)
			err := notebook.Validate(b)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				nbformatValidate(t, b)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
