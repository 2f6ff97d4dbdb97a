package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/runfiles"
)

// multi is a repeatable flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// runCmd is "triad run RECIPE": in-process with the embedded defaults, or
// against a server with --server.
func runCmd(ctx context.Context, args []string) error {
	var c config
	var params, inputs multi
	var server, resume, objective, out, key string
	fs := newFlagSet("run")
	c.common(fs)
	fs.str(&key, "api-key", "", "API key for --server (Authorization: Bearer)")
	fs.Var(&params, "param", "recipe param as name=value (repeatable)")
	fs.Var(&inputs, "input", "recipe input as name=FILE (repeatable)")
	fs.StringVar(&server, "server", "", "run on this triad server (e.g. http://127.0.0.1:8080) instead of in-process")
	fs.StringVar(&resume, "resume", "", "resume this failed or interrupted run id")
	fs.StringVar(&objective, "objective", "", "the run's objective (the recipe's objective param)")
	fs.StringVar(&out, "out", "", "copy the run's artifacts/ here when it ends (default triad-out/<run id>; \"-\" for none)")
	// Flags may follow the recipe name.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	if name == "" && resume == "" {
		return fmt.Errorf("usage: triad run RECIPE [--param k=v] [--input name=FILE] [--server URL] [--resume RUN_ID]; triad recipes lists them")
	}
	if err := c.validate(fs); err != nil {
		return err
	}
	req := runner.Request{Recipe: name, Objective: objective, RunID: resume, Params: map[string]any{}}
	inputFiles := map[string][]byte{}
	for _, in := range inputs {
		k, path, ok := strings.Cut(in, "=")
		if !ok {
			return fmt.Errorf("--input %q: want name=FILE", in)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--input %s: %w", k, err)
		}
		inputFiles[k] = b
	}
	if server != "" {
		return runRemote(ctx, remote{server: strings.TrimRight(server, "/"), key: key}, req, inputFiles, params, out)
	}
	st, _, err := open(ctx, &c)
	if err != nil {
		return err
	}
	defer st.Close()
	cat, rn := st.catalog, st.runner
	if rn == nil {
		return fmt.Errorf("recipes need a sandbox: use --sandbox docker, wasm or auto")
	}
	if len(params) > 0 {
		rec, err := cat.Get(name)
		if err != nil {
			return err
		}
		for _, kv := range params {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("--param %q: want name=value", kv)
			}
			val, err := rec.ParamFromText(k, v)
			if err != nil {
				return err
			}
			req.Params[k] = val
		}
	}
	fmt.Fprintf(os.Stderr, "triad: running recipe %s (data in %s)\n", orDefault(name, "(resumed)"), c.Data)
	final, err := rn.Run(ctx, req, inputFiles, printEvent)
	if err != nil {
		return err
	}
	rr, err := st.orch.ReadRun(context.WithoutCancel(ctx), runid.Must(final.RunID))
	if err != nil {
		return err
	}
	files, err := rr.List(context.WithoutCancel(ctx), runfiles.ArtifactsDir)
	if err != nil {
		return err
	}
	fmt.Printf("\nrun %s %s\n", final.RunID, final.Status)
	for _, f := range files {
		fmt.Printf("  %-48s %10d  sha256:%s\n", f.Path, f.Size, f.SHA256)
	}
	if out != "-" {
		if out == "" {
			out = filepath.Join("triad-out", final.RunID)
		}
		for _, f := range files {
			b, _, err := rr.ReadAll(ctx, f.Path)
			if err != nil {
				return err
			}
			dst := filepath.Join(out, filepath.FromSlash(f.Path))
			os.MkdirAll(filepath.Dir(dst), 0o755)
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				return err
			}
		}
		for _, extra := range []string{runfiles.Journal, runfiles.Notebook} {
			if b, _, err := rr.ReadAll(ctx, extra); err == nil {
				os.WriteFile(filepath.Join(out, extra), b, 0o644)
			}
		}
		fmt.Printf("artifacts, CEL.md and run.ipynb copied to %s\n", out)
	}
	if final.Status != runner.Succeeded {
		return fmt.Errorf("run %s %s: %s (resume it with: triad run --resume %s)", final.RunID, final.Status, final.Error, final.RunID)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func printEvent(e runner.Event) {
	ts := e.Time.Local().Format("15:04:05")
	switch e.Type {
	case "step":
		line := fmt.Sprintf("%s  step %2d  %-10s %s", ts, e.Step, e.Status, e.Title)
		if e.Error != "" {
			line += "\n           " + e.Error
		}
		fmt.Fprintln(os.Stderr, line)
	case "run":
		fmt.Fprintf(os.Stderr, "%s  run      %s %s\n", ts, e.Status, e.Error)
	}
}

// remote is a triad server and the key to call it with.
type remote struct{ server, key string }

func (r remote) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return r.doAs(ctx, method, path, "application/json", body)
}

