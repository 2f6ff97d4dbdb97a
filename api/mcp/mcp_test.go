package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"github.com/google/jsonschema-go/jsonschema"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// TestToolsAndSchemas: a client lists the tools with their schemas, over
// both transports, and each schema's properties are the HTTP contract's
// fields (plus run_id where the call is run-scoped).
func TestToolsAndSchemas(t *testing.T) {
	type contract struct {
		in, out reflect.Type // out nil: text only (journal_read)
		runArg  bool
	}
	want := map[string]contract{
		ToolExec:      {reflect.TypeFor[wire.ExecRequest](), reflect.TypeFor[wire.ExecResponse](), true},
		ToolRestart:   {reflect.TypeFor[struct{}](), reflect.TypeFor[wire.RestartResponse](), true},
		ToolSearch:    {reflect.TypeFor[wire.SearchRequest](), reflect.TypeFor[wire.SearchResponse](), true},
		ToolWrite:     {reflect.TypeFor[wire.WriteRequest](), reflect.TypeFor[wire.FileRef](), true},
		ToolRead:      {reflect.TypeFor[struct{ Path string }](), reflect.TypeFor[wire.ReadResponse](), true},
		ToolList:      {reflect.TypeFor[struct{ Prefix string }](), reflect.TypeFor[wire.ListResponse](), true},
		ToolDelete:    {reflect.TypeFor[struct{ Path string }](), reflect.TypeFor[wire.OK](), true},
		ToolJournal:   {reflect.TypeFor[struct{}](), nil, true},
		ToolNote:      {reflect.TypeFor[struct{ Text, Author string }](), reflect.TypeFor[wire.OK](), true},
		ToolRecipe:    {reflect.TypeFor[runner.Request](), reflect.TypeFor[wire.RecipeRunStarted](), false},
		ToolRecipes:   {reflect.TypeFor[struct{}](), reflect.TypeFor[wire.RecipeList](), false},
		ToolRunStatus: {reflect.TypeFor[struct{}](), reflect.TypeFor[wire.RunView](), true},
		// POST /runs's body without the replay fields (a session's run is
		// not a replay).
		ToolRunSetup: {reflect.TypeFor[struct {
			Template string             `json:"template"`
			Egress   *wire.EgressPolicy `json:"egress"`
			Seed     int64              `json:"seed"`
			AsOf     string             `json:"as_of"`
		}](), reflect.TypeFor[wire.RunSetup](), true},
	}
	name := regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	s := newStack(t, stackOptions{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, s)
			res, err := cs.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tool := range res.Tools {
				got = append(got, tool.Name)
				if !name.MatchString(tool.Name) {
					t.Errorf("tool name %q does not match %s", tool.Name, name)
				}
				c, ok := want[tool.Name]
				if !ok {
					continue
				}
				if !strings.Contains(tool.Description, "Example: "+examples[tool.Name].Args) {
					t.Errorf("%s: description has no worked example: %q", tool.Name, tool.Description)
				}
				in := fieldNames(c.in)
				if c.runArg {
					in = append(in, "run_id")
					slices.Sort(in)
				}
				if diff := cmp.Diff(in, schemaProps(t, tool.InputSchema)); diff != "" {
					t.Errorf("%s: input schema properties differ from the HTTP request's fields (-want +got):\n%s", tool.Name, diff)
				}
				if c.out == nil {
					if tool.OutputSchema != nil {
						t.Errorf("%s: got output schema %v, want none (the answer is text)", tool.Name, tool.OutputSchema)
					}
					continue
				}
				if diff := cmp.Diff(fieldNames(c.out), schemaProps(t, tool.OutputSchema)); diff != "" {
					t.Errorf("%s: output schema properties differ from the HTTP answer's fields (-want +got):\n%s", tool.Name, diff)
				}
			}
			wantNames := make([]string, 0, len(want))
			for n := range want {
				wantNames = append(wantNames, n)
			}
			slices.Sort(wantNames)
			slices.Sort(got)
			if diff := cmp.Diff(wantNames, got); diff != "" {
				t.Errorf("tools differ (-want +got):\n%s", diff)
			}
		})
	}
}

