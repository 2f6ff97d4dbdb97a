package mcp

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// childImage, when set, makes the test binary an MCP server on its own
// stdin and stdout (the way triad mcp runs) with the Docker sandbox on
// this image, instead of running tests.
const childImage = "TRIAD_MCP_TEST_CHILD_IMAGE"

func TestMain(m *testing.M) {
	if tag := os.Getenv(childImage); tag != "" {
		os.Exit(stdioChild(tag))
	}
	os.Exit(m.Run())
}

// stdioChild serves one MCP session on stdio over a real stack, then
// cleans up. Its exit status is the parent's verdict on the child.
func stdioChild(tag string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "triad-mcp-child-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	blobs, err := local.NewBlobs(dir)
	if err != nil {
		return fail(err)
	}
	idx, err := local.NewIndex(dir)
	if err != nil {
		return fail(err)
	}
	defer idx.Close()
	store := tmpfs.New(blobs, idx, log)
	b, err := docker.New(context.Background(), docker.Config{Image: tag, WorkRoot: filepath.Join(dir, "work"), Logger: log, Runtime: testenv.DockerRuntime()})
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	km := kernels.New(kernels.Config{Backend: b, Store: store, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint, Logger: log})
	defer km.Close()
	orch := orchestrator.New(orchestrator.Config{Store: store, Kernels: km, Journal: cel.New(store), Logger: log})
	defer orch.Close()
	srv := New(Config{Orchestrator: orch, Logger: log})
	defer srv.Close()
	if err := srv.ServeStdio(context.Background()); err != nil {
		return fail(err)
	}
	return 0
}

// lockedBuffer collects the child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStdioProcess starts a server process and talks to it over its real
// stdin and stdout with the SDK's CommandTransport, as Claude Desktop runs
// "triad mcp": one process, one session, one run with a persistent kernel.
func TestStdioProcess(t *testing.T) {
	tag := sandboxImage(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childImage+"="+tag)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs, err := newClient().Connect(t.Context(), &sdk.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		t.Fatalf("connect to the server process: %v\n%s", err, stderr.String())
	}
	closed := false
	defer func() {
		if !closed {
			cs.Close()
		}
	}()

	res := call(t, cs, ToolExec, map[string]any{"code": "x = 21"})
	run := runOf(t, res)
	ok[wire.ExecResponse](t, res)
	out := ok[wire.ExecResponse](t, call(t, cs, ToolExec, map[string]any{"code": "x*2"}))
	if out.Result == nil || out.Result.Data["text/plain"] != "42" {
		t.Errorf("x*2: got %+v, want 42", out.Result)
	}
	ok[wire.FileRef](t, call(t, cs, ToolWrite, map[string]any{"path": "a.txt", "text": "α"}))
	read := ok[wire.ReadResponse](t, call(t, cs, ToolRead, map[string]any{"path": "a.txt"}))
	if read.Text == nil || *read.Text != "α" {
		t.Errorf("got %+v, want α back", read)
	}
	if e := failed(t, call(t, cs, ToolRead, map[string]any{"path": "../../etc/passwd"})); e.Kind != fault.BadInput {
		t.Errorf("../../etc/passwd: got kind %s, want bad_input", e.Kind)
	}
	res = call(t, cs, ToolExec, map[string]any{"code": "1/0"})
	if out := decode[wire.ExecResponse](t, res); !res.IsError || out.OK || out.Error == nil || out.Error.Ename != "ZeroDivisionError" {
		t.Errorf("1/0: got isError %v, %+v, want an error result with ZeroDivisionError", res.IsError, out)
	}
	res = call(t, cs, ToolJournal, map[string]any{})
	if runOf(t, res) != run {
		t.Errorf("got run %s, want the process's one run %s", runOf(t, res), run)
	}
	var tools []string
	for _, m := range regexp.MustCompile(`(?m)^## Step \d+: (\S+)$`).FindAllStringSubmatch(text(res), -1) {
		tools = append(tools, m[1])
	}
	if diff := cmp.Diff([]string{"sandbox.exec", "sandbox.exec", "tmp.write", "tmp.read", "sandbox.exec"}, tools); diff != "" {
		t.Errorf("Step Blocks differ (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(run, "mcp-") {
		t.Errorf("got run %q, want an mcp- run", run)
	}

	// Closing stdin ends the session; the server cleans up and exits 0.
	closed = true
	if err := cs.Close(); err != nil {
		t.Errorf("the server process did not end cleanly: %v\n%s", err, stderr.String())
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("server process: %v\n%s", cmd.ProcessState, stderr.String())
	}
}