// doAs sends a body of another media type than JSON.
func (r remote) doAs(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, r.server+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if r.key != "" {
		req.Header.Set("Authorization", "Bearer "+r.key)
	}
	return http.DefaultClient.Do(req)
}

// runRemote starts the run on a server and follows its events.
func runRemote(ctx context.Context, rm remote, req runner.Request, inputFiles map[string][]byte, params multi, out string) error {
	server := rm.server
	for _, kv := range params {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--param %q: want name=value", kv)
		}
		var val any
		if err := json.Unmarshal([]byte(v), &val); err != nil {
			val = v // not JSON: a string
		}
		req.Params[k] = val
	}
	body, _ := json.Marshal(req)
	var resp *http.Response
	var err error
	if len(inputFiles) > 0 {
		// The files go with the request, so the run is set up from them
		// before its first call.
		var form bytes.Buffer
		mw := multipart.NewWriter(&form)
		mw.WriteField("request", string(body))
		for name, data := range inputFiles {
			w, err := mw.CreateFormFile("input:"+name, name)
			if err != nil {
				return err
			}
			w.Write(data)
		}
		mw.Close()
		resp, err = rm.doAs(ctx, http.MethodPost, "/run", mw.FormDataContentType(), &form)
	} else {
		resp, err = rm.do(ctx, http.MethodPost, "/run", bytes.NewReader(body))
	}
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("POST /run: %d %s", resp.StatusCode, b)
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	json.Unmarshal(b, &started)
	fmt.Fprintf(os.Stderr, "triad: run %s started on %s\n", started.RunID, server)
	er, err := rm.do(ctx, http.MethodGet, "/runs/"+started.RunID+"/events", nil)
	if err == nil {
		sc := bufio.NewScanner(er.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && (event == "step" || event == "run"):
				var e runner.Event
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e) == nil {
					printEvent(e)
				}
			}
		}
		er.Body.Close()
	}
	for {
		resp, err := rm.do(ctx, http.MethodGet, "/runs/"+started.RunID, nil)
		if err != nil {
			return err
		}
		var v struct {
			Status    string `json:"status"`
			Error     string `json:"error"`
			Artifacts []struct {
				Path   string `json:"path"`
				Size   int64  `json:"size"`
				SHA256 string `json:"sha256"`
				URL    string `json:"url"`
			} `json:"artifacts"`
		}
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v.Status == runner.Queued || v.Status == runner.Running {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		sort.Slice(v.Artifacts, func(i, j int) bool { return v.Artifacts[i].Path < v.Artifacts[j].Path })
		fmt.Printf("\nrun %s %s\n", started.RunID, v.Status)
		for _, a := range v.Artifacts {
			fmt.Printf("  %-48s %10d  %s%s (X-Run-Id: %s)\n", a.Path, a.Size, server, a.URL, started.RunID)
		}
		if v.Status != runner.Succeeded {
			return fmt.Errorf("run %s %s: %s", started.RunID, v.Status, v.Error)
		}
		return nil
	}
}

// recipesCmd is "triad recipes [export NAME]".
func recipesCmd(ctx context.Context, args []string) error {
	var dir, outFile string
	fs := newFlagSet("recipes")
	fs.str(&dir, "recipes", "", "directory of user recipes (*.md) added to the standard ones")
	fs.StringVar(&outFile, "o", "", "with export: write the notebook here instead of NAME.ipynb")
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	var name string
	if sub == "export" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	cat, err := catalog(dir)
	if err != nil {
		return err
	}
	switch sub {
	case "", "list":
		for _, r := range cat.List() {
			fmt.Printf("%-22s %-7s %s\n", r.Name, r.Backend, r.Title)
		}
		return nil
	case "export":
		if name == "" {
			return fmt.Errorf("usage: triad recipes export NAME [-o FILE]")
		}
		r, err := cat.Get(name)
		if err != nil {
			return err
		}
		nb, err := recipes.ExportNotebook(r)
		if err != nil {
			return err
		}
		if outFile == "" {
			outFile = name + ".ipynb"
		}
		if err := os.WriteFile(outFile, nb, 0o644); err != nil {
			return err
		}
		fmt.Println(outFile)
		return nil
	}
	return fmt.Errorf("usage: triad recipes [list] | triad recipes export NAME [-o FILE]")
}

func catalog(dir string) (*recipes.Catalog, error) {
	var user []*recipes.Recipe
	if dir != "" {
		var err error
		if user, err = recipes.LoadDir(dir); err != nil {
			return nil, err
		}
	}
	return recipes.NewCatalog(user...)
}