// fieldNames is jsonFields, with the snake_case names of the anonymous
// structs above spelled as the HTTP API spells them.
func fieldNames(rt reflect.Type) []string {
	names := jsonFields(rt)
	for i, n := range names {
		names[i] = strings.ToLower(n)
	}
	slices.Sort(names)
	return names
}

// TestSchemaTypes pins the schemas' types where inference alone would get
// them wrong: digests are strings, MIME bundle metadata is any JSON.
func TestSchemaTypes(t *testing.T) {
	s := schemaFor[wire.ExecResponse](false)
	b, err := json.Marshal(property(s, "files_out[].sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"type":"string","description":"sha256 of the content.","pattern":"^[0-9a-f]{64}$"}`; got != want {
		t.Errorf("got sha256 schema %s, want %s", got, want)
	}
	b, err = json.Marshal(property(s, "display[].metadata"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"type":"object","additionalProperties":true}`; got != want {
		t.Errorf("got metadata schema %s, want %s", got, want)
	}
}

// TestFiles runs the tmp tools over both transports against the real
// orchestrator and store (no sandbox: the files tools do not need one),
// and checks each answer equals the HTTP API's answer for the same run.
func TestFiles(t *testing.T) {
	s := newStack(t, stackOptions{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, s)
			res := call(t, cs, ToolWrite, map[string]any{"path": "notes/a.txt", "text": "hello\n"})
			ref := ok[wire.FileRef](t, res)
			run := runOf(t, res)
			if ref.Path != "notes/a.txt" || ref.Size != 6 || ref.SHA256 != tmpfs.DigestOf([]byte("hello\n")) {
				t.Errorf("got %+v, want notes/a.txt, 6 bytes, sha256 of the text", ref)
			}

			res = call(t, cs, ToolRead, map[string]any{"path": "notes/a.txt"})
			read := ok[wire.ReadResponse](t, res)
			if read.Text == nil || *read.Text != "hello\n" || read.SHA256 != ref.SHA256 {
				t.Errorf("got %+v, want the text back with the same sha256", read)
			}
			if got := runOf(t, res); got != run {
				t.Errorf("got run %s for the second call, want the session's run %s", got, run)
			}
			status, body := s.httpDo(t, http.MethodGet, "/tmp/read?path=notes/a.txt", run, nil)
			if status != http.StatusOK {
				t.Fatalf("GET /tmp/read: %d %v", status, body)
			}
			if diff := cmp.Diff(body, generic(t, res.StructuredContent)); diff != "" {
				t.Errorf("tmp_read differs from GET /tmp/read (-http +mcp):\n%s", diff)
			}

			res = call(t, cs, ToolList, map[string]any{"prefix": "notes/"})
			list := ok[wire.ListResponse](t, res)
			if len(list.Files) != 1 || list.Files[0].Path != "notes/a.txt" {
				t.Errorf("got %+v, want notes/a.txt alone", list.Files)
			}
			_, body = s.httpDo(t, http.MethodGet, "/tmp/list?prefix=notes/", run, nil)
			if diff := cmp.Diff(body, generic(t, res.StructuredContent)); diff != "" {
				t.Errorf("tmp_list differs from GET /tmp/list (-http +mcp):\n%s", diff)
			}

			// A binary image comes back as structured base64 and as image
			// content with the same bytes.
			pngBytes := tinyPNG(t)
			b64 := base64.StdEncoding.EncodeToString(pngBytes)
			ok[wire.FileRef](t, call(t, cs, ToolWrite, map[string]any{"path": "img/dot.png", "bytes_b64": b64}))
			res = call(t, cs, ToolRead, map[string]any{"path": "img/dot.png"})
			read = ok[wire.ReadResponse](t, res)
			if read.BytesB64 == nil || *read.BytesB64 != b64 {
				t.Errorf("got bytes_b64 %v, want the PNG back", read.BytesB64)
			}
			if len(res.Content) != 2 {
				t.Fatalf("got %d content blocks, want text and image", len(res.Content))
			}
			if img, isImg := res.Content[1].(*sdk.ImageContent); !isImg || img.MIMEType != "image/png" || !bytes.Equal(img.Data, pngBytes) {
				t.Errorf("got %#v, want image/png content with the file's bytes", res.Content[1])
			}

			res = call(t, cs, ToolDelete, map[string]any{"path": "notes/a.txt"})
			if del := ok[wire.OK](t, res); !del.OK {
				t.Errorf("got %+v, want ok", del)
			}
			if e := failed(t, call(t, cs, ToolRead, map[string]any{"path": "notes/a.txt"})); e.Kind != fault.NotFound {
				t.Errorf("read after delete: got kind %s, want not_found", e.Kind)
			}

			// Refusals are results with the kind, message and suggestion.
			for _, c := range []struct {
				name string
				tool string
				args map[string]any
				kind fault.Kind
			}{
				{"write traversal", ToolWrite, map[string]any{"path": "../../etc/passwd", "text": "x"}, fault.BadInput},
				{"read traversal", ToolRead, map[string]any{"path": "../../etc/passwd"}, fault.BadInput},
				{"read absolute", ToolRead, map[string]any{"path": "/etc/passwd"}, fault.BadInput},
				{"delete traversal", ToolDelete, map[string]any{"path": "a/../../x"}, fault.BadInput},
				{"list traversal", ToolList, map[string]any{"prefix": "../"}, fault.BadInput},
				{"journal is reserved", ToolWrite, map[string]any{"path": "CEL.md", "text": "forged"}, fault.Reserved},
				{"both contents", ToolWrite, map[string]any{"path": "x", "text": "a", "bytes_b64": "YQ=="}, fault.BadInput},
				{"bad base64", ToolWrite, map[string]any{"path": "x", "bytes_b64": "!!"}, fault.BadInput},
				{"unknown field", ToolWrite, map[string]any{"path": "x", "text": "a", "mode": "0644"}, fault.BadInput},
				{"wrong type", ToolRead, map[string]any{"path": 7}, fault.BadInput},
				{"missing field", ToolRead, map[string]any{}, fault.BadInput},
				{"bad run_id", ToolList, map[string]any{"run_id": "../other"}, fault.InvalidRun},
				{"no such run", ToolRunStatus, map[string]any{"run_id": "never-used"}, fault.NotFound},
				{"no recipes", ToolRecipe, map[string]any{"recipe": "forecast-pack"}, fault.NotConfigured},
				{"no recipe list", ToolRecipes, map[string]any{}, fault.NotConfigured},
				{"no sandbox", ToolExec, map[string]any{"code": "1"}, fault.NotConfigured},
				{"empty note", ToolNote, map[string]any{"text": " "}, fault.BadInput},
			} {
				t.Run(c.name, func(t *testing.T) {
					e := failed(t, call(t, cs, c.tool, c.args))
					if e.Kind != c.kind {
						t.Errorf("got kind %s (%s), want %s", e.Kind, e.Message, c.kind)
					}
				})
			}
			// Every record Triad keeps about a run is refused to tmp_write
			// and tmp_delete, as over HTTP.
			for _, p := range []string{"CEL.md", "CEL.step_1.md", "trace.jsonl", "evaluations.jsonl", "artifacts/index.json",
				"citations/0001-forged.json", "outputs/exec-0001-display-1.png", "run.json", "run.ipynb"} {
				for tool, args := range map[string]map[string]any{ToolWrite: {"path": p, "text": "forged"}, ToolDelete: {"path": p}} {
					if e := failed(t, call(t, cs, tool, args)); e.Kind != fault.Reserved {
						t.Errorf("%s %s: got kind %s (%s), want reserved", tool, p, e.Kind, e.Message)
					}
				}
			}
			if _, err := s.store.Stat(t.Context(), runid.Must(run), "x"); err == nil {
				t.Errorf("a refused write left a file behind")
			}

			// The journal: a note, then Step Blocks for the calls that
			// reached the orchestrator, as GET /cel shows them.
			ok[wire.OK](t, call(t, cs, ToolNote, map[string]any{"text": "operator was here", "author": "test"}))
			res = call(t, cs, ToolJournal, map[string]any{})
			if res.IsError || res.StructuredContent != nil {
				t.Fatalf("journal_read: got %s (structured %v), want CEL.md as text", text(res), res.StructuredContent)
			}
			cel := text(res)
			steps := regexp.MustCompile(`(?m)^## Step (\d+): (\S+)$`).FindAllStringSubmatch(cel, -1)
			var tools []string
			for _, m := range steps {
				tools = append(tools, m[2])
			}
			// GET /tmp/read and /tmp/list above are calls in the same run.
			wantTools := []string{"tmp.write", "tmp.read", "tmp.read", "tmp.list", "tmp.list", "tmp.write", "tmp.read", "tmp.delete", "tmp.read"}
			if diff := cmp.Diff(wantTools, tools); diff != "" {
				t.Errorf("Step Blocks differ (-want +got):\n%s\n%s", diff, cel)
			}
			if !strings.Contains(cel, "operator was here") {
				t.Errorf("CEL.md lacks the note:\n%s", cel)
			}
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/cel", nil)
			req.Header.Set("X-Run-Id", run)
			resp, err := s.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if buf.String() != cel {
				t.Errorf("journal_read differs from GET /cel")
			}

			st := ok[wire.RunView](t, call(t, cs, ToolRunStatus, map[string]any{}))
			if st.RunID != run || len(st.Steps) != len(wantTools) {
				t.Errorf("got run_status %+v, want run %s with %d steps", st, run, len(wantTools))
			}
		})
	}
}

