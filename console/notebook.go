package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"

	"github.com/triadhq/triad/internal/fault"
)

// maxNotebook is the largest notebook the console renders.
const maxNotebook = 32 << 20

// nbView is a notebook as the console shows it: Markdown cells rendered
// to HTML on the server (safely, as every Markdown file), code cells'
// source and outputs as nbformat has them, for the page to render.
type nbView struct {
	Language string   `json:"language"`
	Cells    []nbCell `json:"cells"`
}

type nbCell struct {
	Type           string            `json:"type"`
	Source         string            `json:"source,omitempty"`
	HTML           string            `json:"html,omitempty"`
	ExecutionCount *int              `json:"execution_count,omitempty"`
	Outputs        []json.RawMessage `json:"outputs,omitempty"`
}

// nbSource is nbformat's multiline string: a string or a list of them.
type nbSource string

func (s *nbSource) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = nbSource(one)
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = nbSource(strings.Join(many, ""))
	return nil
}

type nbFile struct {
	Metadata struct {
		LanguageInfo struct {
			Name string `json:"name"`
		} `json:"language_info"`
	} `json:"metadata"`
	NBFormat int `json:"nbformat"`
	Cells    []struct {
		CellType       string            `json:"cell_type"`
		Source         nbSource          `json:"source"`
		ExecutionCount *int              `json:"execution_count"`
		Outputs        []json.RawMessage `json:"outputs"`
	} `json:"cells"`
}

// notebookFragment renders one of the run's .ipynb files for the page:
// JSON, with each Markdown cell as HTML.
func (c *Console) notebookFragment(w http.ResponseWriter, r *http.Request) error {
	id, err := c.runOf(r)
	if err != nil {
		return err
	}
	p := r.PathValue("path")
	if strings.ToLower(path.Ext(p)) != ".ipynb" {
		return fault.New(fault.BadInput, "only notebooks (.ipynb) are rendered here", "download the file instead")
	}
	rr, err := c.o.ReadRun(r.Context(), id)
	if err != nil {
		return err
	}
	f, rd, err := rr.Open(r.Context(), p)
	if err != nil {
		return err
	}
	defer rd.Close()
	if f.Size > maxNotebook {
		return fault.New(fault.TooLarge, fmt.Sprintf("%s is %d bytes, over the %d the console renders", p, f.Size, maxNotebook), "download it instead")
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	var nb nbFile
	if err := json.Unmarshal(b, &nb); err != nil || nb.NBFormat != 4 {
		return fault.New(fault.BadInput, fmt.Sprintf("%s is not a notebook in nbformat 4", p), "download it and open it in Jupyter")
	}
	out := nbView{Language: nb.Metadata.LanguageInfo.Name, Cells: []nbCell{}}
	for _, cell := range nb.Cells {
		v := nbCell{Type: cell.CellType}
		switch cell.CellType {
		case "markdown":
			v.HTML = string(renderMarkdown([]byte(cell.Source), id, path.Dir(f.Path)))
		case "code":
			v.Source, v.ExecutionCount, v.Outputs = string(cell.Source), cell.ExecutionCount, cell.Outputs
		default: // raw
			v.Source = string(cell.Source)
		}
		out.Cells = append(out.Cells, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(out)
}
