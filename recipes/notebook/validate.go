package notebook

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Validate checks data against the rules of the nbformat 4.5 JSON schema
// that a reader relies on: the required keys of the notebook, of each cell
// type and of each output type, no keys the schema forbids, cell ids that
// are well formed and unique, multi-line strings as a string or a list of
// strings, execution counts as null or a non-negative integer, and MIME
// bundles keyed by MIME type. It reports the first violation with its
// location, such as "cells[3].outputs[0]: stream output lacks \"name\"".
func Validate(data []byte) error {
	var nb map[string]any
	if err := json.Unmarshal(data, &nb); err != nil {
		return fmt.Errorf("notebook is not a JSON object: %w", err)
	}
	if err := keys("notebook", nb, []string{"metadata", "nbformat", "nbformat_minor", "cells"}, nil); err != nil {
		return err
	}
	if n, ok := nb["nbformat"].(float64); !ok || n != Major {
		return fmt.Errorf("nbformat is %v, want %d", nb["nbformat"], Major)
	}
	minor, ok := nb["nbformat_minor"].(float64)
	if !ok || minor < Minor || minor != float64(int(minor)) {
		return fmt.Errorf("nbformat_minor is %v, want an integer >= %d (cell ids)", nb["nbformat_minor"], Minor)
	}
	meta, ok := nb["metadata"].(map[string]any)
	if !ok {
		return fmt.Errorf("metadata is not an object")
	}
	if ks, present := meta["kernelspec"]; present {
		k, ok := ks.(map[string]any)
		if !ok || !isString(k["name"]) || !isString(k["display_name"]) {
			return fmt.Errorf("metadata.kernelspec needs string name and display_name")
		}
	}
	if li, present := meta["language_info"]; present {
		l, ok := li.(map[string]any)
		if !ok || !isString(l["name"]) {
			return fmt.Errorf("metadata.language_info needs a string name")
		}
	}
	cells, ok := nb["cells"].([]any)
	if !ok {
		return fmt.Errorf("cells is not an array")
	}
	ids := map[string]bool{}
	for i, raw := range cells {
		at := fmt.Sprintf("cells[%d]", i)
		c, ok := raw.(map[string]any)
		if !ok {
			return fmt.Errorf("%s is not an object", at)
		}
		if err := cell(at, c, ids); err != nil {
			return err
		}
	}
	return nil
}

var cellIDRE = regexp.MustCompile(`^[a-zA-Z0-9-_]{1,64}$`)