func tinyPNG(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSessionIsOneRun is the must-show list, over both transports,
// with the real Docker sandbox: state persists within a session, a plot
// comes back as image/png, files round-trip, traversal is refused, 1/0 is
// an error, and CEL.md has a Step Block for every call.
func TestSessionIsOneRun(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, s)
			res := call(t, cs, ToolExec, map[string]any{"code": "x = 21"})
			out := ok[wire.ExecResponse](t, res)
			run := runOf(t, res)
			if !out.OK {
				t.Fatalf("x = 21: %+v", out)
			}
			res = call(t, cs, ToolExec, map[string]any{"code": "x*2"})
			out = ok[wire.ExecResponse](t, res)
			if out.Result == nil || out.Result.Data["text/plain"] != "42" {
				t.Errorf("x*2: got result %+v, want 42", out.Result)
			}
			if got := runOf(t, res); got != run {
				t.Errorf("got run %s, want the session's run %s", got, run)
			}

			res = call(t, cs, ToolExec, map[string]any{"code": "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('trend')\nplt.show()"})
			out = ok[wire.ExecResponse](t, res)
			if len(out.Display) != 1 {
				t.Fatalf("got %d display outputs, want the figure: %+v", len(out.Display), out)
			}
			ref, isRef := out.Display[0].Data["image/png"].(map[string]any)
			if !isRef {
				t.Fatalf("got display %+v, want an image/png reference", out.Display[0].Data)
			}
			var imgs []*sdk.ImageContent
			for _, c := range res.Content {
				if ic, isImg := c.(*sdk.ImageContent); isImg {
					imgs = append(imgs, ic)
				}
			}
			if len(imgs) != 1 || imgs[0].MIMEType != "image/png" {
				t.Fatalf("got image content %v, want one image/png", imgs)
			}
			if !bytes.HasPrefix(imgs[0].Data, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("image content starts %q, want the PNG signature", imgs[0].Data[:min(8, len(imgs[0].Data))])
			}
			if sum := sha256.Sum256(imgs[0].Data); tmpfs.DigestOf(imgs[0].Data).String() != ref["sha256"] || int(ref["size"].(float64)) != len(imgs[0].Data) {
				t.Errorf("image content (sha256 %x, %d bytes) is not the stored file %v", sum, len(imgs[0].Data), ref)
			}
			// The plot is a run file too.
			if _, err := s.store.Stat(t.Context(), runid.Must(run), ref["path"].(string)); err != nil {
				t.Errorf("the plot %v is not a run file: %v", ref["path"], err)
			}

			ok[wire.FileRef](t, call(t, cs, ToolWrite, map[string]any{"path": "data/n.txt", "text": "17"}))
			read := ok[wire.ReadResponse](t, call(t, cs, ToolRead, map[string]any{"path": "data/n.txt"}))
			if read.Text == nil || *read.Text != "17" {
				t.Errorf("got %+v, want 17", read)
			}
			// The cell sees the file the session wrote.
			out = ok[wire.ExecResponse](t, call(t, cs, ToolExec, map[string]any{"code": "int(open('data/n.txt').read()) + x"}))
			if out.Result == nil || out.Result.Data["text/plain"] != "38" {
				t.Errorf("got %+v, want 38", out.Result)
			}
			if e := failed(t, call(t, cs, ToolWrite, map[string]any{"path": "../../etc/passwd", "text": "root::0:0::/:/bin/sh"})); e.Kind != fault.BadInput {
				t.Errorf("../../etc/passwd: got kind %s, want bad_input", e.Kind)
			}

			// A cell that raises is an error result that still carries the
			// whole exec answer.
			res = call(t, cs, ToolExec, map[string]any{"code": "print('before')\n1/0"})
			if !res.IsError {
				t.Fatalf("1/0: got success, want isError")
			}
			out = decode[wire.ExecResponse](t, res)
			if out.OK || out.Error == nil || out.Error.Ename != "ZeroDivisionError" || out.Error.Message == "" || out.Error.Suggestion == "" {
				t.Errorf("1/0: got %+v (error %+v), want ok:false with ZeroDivisionError, message and suggestion", out, out.Error)
			}
			if out.Stdout != "before\n" {
				t.Errorf("1/0: got stdout %q, want the output before the error", out.Stdout)
			}
			if !strings.Contains(text(res), "ZeroDivisionError") {
				t.Errorf("1/0: the text content %q does not name the error", text(res))
			}
			// The failure did not lose the kernel.
			out = ok[wire.ExecResponse](t, call(t, cs, ToolExec, map[string]any{"code": "x"}))
			if out.Result == nil || out.Result.Data["text/plain"] != "21" {
				t.Errorf("x after the error: got %+v, want 21", out.Result)
			}

			cel := text(call(t, cs, ToolJournal, map[string]any{}))
			var tools []string
			for _, m := range regexp.MustCompile(`(?m)^## Step (\d+): (\S+)$`).FindAllStringSubmatch(cel, -1) {
				tools = append(tools, m[2])
			}
			want := []string{"sandbox.exec", "sandbox.exec", "sandbox.exec", "tmp.write", "tmp.read", "sandbox.exec", "sandbox.exec", "sandbox.exec"}
			if diff := cmp.Diff(want, tools); diff != "" {
				t.Errorf("Step Blocks differ (-want +got):\n%s\n%s", diff, cel)
			}
			if n := strings.Count(cel, "**Evaluation (by Evaluator):** "); n != len(want) {
				t.Errorf("got %d Evaluation lines, want %d", n, len(want))
			}
			if strings.Contains(cel, "PENDING") {
				t.Errorf("CEL.md has an Evaluation left PENDING:\n%s", cel)
			}
		})
	}

	// Sessions are runs: a second session has its own kernel, and reaches
	// the first one's only by naming its run.
	t.Run("two sessions", func(t *testing.T) {
		a, b := connectHTTP(t, s), connectHTTP(t, s)
		runA := runOf(t, call(t, a, ToolExec, map[string]any{"code": "secret = 'a'"}))
		res := call(t, b, ToolExec, map[string]any{"code": "secret"})
		if runOf(t, res) == runA {
			t.Fatalf("two HTTP sessions share run %s", runA)
		}
		if out := decode[wire.ExecResponse](t, res); !res.IsError || out.Error == nil || out.Error.Ename != "NameError" {
			t.Errorf("session b sees session a's variable: %+v", out)
		}
		out := ok[wire.ExecResponse](t, call(t, b, ToolExec, map[string]any{"code": "secret", "run_id": runA}))
		if out.Result == nil || out.Result.Data["text/plain"] != "'a'" {
			t.Errorf("run_id %s: got %+v, want 'a'", runA, out.Result)
		}
	})
}

