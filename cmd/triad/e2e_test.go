package main_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox/docker"
)

// buildTriad builds the binary once per test.
func buildTriad(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "triad")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
	// key is sent with every request: the suite runs with authentication
	// on, as a server on any address but loopback must.
	key string
}

// createKey makes an API key with the real binary, as an operator would:
// triad keys create over the server's data directory.
func createKey(t *testing.T, bin, data string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"keys", "create", "--data", data}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("triad keys create: %v\n%s", err, stderr.String())
	}
	key := strings.TrimSpace(string(out))
	if !strings.HasPrefix(key, "trd_") || strings.Contains(key, "\n") {
		t.Fatalf("triad keys create printed %q, want one trd_ key", out)
	}
	return key
}

// do sends req with the server's key.
func (s *server) do(req *http.Request) (*http.Response, error) {
	if s.key != "" {
		req.Header.Set("Authorization", "Bearer "+s.key)
	}
	return http.DefaultClient.Do(req)
}

func (s *server) get(path, run string) *http.Response {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+path, nil)
	if run != "" {
		req.Header.Set("X-Run-Id", run)
	}
	resp, err := s.do(req)
	if err != nil {
		s.t.Fatalf("GET %s: %v\n%s", path, err, s.logs)
	}
	return resp
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServer runs `triad serve` with a key of its own (made once per data
// directory) and waits until it answers.
func startServer(t *testing.T, bin, data string, extra ...string) *server {
	t.Helper()
	key := keys[data]
	if key == "" {
		key = createKey(t, bin, data, "--name", "e2e")
		keys[data] = key
	}
	s := launch(t, bin, data, extra...)
	s.key = key
	return s
}

var keys = map[string]string{}

// launch runs `triad serve` and waits until /healthz answers.
func launch(t *testing.T, bin, data string, extra ...string) *server {
	t.Helper()
	addr := freeAddr(t)
	args := append([]string{"serve", "--addr", addr, "--data", data}, extra...)
	cmd := exec.Command(bin, args...)
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, url: "http://" + addr, logs: logs}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
			}
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if r, err := http.Get(s.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("triad serve did not answer:\n%s", logs)
	return nil
}

