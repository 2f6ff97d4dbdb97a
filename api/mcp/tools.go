package mcp

import (
	"context"
	"encoding/json"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/wire"
)

// Tool names: the spec's names with "_" for ".", because common clients
// accept only ^[a-zA-Z0-9_-]{1,64}$.
const (
	ToolExec        = "sandbox_exec"
	ToolRestart     = "sandbox_restart"
	ToolSearch      = "browser_search"
	ToolWrite       = "tmp_write"
	ToolRead        = "tmp_read"
	ToolList        = "tmp_list"
	ToolDelete      = "tmp_delete"
	ToolJournal     = "journal_read"
	ToolNote        = "journal_note"
	ToolRecipe      = "recipe_run"
	ToolRecipes     = "recipe_list"
	ToolRunStatus   = "run_status"
	ToolRunSetup    = "run_setup"
	metaRunID       = "triad/run_id"
	wildcardExplain = "(abridged; … stands for any value)"
)

// runArg is the optional run_id argument every run-scoped tool takes. It
// stands in for the HTTP API's X-Run-Id header.
type runArg struct {
	RunID string `json:"run_id,omitempty" format:"run-id" doc:"The run to work in, 1-64 characters from [A-Za-z0-9._-]. Absent, this MCP session's run; name another run to read or continue it (its kernel, files and journal)."`
}

// The tools' arguments: the HTTP API's request types plus run_id.
type (
	execArgs struct {
		wire.ExecRequest
		runArg
	}
	searchArgs struct {
		wire.SearchRequest
		runArg
	}
	writeArgs struct {
		wire.WriteRequest
		runArg
	}
	pathArgs struct {
		wire.PathRequest
		runArg
	}
	listArgs struct {
		wire.ListRequest
		runArg
	}
	noteArgs struct {
		wire.NoteRequest
		runArg
	}
	setupArgs struct {
		wire.RunSetupRequest
		runArg
	}
)

// example is a tool's worked example: arguments and the answer they give.
// The package's tests run every example against a real server and check
// the answer, so the examples in the descriptions cannot go stale.
type example struct {
	Args   string
	Answer string
}

// Examples holds each tool's worked example; the answer is abridged, with
// "…" for any value.
var examples = map[string]example{
	ToolExec: {
		Args:   `{"code": "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf.to_csv('a.csv', index=False)\nint(df.a.sum())"}`,
		Answer: `{"ok": true, "stdout": "", "stderr": "", "result": {"data": {"text/plain": "3"}}, "files_out": [{"path": "a.csv", "size": 6, "sha256": "…"}], "truncated": false, "kernel": {"backend": "…", "restarted": false}}`,
	},
	ToolRestart: {Args: `{}`, Answer: `{"ok": true, "kernel": {"restarted": true}}`},
	ToolSearch: {
		Args:   `{"query": "heat pump sales Europe", "top_k": 3}`,
		Answer: `{"results": [{"url": "…", "title": "…", "snippet": "…"}], "citations_id": "…"}`,
	},
	ToolWrite: {
		Args:   `{"path": "notes/brief.md", "text": "# Brief\n"}`,
		Answer: `{"path": "notes/brief.md", "size": 8, "sha256": "…"}`,
	},
	ToolRead: {
		Args:   `{"path": "notes/brief.md"}`,
		Answer: `{"path": "notes/brief.md", "size": 8, "sha256": "…", "text": "# Brief\n"}`,
	},
	ToolList: {
		Args:   `{"prefix": "notes/"}`,
		Answer: `{"files": [{"path": "notes/brief.md", "size": 8, "sha256": "…", "modified_at": "…"}]}`,
	},
	ToolDelete: {Args: `{"path": "notes/brief.md"}`, Answer: `{"ok": true}`},
	ToolJournal: {
		Args:   `{}`,
		Answer: "# Context Engineering Log (CEL)\n\n- **Run:** …\n\n## Step 1: tmp.write\n**When:** …\n**Inputs:** …\n…\n**Evaluation (by Evaluator):** …",
	},
	ToolNote: {Args: `{"text": "Use 2024 prices only", "author": "analyst"}`, Answer: `{"ok": true}`},
	ToolRecipe: {
		Args:   `{"recipe": "market-scan", "objective": "Size the B2B SaaS analytics market for 2026", "params": {"top_k": 3}}`,
		Answer: `{"run_id": "…", "status": "queued", "status_url": "…", "events_url": "…", "resumes": 0}`,
	},
	ToolRecipes: {
		Args:   `{}`,
		Answer: `{"recipes": [{"name": "…", "title": "…", "description": "…", "backend": "…", "origin": "standard"}]}`,
	},
	ToolRunSetup: {
		Args:   `{"template": "default", "seed": 7}`,
		Answer: `{"run_id": "…", "seed": 7, "seed_from": "param", "as_of": "", "as_of_from": "none given", "source_date_epoch": 0, "python_hash_seed": 0, "triad": "…", "template": "default"}`,
	},
	ToolRunStatus: {
		Args:   `{}`,
		Answer: `{"run_id": "…", "status": "open", "steps": [{"step": 1, "tool": "tmp.write", "ok": true, "evaluation": "…", "score": "…", "duration_ms": "…"}], "artifacts": "…"}`,
	},
}