// TestExamples runs every tool's worked example, as its description shows
// it, against a real server and checks the answer matches.
func TestExamples(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true, recipes: true})
	cs := connectHTTP(t, s)
	// Order matters: the files examples build on each other, and the
	// journal and status examples read what came before.
	order := []string{ToolRunSetup, ToolWrite, ToolRead, ToolList, ToolExec, ToolSearch, ToolNote, ToolJournal, ToolRunStatus, ToolDelete, ToolRestart, ToolRecipes, ToolRecipe}
	for _, tool := range order {
		ex := examples[tool]
		var args map[string]any
		if err := json.Unmarshal([]byte(ex.Args), &args); err != nil {
			t.Fatalf("%s: example args are not JSON: %v", tool, err)
		}
		res := call(t, cs, tool, args)
		if res.IsError {
			t.Fatalf("%s: example failed: %s", tool, text(res))
		}
		if tool == ToolJournal {
			if err := matchText(ex.Answer, text(res)); err != nil {
				t.Errorf("%s: %v", tool, err)
			}
			continue
		}
		var want any
		if err := json.Unmarshal([]byte(ex.Answer), &want); err != nil {
			t.Fatalf("%s: example answer is not JSON: %v", tool, err)
		}
		if err := match(want, generic(t, res.StructuredContent), tool); err != nil {
			t.Errorf("example answer does not match: %v\ngot %s", err, text(res))
		}
		if tool == ToolRecipe {
			// The example recipe runs for real, on the Tavily fake.
			run := runid.Must(runOf(t, res))
			if err := s.runner.Wait(t.Context(), run); err != nil {
				t.Fatal(err)
			}
			st := ok[wire.RunView](t, call(t, cs, ToolRunStatus, map[string]any{"run_id": run.String()}))
			if st.Status != runner.Succeeded {
				t.Errorf("the example recipe run ended %s (%s), want succeeded: %+v", st.Status, st.Error, st.RecipeSteps)
			}
		}
	}
}

