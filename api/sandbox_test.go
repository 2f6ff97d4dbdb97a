package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

func sandboxServer(t *testing.T, backend string) *client {
	// The tests expect an interruptible cell to keep its kernel, so the
	// grace is long enough for a loaded host to deliver the interrupt.
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: backend, Warm: 1, InterruptGrace: 30 * time.Second})
	return apiServer(t, api.Config{Orchestrator: s.Orch})
}

func (c *client) exec(run string, in map[string]any) (wire.ExecResponse, answer) {
	c.t.Helper()
	a := c.post("/sandbox/exec", run, in)
	var out wire.ExecResponse
	if a.status == 200 {
		a.json(c.t, &out)
	}
	return out, a
}

// The sandbox through HTTP, on each backend: state, output, errors, files
// shared with tmp.*, images by hash, isolation, symlinks, timeouts.
func TestSandboxExecOverHTTP(t *testing.T) {
	for _, backend := range []string{"docker", "wasm"} {
		t.Run(backend, func(t *testing.T) {
			c := sandboxServer(t, backend)
			const run = "r-exec"
			if out, _ := c.exec(run, map[string]any{"code": "x = 21"}); !out.OK || out.Kernel.Backend != backend {
				t.Fatalf("x = 21: %+v", out)
			}
			out, _ := c.exec(run, map[string]any{"code": "x*2"})
			if out.Result == nil || out.Result.Data["text/plain"] != "42" {
				t.Fatalf("x*2: got %+v, want 42", out.Result)
			}
			if out, _ := c.exec("r-other", map[string]any{"code": "x"}); out.OK || out.Error == nil || out.Error.Ename != "NameError" {
				t.Fatalf("another run sees x: %+v", out)
			}
			if out, _ := c.exec(run, map[string]any{"code": "print('hello')"}); out.Stdout != "hello\n" {
				t.Fatalf("print: %+v", out)
			}
			out, _ = c.exec(run, map[string]any{"code": "1/0"})
			if out.OK || out.Error == nil || out.Error.Ename != "ZeroDivisionError" || len(out.Error.Traceback) == 0 || out.Error.Suggestion == "" {
				t.Fatalf("1/0: %+v", out.Error)
			}
			// A cell's file is in files_out with the sha256 tmp.read reports.
			out, _ = c.exec(run, map[string]any{"code": "import csv\nwith open('out.csv','w', newline='') as f:\n    csv.writer(f).writerows([['a','b'],[1,2]])"})
			if !out.OK || len(out.FilesOut) != 1 || out.FilesOut[0].Path != "out.csv" {
				t.Fatalf("out.csv: %+v", out)
			}
			var rd wire.ReadResponse
			c.do("GET", "/tmp/read?path=out.csv", run, nil).json(t, &rd)
			if rd.SHA256 != out.FilesOut[0].SHA256 || rd.Text == nil || !strings.HasPrefix(*rd.Text, "a,b") {
				t.Fatalf("tmp.read says %+v, files_out says %+v", rd, out.FilesOut[0])
			}
			// A file from tmp.write opens in the next cell.
			c.write(run, "in/notes.txt", "from tmp.write")
			if out, _ := c.exec(run, map[string]any{"code": "print(open('in/notes.txt').read())"}); out.Stdout != "from tmp.write\n" {
				t.Fatalf("tmp.write file in the kernel: %+v", out)
			}
			// files_in by path and by hash.
			out, _ = c.exec(run, map[string]any{"code": "print(open('copy.txt').read(), open('byhash.txt').read())",
				"files_in": []map[string]string{{"name": "copy.txt", "path": "in/notes.txt"}, {"name": "byhash.txt", "path": "sha256:" + rd.SHA256.String()}}})
			if !strings.HasPrefix(out.Stdout, "from tmp.write a,b") {
				t.Fatalf("files_in: %+v", out)
			}
			// A symlink to a host secret is never served.
			c.exec(run, map[string]any{"code": "import os\ntry:\n    os.symlink('/etc/shadow', 'shadow')\nexcept OSError as e:\n    print('refused', e)"})
			for name, a := range map[string]answer{
				"read": c.do("GET", "/tmp/read?path=shadow", run, nil),
				"raw":  c.do("GET", "/tmp/files/shadow", run, nil),
			} {
				if a.status != 404 || bytes.Contains(a.body, []byte("root:")) {
					t.Errorf("%s of the symlink: %d %s", name, a.status, a.body)
				}
			}
			if files := c.list(run, ""); strings.Contains(listPaths(files), "shadow") {
				t.Errorf("tmp.list shows the symlink: %s", listPaths(files))
			}
			// Bad inputs are 400s.
			for _, in := range []map[string]any{
				{"code": ""}, {"code": "1", "language": "cobol"}, {"code": "1", "timeout_s": -1},
				{"code": "1", "files_in": []map[string]string{{"name": "../x", "path": "out.csv"}}},
			} {
				if _, a := c.exec(run, in); a.status != 400 {
					t.Errorf("%v: got %d %s, want 400", in, a.status, a.body)
				}
			}
			if _, a := c.exec(run, map[string]any{"code": "1", "files_in": []map[string]string{{"name": "x", "path": "nope.csv"}}}); a.status != 404 {
				t.Errorf("files_in of a missing file: got %d %s, want 404", a.status, a.body)
			}
			// Timeout: answers, and the run can exec again.
			out, _ = c.exec(run, map[string]any{"code": "while True: pass", "timeout_s": 2})
			if out.OK || out.Error == nil || out.Error.Kind != "timeout" {
				t.Fatalf("timeout: %+v", out.Error)
			}
			next, _ := c.exec(run, map[string]any{"code": "1+1"})
			if next.Result == nil || next.Result.Data["text/plain"] != "2" {
				t.Fatalf("after a timeout: %+v", next)
			}
			if backend == "docker" && out.Kernel.Restarted {
				t.Error("docker: an interruptible loop should not need a restart")
			}
			if backend == "docker" {
				if v, _ := c.exec(run, map[string]any{"code": "x"}); v.Result == nil || v.Result.Data["text/plain"] != "21" {
					t.Fatalf("docker: x lost after an interrupted timeout: %+v", v)
				}
			} else if !out.Kernel.Restarted {
				t.Error("wasm: a timeout closes the instance, so kernel.restarted must be true")
			}
		})
	}
}