func describe(name, what string) string {
	ex := examples[name]
	return what + "\n\nExample: " + ex.Args + "\nAnswer " + wildcardExplain + ": " + ex.Answer
}

// addTool registers a tool whose failures become error results in the one
// shape (see toolErr).
func addTool[In, Out any](s *Server, t *sdk.Tool, h func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error)) {
	sdk.AddTool(s.mcp, t, func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		ctx = auth.With(ctx, principal(req))
		res, out, err := h(ctx, req, in)
		if err != nil {
			var zero Out
			return nil, zero, s.toolErr(ctx, t.Name, err)
		}
		return res, out, nil
	})
}

// result starts a successful result; _meta names the run the call worked
// in, so a client can hand it to an operator (GET /cel with X-Run-Id).
func result(run runid.ID) *sdk.CallToolResult {
	return &sdk.CallToolResult{Meta: sdk.Meta{metaRunID: run.String()}}
}

// jsonText is the structured answer as text content, for clients that
// read only content. The SDK adds it by itself unless the result has other
// content (images), in which case we add it first.
func jsonText(v any) (*sdk.TextContent, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &sdk.TextContent{Text: string(b)}, nil
}

func ptr[T any](v T) *T { return &v }

func (s *Server) addTools() {
	addTool(s, &sdk.Tool{
		Name:  ToolExec,
		Title: "Run Python (sandbox.exec)",
		Description: describe(ToolExec, "Run a Python cell in this run's persistent, jailed Jupyter kernel (no network). Variables, imports and files persist between calls; "+
			"the working directory holds the run's files. Answers stdout, stderr, the last expression's value (result), display outputs and the files the cell wrote. "+
			"Plots (matplotlib inline, IPython display) come back as image content too. Long output is cut with truncated:true and kept whole in stdout_file. "+
			"A cell that raises comes back with isError:true and ok:false, error {kind, ename, evalue, traceback, message, suggestion}; its earlier output and files are still there."),
		InputSchema:  schemaFor[execArgs](true),
		OutputSchema: schemaFor[wire.ExecResponse](false),
		Annotations:  &sdk.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, s.exec)

	addTool(s, &sdk.Tool{
		Name:         ToolRestart,
		Title:        "Restart the kernel",
		Description:  describe(ToolRestart, "Restart this run's kernel: its variables are lost, its files stay. Use it when the kernel is wedged or its state is confused."),
		InputSchema:  schemaFor[struct{ runArg }](true),
		OutputSchema: schemaFor[wire.RestartResponse](false),
		Annotations:  &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.restart)

	addTool(s, &sdk.Tool{
		Name:  ToolSearch,
		Title: "Search the web (browser.search)",
		Description: describe(ToolSearch, "Search the web (Tavily). Answers results {url, title, snippet, published_at, content} and citations_id, the sha256 of the raw answer kept in the run under citations/ for audit and replay. "+
			"Save what you need with tmp_write or read it from citations/ in a cell."),
		InputSchema:  schemaFor[searchArgs](true),
		OutputSchema: schemaFor[wire.SearchResponse](false),
		Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, s.search)

	addTool(s, &sdk.Tool{
		Name:  ToolWrite,
		Title: "Write a run file (tmp.write)",
		Description: describe(ToolWrite, "Write a file into the run: text for UTF-8 content or bytes_b64 for binary (exactly one). The next cell sees it in its working directory. "+
			"Paths are relative, without .. or a leading /; CEL.md and the journal's files are reserved."),
		InputSchema:  schemaFor[writeArgs](true),
		OutputSchema: schemaFor[wire.FileRef](false),
		Annotations:  &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.write)

	addTool(s, &sdk.Tool{
		Name:  ToolRead,
		Title: "Read a run file (tmp.read)",
		Description: describe(ToolRead, "Read a run file: text when it is UTF-8, else bytes_b64. Images also come back as image content. "+
			"Files over the inline limit are refused; read big files in a cell instead."),
		InputSchema:  schemaFor[pathArgs](true),
		OutputSchema: schemaFor[wire.ReadResponse](false),
		Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.read)

	addTool(s, &sdk.Tool{
		Name:         ToolList,
		Title:        "List run files (tmp.list)",
		Description:  describe(ToolList, "List the run's files under a prefix (all of them without one), with size, sha256 and modification time."),
		InputSchema:  schemaFor[listArgs](true),
		OutputSchema: schemaFor[wire.ListResponse](false),
		Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.list)

	addTool(s, &sdk.Tool{
		Name:         ToolDelete,
		Title:        "Delete a run file (tmp.delete)",
		Description:  describe(ToolDelete, "Delete a run file, from the run and from the kernel's working directory. The journal's files are reserved."),
		InputSchema:  schemaFor[pathArgs](true),
		OutputSchema: schemaFor[wire.OK](false),
		Annotations:  &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, s.delete)

	addTool(s, &sdk.Tool{
		Name:  ToolJournal,
		Title: "Read the journal (CEL.md)",
		Description: describe(ToolJournal, "Read the run's journal, CEL.md, as Markdown: one Step Block per tool call (inputs, artifacts with sha256, next steps, the evaluator's verdict) and operator notes. "+
			"Read it to recover context: what was done, where each artifact is, what failed."),
		InputSchema: schemaFor[struct{ runArg }](true),
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.journal)

	addTool(s, &sdk.Tool{
		Name:         ToolNote,
		Title:        "Add a journal note",
		Description:  describe(ToolNote, "Append a note to the run's journal (CEL.md). The next Step Block records that it saw the note."),
		InputSchema:  schemaFor[noteArgs](true),
		OutputSchema: schemaFor[wire.OK](false),
		Annotations:  &sdk.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, s.note)

	addTool(s, &sdk.Tool{
		Name:  ToolRecipe,
		Title: "Run a recipe",
		Description: describe(ToolRecipe, "Start a recipe (a predefined workflow of searches, cells and writes; recipe_list names them) in its own run and answer at once with its run_id. "+
			"Follow it with run_status, journal_read, tmp_list and tmp_read, passing that run_id. Same body as POST /run."),
		InputSchema:  schemaFor[runner.Request](true),
		OutputSchema: schemaFor[wire.RecipeRunStarted](false),
		Annotations:  &sdk.ToolAnnotations{OpenWorldHint: ptr(true)},
	}, s.recipe)

	addTool(s, &sdk.Tool{
		Name:         ToolRecipes,
		Title:        "List recipes",
		Description:  describe(ToolRecipes, "List the recipes recipe_run can start, with what each does and which sandbox it needs. Same answer as GET /recipes."),
		InputSchema:  schemaFor[struct{}](true),
		OutputSchema: schemaFor[wire.RecipeList](false),
		Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.recipeList)

	addTool(s, &sdk.Tool{
		Name:  ToolRunSetup,
		Title: "Set up the run's sandbox",
		Description: describe(ToolRunSetup, "Choose, before the run's first call, what its kernel starts from: a sandbox template (an image with extra packages, limits and an egress policy; "+
			"an unknown name is refused with the names there are), a narrower egress policy than the template's (hosts by name; never wider), the seed and the as_of date. "+
			"Without it a run gets the default template, seed 0 and no as_of. Same as POST /runs's body."),
		InputSchema:  schemaFor[setupArgs](true),
		OutputSchema: schemaFor[wire.RunSetup](false),
		Annotations:  &sdk.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.runSetup)

	addTool(s, &sdk.Tool{
		Name:  ToolRunStatus,
		Title: "Run status",
		Description: describe(ToolRunStatus, "Report a run (this session's, or the one run_id names, such as a recipe run): its status (open for a session's run; queued, running, succeeded or failed for a recipe run), "+
			"each tool call's outcome and evaluation, a recipe run's steps, and the artifact index. Same answer as GET /runs/{id}."),
		InputSchema:  schemaFor[struct{ runArg }](true),
		OutputSchema: schemaFor[wire.RunView](false),
		Annotations:  &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.runStatus)
}

func (s *Server) exec(ctx context.Context, req *sdk.CallToolRequest, in execArgs) (*sdk.CallToolResult, wire.ExecResponse, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.ExecResponse{}, err
	}
	out, err := s.orch.ExecStream(ctx, run, in.ExecRequest, s.progress(ctx, req))
	if err != nil {
		return nil, out, err
	}
	res := result(run)
	// A cell that raised, timed out or killed its kernel is an error the
	// agent must notice: isError, with the whole answer still structured.
	res.IsError = !out.OK
	text, err := jsonText(out)
	if err != nil {
		return nil, out, err
	}
	res.Content = append([]sdk.Content{text}, s.images(ctx, out)...)
	return res, out, nil
}

// progress returns the output callback for a sandbox_exec whose client
// asked for progress (a progressToken in _meta): each stdout or stderr chunk
// and each display becomes a notifications/progress whose message is the
// text, so a client can show the cell's output as it runs. Without a token
// it returns nil and the call streams nothing.
func (s *Server) progress(ctx context.Context, req *sdk.CallToolRequest) func(orchestrator.ExecEvent) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	var n float64
	return func(e orchestrator.ExecEvent) {
		msg := e.Text
		switch e.Type {
		case wire.EventStdout, wire.EventStderr:
		case wire.EventDisplay, wire.EventResult:
			if t, ok := e.Bundle.Data["text/plain"].(string); ok {
				msg = t
			} else {
				msg = "(" + e.Type + ")"
			}
		default:
			return
		}
		n++
		if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg}); err != nil {
			s.log.DebugContext(ctx, "progress notification", "err", err)
		}
	}
}

func (s *Server) restart(ctx context.Context, req *sdk.CallToolRequest, in struct{ runArg }) (*sdk.CallToolResult, wire.RestartResponse, error) {
	var out wire.RestartResponse
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, out, err
	}
	if err := s.orch.Restart(ctx, run); err != nil {
		return nil, out, err
	}
	out = wire.RestartResponse{OK: true, Kernel: wire.RestartKernel{Restarted: true}}
	return result(run), out, nil
}

func (s *Server) search(ctx context.Context, req *sdk.CallToolRequest, in searchArgs) (*sdk.CallToolResult, wire.SearchResponse, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.SearchResponse{}, err
	}
	out, err := s.orch.Search(ctx, run, in.SearchRequest, orchestrator.SearchOptions{})
	return result(run), out, err
}

func (s *Server) write(ctx context.Context, req *sdk.CallToolRequest, in writeArgs) (*sdk.CallToolResult, wire.FileRef, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.FileRef{}, err
	}
	out, err := s.orch.Write(ctx, run, in.WriteRequest)
	return result(run), out, err
}

func (s *Server) read(ctx context.Context, req *sdk.CallToolRequest, in pathArgs) (*sdk.CallToolResult, wire.ReadResponse, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.ReadResponse{}, err
	}
	out, err := s.orch.Read(ctx, run, in.Path)
	if err != nil {
		return nil, out, err
	}
	res := result(run)
	if img := imageOf(out); img != nil {
		text, err := jsonText(out)
		if err != nil {
			return nil, out, err
		}
		res.Content = []sdk.Content{text, img}
	}
	return res, out, nil
}

func (s *Server) list(ctx context.Context, req *sdk.CallToolRequest, in listArgs) (*sdk.CallToolResult, wire.ListResponse, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.ListResponse{}, err
	}
	out, err := s.orch.List(ctx, run, in.Prefix)
	return result(run), out, err
}

func (s *Server) delete(ctx context.Context, req *sdk.CallToolRequest, in pathArgs) (*sdk.CallToolResult, wire.OK, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.OK{}, err
	}
	out, err := s.orch.Delete(ctx, run, in.Path)
	return result(run), out, err
}

// journal answers CEL.md as text content, as GET /cel answers it as
// text/markdown; there is no structured form.
func (s *Server) journal(ctx context.Context, req *sdk.CallToolRequest, in struct{ runArg }) (*sdk.CallToolResult, any, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, nil, err
	}
	b, err := s.orch.Journal(ctx, run)
	if err != nil {
		return nil, nil, err
	}
	res := result(run)
	res.Content = []sdk.Content{&sdk.TextContent{Text: string(b)}}
	return res, nil, nil
}

func (s *Server) note(ctx context.Context, req *sdk.CallToolRequest, in noteArgs) (*sdk.CallToolResult, wire.OK, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.OK{}, err
	}
	if err := s.orch.Note(ctx, run, in.Text, in.Author); err != nil {
		return nil, wire.OK{}, err
	}
	return result(run), wire.OK{OK: true}, nil
}