// TestRecipeRun starts a recipe through MCP with the real runner and
// follows it with the run-scoped tools, passing its run_id.
func TestRecipeRun(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true, recipes: true})
	cs := connectHTTP(t, s)
	list := ok[wire.RecipeList](t, call(t, cs, ToolRecipes, map[string]any{}))
	var names []string
	for _, r := range list.Recipes {
		names = append(names, r.Name)
	}
	if !slices.Contains(names, "mcp-smoke") || !slices.Contains(names, "market-scan") {
		t.Errorf("recipe_list: got %v, want the standard recipes and mcp-smoke", names)
	}
	_, body := s.httpDo(t, http.MethodGet, "/recipes", "", nil)
	if diff := cmp.Diff(body, generic(t, list)); diff != "" {
		t.Errorf("recipe_list differs from GET /recipes (-http +mcp):\n%s", diff)
	}

	res := call(t, cs, ToolRecipe, map[string]any{"recipe": "mcp-smoke", "params": map[string]any{"n": 7}})
	started := ok[wire.RecipeRunStarted](t, res)
	if started.Status != runner.Queued || started.RunID == "" || runOf(t, res) != started.RunID {
		t.Fatalf("got %+v (meta run %s), want a queued run", started, runOf(t, res))
	}
	session := runOf(t, call(t, cs, ToolList, map[string]any{}))
	if started.RunID == session {
		t.Errorf("the recipe ran in the session's run %s, want its own", session)
	}
	if err := s.runner.Wait(t.Context(), runid.Must(started.RunID)); err != nil {
		t.Fatal(err)
	}
	res = call(t, cs, ToolRunStatus, map[string]any{"run_id": started.RunID})
	st := ok[wire.RunView](t, res)
	if st.Status != runner.Succeeded || st.Recipe != "mcp-smoke" || len(st.RecipeSteps) != 3 {
		t.Errorf("got %+v, want mcp-smoke succeeded with 3 steps (parameters, cell, write)", st)
	}
	_, body = s.httpDo(t, http.MethodGet, "/runs/"+started.RunID, "", nil)
	if diff := cmp.Diff(body, generic(t, res.StructuredContent)); diff != "" {
		t.Errorf("run_status differs from GET /runs/{id} (-http +mcp):\n%s", diff)
	}
	read := ok[wire.ReadResponse](t, call(t, cs, ToolRead, map[string]any{"path": "artifacts/square.txt", "run_id": started.RunID}))
	if read.Text == nil || *read.Text != "49" {
		t.Errorf("artifacts/square.txt: got %+v, want 49", read)
	}
	cel := text(call(t, cs, ToolJournal, map[string]any{"run_id": started.RunID}))
	if !strings.Contains(cel, "**Recipe:** mcp-smoke") || strings.Count(cel, "\n## Step ") < 3 {
		t.Errorf("the recipe run's journal lacks its steps:\n%s", cel)
	}

	// Refusals are POST /run's refusals.
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"unknown recipe", map[string]any{"recipe": "no-such-recipe"}},
		{"undeclared param", map[string]any{"recipe": "mcp-smoke", "params": map[string]any{"m": 1}}},
		{"wrong param type", map[string]any{"recipe": "mcp-smoke", "params": map[string]any{"n": "seven"}}},
		{"bad run_id", map[string]any{"recipe": "mcp-smoke", "run_id": "../x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := failed(t, call(t, cs, ToolRecipe, c.args))
			status, body := s.httpDo(t, http.MethodPost, "/run", "", c.args)
			if status < 400 {
				t.Fatalf("POST /run accepted %v", c.args)
			}
			// Each surface words a schema violation its own way; the
			// kind is the same.
			if kind := body.(map[string]any)["error"].(map[string]any)["kind"]; kind != string(e.Kind) {
				t.Errorf("recipe_run's error is %s (%s), POST /run's %v: %v", e.Kind, e.Message, kind, body)
			}
		})
	}
}

