package api_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/triadhq/triad/wire"
)

// Issue 24 through Triad's own API: a chart and a DataFrame from a Python
// cell come back as JSON run files referenced by hash beside the PNG and
// the HTML; R, JavaScript, TypeScript and bash cells run in the run's own
// interpreters of those languages, keeping their state; each call is a
// Step Block naming its language; and the working directory is /home/user.
func TestExecChartsDataAndLanguages(t *testing.T) {
	t.Parallel()
	c := sandboxServer(t, "docker")
	const run = "r-kernels"

	out, _ := c.exec(run, map[string]any{"code": `
import os, matplotlib.pyplot as plt, pandas as pd
fig, ax = plt.subplots()
ax.bar(["a", "b"], [2, 5])
ax.set_title("T")
plt.show()
df = pd.DataFrame({"n": [1, 2], "s": ["x", "y"]})
print(os.getcwd(), os.environ["HOME"])
df`})
	if !out.OK || len(out.Display) != 1 || out.Result == nil {
		t.Fatalf("chart and frame: %+v", out)
	}
	if got, want := out.Stdout, "/home/user /home/user\n"; got != want {
		t.Errorf("cwd and HOME: got %q, want %q", got, want)
	}
	var chart struct {
		Type     string `json:"type"`
		Title    string `json:"title"`
		Elements []struct {
			Label string  `json:"label"`
			Value float64 `json:"value"`
		} `json:"elements"`
	}
	c.blobJSON(run, out.Display[0].Data[wire.ChartMIME], &chart)
	if chart.Type != "bar" || chart.Title != "T" || len(chart.Elements) != 2 || chart.Elements[1].Label != "b" || chart.Elements[1].Value != 5 {
		t.Errorf("chart: got %+v, want a bar chart T with a=2, b=5", chart)
	}
	if _, ok := out.Display[0].Data["image/png"].(map[string]any); !ok {
		t.Errorf("the chart's PNG is gone: %v", out.Display[0].Data)
	}
	var data map[string][]any
	c.blobJSON(run, out.Result.Data[wire.DataMIME], &data)
	if got, want := data["s"], []any{"x", "y"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] || len(data["n"]) != 2 {
		t.Errorf("data: got %v, want n=[1 2] s=[x y]", data)
	}
	if s, _ := out.Result.Data["text/html"].(string); !strings.Contains(s, "<table") {
		t.Errorf("the frame's HTML is gone: %v", out.Result.Data)
	}

	for _, tc := range []struct {
		lang, setup, code, want string
	}{
		{wire.LanguageR, `x <- 6L`, `cat(x * 7, getwd(), "\n")`, "42 /home/user \n"},
		{wire.LanguageJavaScript, `let x = 6`, `console.log(x * 7, Deno.cwd())`, "42 /home/user\n"},
		{wire.LanguageTypeScript, `const x: number = 6`, `console.log(x * 7)`, "42\n"},
	} {
		if out, a := c.exec(run, map[string]any{"code": tc.setup, "language": tc.lang}); !out.OK {
			t.Fatalf("%s %q: %d %+v %s", tc.lang, tc.setup, a.status, out.Error, a.body)
		}
		out, a := c.exec(run, map[string]any{"code": tc.code, "language": tc.lang})
		if !out.OK || out.Stdout != tc.want {
			t.Errorf("%s %q: got %q (%d %+v), want %q", tc.lang, tc.code, out.Stdout, a.status, out.Error, tc.want)
		}
	}
	// bash: the run's bash kernel keeps its shell; without a context,
	// language bash stays a one-off command.
	c.exec(run, map[string]any{"code": "y=42; cd /tmp", "language": "bash", "context": "bash"})
	if out, _ := c.exec(run, map[string]any{"code": "echo $y $(pwd)", "language": "bash", "context": "bash"}); out.Stdout != "42 /tmp\n" {
		t.Errorf("bash kernel: got %q, want %q", out.Stdout, "42 /tmp\n")
	}
	if out, _ := c.exec(run, map[string]any{"code": "echo ${y:-unset} $(pwd)", "language": "bash"}); out.Stdout != "unset /home/user\n" || out.ExitCode == nil {
		t.Errorf("bash command: got %q, exit %v; want %q with an exit code", out.Stdout, out.ExitCode, "unset /home/user\n")
	}
	if out, _ := c.exec(run, map[string]any{"code": "false", "language": "bash", "context": "bash"}); out.OK || out.Error == nil || out.Error.Evalue != "exit status 1" {
		t.Errorf("bash kernel, false: got %+v, want an error saying exit status 1", out.Error)
	}

	// Bad languages and mismatches are 400s that say what to send.
	for _, body := range []map[string]any{
		{"code": "1", "language": "cobol"},
		{"code": "1", "language": "r", "context": "javascript"},
		{"code": "1", "language": "r", "env": map[string]string{"A": "b"}},
	} {
		if _, a := c.exec(run, body); a.status != 400 || !strings.Contains(string(a.body), "suggestion") {
			t.Errorf("%v: got %d %s, want 400 with a suggestion", body, a.status, a.body)
		}
	}

	cel := string(c.do("GET", "/cel", run, nil).body)
	for _, want := range []string{"Ran a Python cell", "Ran a R cell", "Ran a JavaScript cell", "Ran a TypeScript cell", "Ran a bash cell", "Ran a bash command"} {
		if !strings.Contains(cel, want) {
			t.Errorf("the journal has no %q step:\n%s", want, cel)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^## Step \d+: sandbox\.exec`).FindAllString(cel, -1)); n != 11 {
		t.Errorf("got %d sandbox.exec Step Blocks, want 11 (the 400s are not calls):\n%s", n, cel)
	}
	if strings.Contains(cel, "PENDING") {
		t.Errorf("a step is ungraded:\n%s", cel)
	}
}

// wasm has no kernels but Python's, and the live document says so (the
// language's enum is python alone): another language is refused as the
// document refuses it, 400, with a suggestion that names the backend
// that has it.
func TestExecLanguageUnsupportedOnWasm(t *testing.T) {
	t.Parallel()
	c := sandboxServer(t, "wasm")
	for _, lang := range []string{wire.LanguageR, wire.LanguageJavaScript, wire.LanguageTypeScript} {
		_, a := c.exec("r-wasm-lang", map[string]any{"code": "1", "language": lang})
		var e wire.ErrorBody
		if err := json.Unmarshal(a.body, &e); err != nil || a.status != 400 || e.Error.Kind != "bad_input" || !strings.Contains(e.Error.Suggestion, "--sandbox docker") {
			t.Errorf("%s on wasm: got %d %s, want 400 bad_input suggesting --sandbox docker", lang, a.status, a.body)
		}
	}
}

// blobJSON reads the JSON run file a bundle's FileRef names.
func (c *client) blobJSON(run string, ref any, v any) {
	c.t.Helper()
	m, ok := ref.(map[string]any)
	if !ok {
		c.t.Fatalf("not a file reference: %#v", ref)
	}
	a := c.do("GET", "/blobs/"+m["sha256"].(string), run, nil)
	if a.status != 200 {
		c.t.Fatalf("/blobs/%s: %d %s", m["sha256"], a.status, a.body)
	}
	if err := json.Unmarshal(a.body, v); err != nil {
		c.t.Fatalf("%s: %v: %s", m["path"], err, a.body)
	}
}

// Deno's kernel queues console output to a task of its own, which may
// publish a cell's line after the cell's idle (on a loaded machine, a few
// cells in a hundred): every JavaScript and TypeScript cell here must come
// back with all it printed, on stdout and stderr, in order. A cell that
// breaks console (so the barrier Triad runs after each cell raises) still
// completes. DECISIONS, "A cell's late stdout".
func TestExecDenoOutputEveryCell(t *testing.T) {
	t.Parallel()
	c := sandboxServer(t, "docker")
	for i, lang := range []string{wire.LanguageJavaScript, wire.LanguageTypeScript, wire.LanguageJavaScript, wire.LanguageTypeScript} {
		run := fmt.Sprintf("r-deno-%d", i)
		for j := 1; j <= 6; j++ {
			code := fmt.Sprintf("console.log(%d * 6); console.error('e%d'); console.log('done')", j, j)
			out, a := c.exec(run, map[string]any{"code": code, "language": lang})
			if want := fmt.Sprintf("%d\ndone\n", j*6); !out.OK || out.Stdout != want || out.Stderr != fmt.Sprintf("e%d\n", j) {
				t.Errorf("%s %s cell %d: got stdout %q stderr %q (%d %+v), want %q and e%d", run, lang, j, out.Stdout, out.Stderr, a.status, out.Error, want, j)
			}
		}
	}
	if out, a := c.exec("r-deno-0", map[string]any{"code": "console.log('before'); globalThis.console = undefined", "language": "javascript"}); !out.OK || out.Stdout != "before\n" {
		t.Errorf("a cell that breaks console: got %q (%d %+v %s), want before", out.Stdout, a.status, out.Error, a.body)
	}
}