func (s *Server) needRunner() error {
	if s.recipes == nil {
		return fault.New(fault.NotConfigured, "recipes are not available on this server",
			"make the calls yourself with sandbox_exec, browser_search and tmp_write, or start triad with a sandbox (--sandbox docker, wasm or auto)")
	}
	return nil
}

func (s *Server) recipe(ctx context.Context, req *sdk.CallToolRequest, in wire.RecipeRunRequest) (*sdk.CallToolResult, wire.RecipeRunStarted, error) {
	var out wire.RecipeRunStarted
	if err := s.needRunner(); err != nil {
		return nil, out, err
	}
	st, err := s.recipes.Start(ctx, in)
	if err != nil {
		return nil, out, err
	}
	return result(runid.Must(st.RunID)), runner.Started(st), nil
}

func (s *Server) recipeList(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, wire.RecipeList, error) {
	out := wire.RecipeList{Recipes: []wire.RecipeInfo{}}
	if err := s.needRunner(); err != nil {
		return nil, out, err
	}
	return &sdk.CallToolResult{}, s.recipes.Recipes(), nil
}

// runStatus answers as GET /runs/{id} does: the journal's view of every
// call, with the recipe runner's state on top for a recipe run.
func (s *Server) runStatus(ctx context.Context, req *sdk.CallToolRequest, in struct{ runArg }) (*sdk.CallToolResult, wire.RunView, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.RunView{}, err
	}
	view, err := runner.View(ctx, s.orch, s.recipes, run)
	if err != nil {
		return nil, view, err
	}
	return result(run), view, nil
}

func (s *Server) runSetup(ctx context.Context, req *sdk.CallToolRequest, in setupArgs) (*sdk.CallToolResult, wire.RunSetup, error) {
	run, err := s.run(req, in.RunID)
	if err != nil {
		return nil, wire.RunSetup{}, err
	}
	setup, _ := in.Setup()
	st, err := s.orch.SetRunSetup(ctx, run, setup)
	if err != nil {
		return nil, st, err
	}
	return result(run), st, nil
}