// TestClose: Close ends open HTTP sessions (their next call fails at the
// protocol level: the session is gone), keeps their runs, and a new
// session starts a new run.
func TestClose(t *testing.T) {
	s := newStack(t, stackOptions{})
	cs, err := newClient().Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: s.url + "/mcp", MaxRetries: -1, HTTPClient: s.client()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	run := runOf(t, call(t, cs, ToolWrite, map[string]any{"path": "kept.txt", "text": "kept"}))
	if err := s.mcp.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: ToolList, Arguments: map[string]any{}}); err == nil {
		t.Errorf("a call on a closed session succeeded")
	}
	cs2 := connectHTTP(t, s)
	res := call(t, cs2, ToolRead, map[string]any{"path": "kept.txt", "run_id": run})
	if read := ok[wire.ReadResponse](t, res); read.Text == nil || *read.Text != "kept" {
		t.Errorf("the closed session's run lost its file: %+v", read)
	}
	if runOf(t, call(t, cs2, ToolList, map[string]any{})) == run {
		t.Errorf("a new session reused the closed session's run")
	}
}

func TestSessionRun(t *testing.T) {
	for _, c := range []struct{ session, want string }{
		{"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "mcp-ABCDEFGHIJKLMNOPQRSTUVWXYZ"},
		{"a.b_c-d", "mcp-a.b_c-d"},
		// Not run-id-safe or too long: hashed, never cut or rewritten.
		{"a/b", "mcp-" + hexSum("a/b")},
		{"a b", "mcp-" + hexSum("a b")},
		{strings.Repeat("x", 61), "mcp-" + hexSum(strings.Repeat("x", 61))},
	} {
		got := sessionRun(c.session)
		if got.String() != c.want {
			t.Errorf("sessionRun(%q): got %s, want %s", c.session, got, c.want)
		}
		if _, err := runid.Parse(got.String()); err != nil {
			t.Errorf("sessionRun(%q) = %q is not a valid run id: %v", c.session, got, err)
		}
	}
	if sessionRun(strings.Repeat("x", 61)) == sessionRun(strings.Repeat("x", 62)) {
		t.Errorf("two long session ids share a run")
	}
}

func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// A sandbox_exec whose client asks for progress gets each print as a
// progress notification while the cell runs, before the result.
func TestExecProgress(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true})
	var mu sync.Mutex
	var msgs []string
	c := sdk.NewClient(&sdk.Implementation{Name: "triad-test", Version: "0"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			msgs = append(msgs, req.Params.Message)
		},
	})
	cs, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: s.url + "/mcp", DisableStandaloneSSE: true, HTTPClient: s.client()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	params := &sdk.CallToolParams{Name: ToolExec, Arguments: map[string]any{"code": "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.5)"}}
	params.SetProgressToken("p-1")
	res, err := cs.CallTool(t.Context(), params)
	if err != nil || res.IsError {
		t.Fatalf("call: %+v %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(msgs, "|") != "0\n|1\n|2\n" {
		t.Errorf("got progress messages %q, want one per print", msgs)
	}
}