func (s *server) json(method, path string, body any, out any) int {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	resp, err := s.do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", method, path, err, s.logs)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

type runView struct {
	Status      string `json:"status"`
	Error       string `json:"error"`
	Resumes     int    `json:"resumes"`
	RecipeSteps []struct {
		N      int    `json:"n"`
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"recipe_steps"`
	Artifacts []struct {
		Path string `json:"path"`
	} `json:"artifacts"`
}

func dockerClient(t *testing.T) *client.Client {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cli.Ping(ctx)
		cancel()
	}
	if err != nil {
		testenv.Missing(t, "a Docker engine (dockerd)")
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func containers(t *testing.T, cli *client.Client, label string) []container.Summary {
	t.Helper()
	l, err := cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Killing triad with SIGKILL mid-run leaks no container, loses no file, and
// resuming the run completes it without re-running finished steps; the
// resume shows in the run's status and its journal.
func TestKillMidRunAndResume(t *testing.T) {
	cli := dockerClient(t)
	bin := buildTriad(t)
	data := t.TempDir()
	s := startServer(t, bin, data, "--sandbox", "docker", "--warm", "1")
	var started struct {
		RunID string `json:"run_id"`
	}
	if code := s.json("POST", "/run", map[string]any{"recipe": "sales-reallocation"}, &started); code != 202 {
		t.Fatalf("POST /run: %d", code)
	}
	run := started.RunID
	// Wait until step 4 runs: steps 1-3 are done.
	var v runView
	deadline := time.Now().Add(5 * time.Minute)
	for {
		s.json("GET", "/runs/"+run, nil, &v)
		if len(v.RecipeSteps) > 3 && v.RecipeSteps[3].Status == "running" {
			break
		}
		if v.Status == "failed" || v.Status == "succeeded" || time.Now().After(deadline) {
			t.Fatalf("run reached %s before step 4: %+v", v.Status, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The backend labels its containers with a hash of its work root.
	sum := sha256.Sum256([]byte(filepath.Join(data, "work", "docker")))
	rootLabel := docker.LabelRoot + "=" + hex.EncodeToString(sum[:8])
	if len(containers(t, cli, rootLabel)) == 0 {
		t.Fatal("no container carries the server's root label")
	}
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.cmd.Wait()

	restart := time.Now()
	s2 := startServer(t, bin, data, "--sandbox", "docker", "--warm", "1")
	for _, c := range containers(t, cli, rootLabel) {
		if time.Unix(c.Created, 0).Before(restart.Add(-time.Second)) {
			t.Errorf("container %s from the killed process was left behind (%s)", c.ID[:12], c.State)
		}
	}
	s2.json("GET", "/runs/"+run, nil, &v)
	if v.Status != "failed" || !strings.Contains(v.Error, "interrupted") {
		t.Fatalf("after the kill: got status %s %q, want failed/interrupted", v.Status, v.Error)
	}
	var files struct {
		Files []struct{ Path string } `json:"files"`
	}
	resp := s2.get("/tmp/list?prefix=data/", run)
	json.NewDecoder(resp.Body).Decode(&files)
	resp.Body.Close()
	if len(files.Files) < 2 {
		t.Fatalf("the run's input files did not survive the kill: %+v", files)
	}

	if code := s2.json("POST", "/run", map[string]any{"run_id": run}, &started); code != 202 {
		t.Fatalf("resume: %d", code)
	}
	// Follow the events until the run ends.
	er := s2.get("/runs/"+run+"/events", "")
	sc := bufio.NewScanner(er.Body)
	sawSkip := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"status":"skipped"`) {
			sawSkip = true
		}
	}
	er.Body.Close()
	s2.json("GET", "/runs/"+run, nil, &v)
	if v.Status != "succeeded" || v.Resumes != 1 {
		t.Fatalf("after resume: %+v\n%s", v, s2.logs)
	}
	if !sawSkip {
		t.Error("the event stream showed no skipped step")
	}
	for i, st := range v.RecipeSteps {
		switch {
		case i == 0 && st.Status != "succeeded": // the parameters cell always runs
			t.Errorf("step 1 (parameters): got %s, want succeeded", st.Status)
		case i > 0 && i < 3 && st.Status != "skipped":
			t.Errorf("step %d (%s), finished before the kill: got %s, want skipped", st.N, st.ID, st.Status)
		case i >= 3 && st.Status != "succeeded":
			t.Errorf("step %d (%s): got %s, want succeeded", st.N, st.ID, st.Status)
		}
	}
	resp = s2.get("/cel", run)
	cel, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(cel, []byte("Resumed (resume 1): skipped step(s) 2 (")) {
		t.Errorf("the journal does not record the resume:\n%s", cel)
	}
	if len(v.Artifacts) < 5 {
		t.Errorf("got %d artifacts after resume", len(v.Artifacts))
	}
	// A clean shutdown leaves no container either.
	s2.cmd.Process.Signal(syscall.SIGTERM)
	waitErr := make(chan error, 1)
	go func() { waitErr <- s2.cmd.Wait() }()
	select {
	case <-waitErr:
	case <-time.After(60 * time.Second):
		t.Fatalf("triad did not shut down within 60 s:\n%s", s2.logs)
	}
	if left := containers(t, cli, rootLabel); len(left) != 0 {
		t.Errorf("%d container(s) left after a clean shutdown", len(left))
	}
	_ = fmt.Sprint
}

// On a machine without Docker, the binary alone gives a working Python
// sandbox: --sandbox auto falls back to the embedded wasm interpreter, and
// --sandbox wasm needs nothing either.
func TestServeWithoutDocker(t *testing.T) {
	bin := buildTriad(t)
	for _, mode := range []string{"auto", "wasm"} {
		t.Run(mode, func(t *testing.T) {
			addr := freeAddr(t)
			dir := t.TempDir()
			key := createKey(t, bin, dir, "--name", "no-docker", "--scope", "runs")
			cmd := exec.Command(bin, "serve", "--addr", addr, "--data", dir, "--sandbox", mode)
			// No engine answers here, whatever the machine has.
			cmd.Env = append(os.Environ(), "DOCKER_HOST=unix:///nonexistent/docker.sock", "TAVILY_API_KEY=")
			logs := &bytes.Buffer{}
			cmd.Stdout, cmd.Stderr = logs, logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			s := &server{t: t, cmd: cmd, url: "http://" + addr, logs: logs}
			t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
			deadline := time.Now().Add(2 * time.Minute)
			for {
				if r, err := http.Get(s.url + "/healthz"); err == nil {
					r.Body.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no answer:\n%s", logs)
				}
				time.Sleep(100 * time.Millisecond)
			}
			exec1 := func(code string) map[string]any {
				b, _ := json.Marshal(map[string]any{"code": code})
				req, _ := http.NewRequest("POST", s.url+"/sandbox/exec", bytes.NewReader(b))
				req.Header.Set("X-Run-Id", "r-nodocker")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var out map[string]any
				json.NewDecoder(resp.Body).Decode(&out)
				return out
			}
			exec1("x = 21")
			out := exec1("x*2")
			kernel, _ := out["kernel"].(map[string]any)
			result, _ := out["result"].(map[string]any)
			data, _ := result["data"].(map[string]any)
			if kernel["backend"] != "wasm" || data["text/plain"] != "42" {
				t.Fatalf("got %v, want 42 from the wasm backend\n%s", out, logs)
			}
		})
	}
}