func listPaths(files any) string {
	b, _ := json.Marshal(files)
	return string(b)
}

// A matplotlib figure comes back as an image/png reference that downloads
// through /blobs; two runs in parallel keep separate state and files.
func TestSandboxImagesAndParallelRuns(t *testing.T) {
	c := sandboxServer(t, "docker")
	out, _ := c.exec("r-plot", map[string]any{"code": "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1,3,2])\nplt.show()"})
	if !out.OK || len(out.Display) != 1 {
		t.Fatalf("plot: %+v", out)
	}
	ref, ok := out.Display[0].Data["image/png"].(map[string]any)
	if !ok {
		t.Fatalf("display: %+v", out.Display[0].Data)
	}
	a := c.do("GET", "/blobs/"+ref["sha256"].(string), "r-plot", nil)
	if a.status != 200 || !bytes.HasPrefix(a.body, []byte("\x89PNG\r\n\x1a\n")) || float64(len(a.body)) != ref["size"].(float64) {
		t.Fatalf("/blobs of the plot: %d, %d bytes", a.status, len(a.body))
	}
	var wg sync.WaitGroup
	res := make([]string, 2)
	for i, run := range []string{"r-par-a", "r-par-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.exec(run, map[string]any{"code": "v = '" + run + "'\nopen('who.txt','w').write(v)"})
			o, _ := c.exec(run, map[string]any{"code": "print(v, open('who.txt').read())"})
			res[i] = o.Stdout
		}()
	}
	wg.Wait()
	if res[0] != "r-par-a r-par-a\n" || res[1] != "r-par-b r-par-b\n" {
		t.Fatalf("parallel runs mixed state: %q", res)
	}
	if a := c.do(http.MethodGet, "/tmp/read?path=who.txt", "r-par-a", nil); !bytes.Contains(a.body, []byte("r-par-a")) {
		t.Fatalf("run A's file: %s", a.body)
	}
}

// POST /sandbox/exec with Accept: text/event-stream streams the cell's
// prints as separate events while it runs, and its last event equals the
// answer the plain call gives for the same cell.
func TestSandboxExecSSE(t *testing.T) {
	c := sandboxServer(t, "docker")
	code := "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.5)\n'end'"
	body, _ := json.Marshal(map[string]any{"code": code})
	req, _ := http.NewRequest(http.MethodPost, c.url+"/sandbox/exec", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", "r-sse")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("got %d %s, want 200 text/event-stream", resp.StatusCode, ct)
	}
	type event struct{ name, data string }
	var events []event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var cur event
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "" && cur.name != "":
			events = append(events, cur)
			cur = event{}
		}
	}
	var prints []string
	for _, e := range events[:len(events)-1] {
		if e.name == "stdout" {
			var ev wire.ExecEvent
			json.Unmarshal([]byte(e.data), &ev)
			prints = append(prints, ev.Text)
		}
	}
	if strings.Join(prints, "|") != "0\n|1\n|2\n" {
		t.Errorf("got stdout events %q, want one per print before the end", prints)
	}
	last := events[len(events)-1]
	if last.name != "done" {
		t.Fatalf("last event %q %s, want done", last.name, last.data)
	}
	var streamed wire.ExecResponse
	if err := json.Unmarshal([]byte(last.data), &streamed); err != nil {
		t.Fatal(err)
	}
	plain, a := c.exec("r-plain", map[string]any{"code": code})
	if a.status != 200 {
		t.Fatalf("plain: %d %s", a.status, a.body)
	}
	streamed.DurationMs, plain.DurationMs = 0, 0
	if diff := cmp.Diff(plain, streamed); diff != "" {
		t.Errorf("the streamed answer differs from the plain one (-plain +streamed):\n%s", diff)
	}
}