// property finds the schema at a property path such as "files_in[].name".
func property(s *jsonschema.Schema, path string) *jsonschema.Schema {
	for seg := range strings.SplitSeq(path, ".") {
		name, items := strings.CutSuffix(seg, "[]")
		if s == nil || s.Properties == nil {
			return nil
		}
		s = s.Properties[name]
		if items {
			if s == nil {
				return nil
			}
			s = s.Items
		}
	}
	return s
}

// An MCP session whose tenant is at its kernel quota gets a kernel: the
// least recently used idle one is reclaimed, and that session's next cell
// finds its variables gone, its files there and its journal saying why.
func TestKernelReclaim(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true, kernels: 2})
	a, b, c := connectHTTP(t, s), connectHTTP(t, s), connectHTTP(t, s)
	ok[wire.ExecResponse](t, call(t, a, ToolExec, map[string]any{"code": "x = 1\nopen('kept.txt', 'w').write('kept')"}))
	ok[wire.ExecResponse](t, call(t, b, ToolExec, map[string]any{"code": "x = 2"}))
	res := call(t, c, ToolExec, map[string]any{"code": "x = 3"})
	runC := runOf(t, res)
	if res.IsError {
		t.Fatalf("the third session's kernel at a quota of 2: %+v, want an idle one reclaimed", res.Content)
	}
	res = call(t, a, ToolExec, map[string]any{"code": "print(open('kept.txt').read())\nx"})
	if out := decode[wire.ExecResponse](t, res); !res.IsError || out.Error == nil || out.Error.Ename != "NameError" || out.Stdout != "kept\n" {
		t.Errorf("the reclaimed session's next cell: %+v; want its file read and x gone", out)
	}
	cel := text(call(t, a, ToolJournal, map[string]any{}))
	sec := strings.Index(cel, "### Kernel state reclaimed")
	if sec < 0 || sec > strings.Index(cel, "## Step 2: ") || !strings.Contains(cel[sec:], runC) {
		t.Errorf("the reclaimed session's journal does not say, before step 2, that its kernel went to %s:\n%s", runC, cel)
	}
}