func cell(at string, c map[string]any, ids map[string]bool) error {
	typ, _ := c["cell_type"].(string)
	switch typ {
	case "markdown", "raw":
		if err := keys(at, c, []string{"id", "cell_type", "metadata", "source"}, []string{"attachments"}); err != nil {
			return err
		}
	case "code":
		if err := keys(at, c, []string{"id", "cell_type", "metadata", "source", "outputs", "execution_count"}, nil); err != nil {
			return err
		}
		if err := count(at+".execution_count", c["execution_count"]); err != nil {
			return err
		}
		outs, ok := c["outputs"].([]any)
		if !ok {
			return fmt.Errorf("%s.outputs is not an array", at)
		}
		for j, o := range outs {
			if err := output(fmt.Sprintf("%s.outputs[%d]", at, j), o); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: cell_type %v is not code, markdown or raw", at, c["cell_type"])
	}
	id, _ := c["id"].(string)
	if !cellIDRE.MatchString(id) {
		return fmt.Errorf("%s: id %v is not 1-64 characters of [a-zA-Z0-9-_]", at, c["id"])
	}
	if ids[id] {
		return fmt.Errorf("%s: id %q is not unique", at, id)
	}
	ids[id] = true
	meta, ok := c["metadata"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s.metadata is not an object", at)
	}
	if tags, present := meta["tags"]; present {
		l, ok := tags.([]any)
		if !ok {
			return fmt.Errorf("%s.metadata.tags is not an array", at)
		}
		seen := map[string]bool{}
		for _, t := range l {
			s, ok := t.(string)
			if !ok || strings.Contains(s, ",") || seen[s] {
				return fmt.Errorf("%s.metadata.tags: %v is not a unique string without commas", at, t)
			}
			seen[s] = true
		}
	}
	return multiline(at+".source", c["source"])
}

var (
	mimeRE     = regexp.MustCompile(`^[a-zA-Z0-9]+/[a-zA-Z0-9\-+.]+$`)
	jsonMimeRE = regexp.MustCompile(`^application/(.*\+)?json$`)
)

func output(at string, raw any) error {
	o, ok := raw.(map[string]any)
	if !ok {
		return fmt.Errorf("%s is not an object", at)
	}
	switch o["output_type"] {
	case "stream":
		if err := keys(at, o, []string{"output_type", "name", "text"}, nil); err != nil {
			return err
		}
		if !isString(o["name"]) {
			return fmt.Errorf("%s.name is not a string", at)
		}
		return multiline(at+".text", o["text"])
	case "display_data", "execute_result":
		required := []string{"output_type", "data", "metadata"}
		if o["output_type"] == "execute_result" {
			required = append(required, "execution_count")
			if err := count(at+".execution_count", o["execution_count"]); err != nil {
				return err
			}
		}
		if err := keys(at, o, required, nil); err != nil {
			return err
		}
		if _, ok := o["metadata"].(map[string]any); !ok {
			return fmt.Errorf("%s.metadata is not an object", at)
		}
		data, ok := o["data"].(map[string]any)
		if !ok {
			return fmt.Errorf("%s.data is not an object", at)
		}
		for mime, v := range data {
			if !mimeRE.MatchString(mime) {
				return fmt.Errorf("%s.data: %q is not a MIME type", at, mime)
			}
			if jsonMimeRE.MatchString(mime) {
				continue
			}
			if err := multiline(fmt.Sprintf("%s.data[%q]", at, mime), v); err != nil {
				return err
			}
		}
		return nil
	case "error":
		if err := keys(at, o, []string{"output_type", "ename", "evalue", "traceback"}, nil); err != nil {
			return err
		}
		if !isString(o["ename"]) || !isString(o["evalue"]) {
			return fmt.Errorf("%s: ename and evalue must be strings", at)
		}
		tb, ok := o["traceback"].([]any)
		if !ok {
			return fmt.Errorf("%s.traceback is not an array", at)
		}
		for _, l := range tb {
			if !isString(l) {
				return fmt.Errorf("%s.traceback holds a non-string", at)
			}
		}
		return nil
	}
	return fmt.Errorf("%s: output_type %v is not stream, display_data, execute_result or error", at, o["output_type"])
}

// keys checks that m has every required key and no key outside required
// and optional (the schema's additionalProperties: false).
func keys(at string, m map[string]any, required, optional []string) error {
	for _, k := range required {
		if _, ok := m[k]; !ok {
			return fmt.Errorf("%s lacks %q", at, k)
		}
	}
	for k := range m {
		if !slices.Contains(required, k) && !slices.Contains(optional, k) {
			return fmt.Errorf("%s has key %q, which nbformat 4 does not allow there", at, k)
		}
	}
	return nil
}

func count(at string, v any) error {
	if v == nil {
		return nil
	}
	n, ok := v.(float64)
	if !ok || n < 0 || n != float64(int64(n)) {
		return fmt.Errorf("%s is %v, want null or a non-negative integer", at, v)
	}
	return nil
}

func multiline(at string, v any) error {
	switch x := v.(type) {
	case string:
		return nil
	case []any:
		for _, l := range x {
			if !isString(l) {
				return fmt.Errorf("%s holds a non-string line", at)
			}
		}
		return nil
	}
	return fmt.Errorf("%s is neither a string nor a list of strings", at)
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}
