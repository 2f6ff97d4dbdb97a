package orchestrator_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// A bash command runs in the run's kernel container in the foreground:
// its output streams, its exit code is in the answer, what it wrote is
// harvested, and its Step Block says language bash.
func TestExecBash(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Warm: 1})
	ctx := t.Context()
	run := runid.New()
	var events []orchestrator.ExecEvent
	out, err := s.Orch.ExecStream(ctx, run, wire.ExecRequest{Language: "bash", Code: "echo hi && echo oops >&2 && exit 3"},
		func(e orchestrator.ExecEvent) { events = append(events, e) })
	if err != nil {
		t.Fatal(err)
	}
	if out.OK || out.ExitCode == nil || *out.ExitCode != 3 || out.Stdout != "hi\n" || out.Stderr != "oops\n" ||
		out.Error == nil || out.Error.Kind != wire.CellExitCode {
		t.Fatalf("got %+v (error %+v), want exit code 3, stdout hi, stderr oops, error kind exit_code", out, out.Error)
	}
	var streamed strings.Builder
	for _, e := range events {
		if e.Type == wire.EventStdout {
			streamed.WriteString(e.Text)
		}
	}
	if streamed.String() != "hi\n" {
		t.Errorf("stdout events: got %q, want hi", streamed.String())
	}

	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "import os\nos.makedirs('sub', exist_ok=True)"}); err != nil {
		t.Fatal(err)
	}
	out, err = s.Orch.Exec(ctx, run, wire.ExecRequest{Language: "bash", Code: `echo "$GREETING" > greeting.txt; pwd`,
		Env: map[string]string{"GREETING": "hello"}, Cwd: "sub"})
	if err != nil || !out.OK || !strings.HasSuffix(out.Stdout, "/sub\n") {
		t.Fatalf("got %+v, %v; want ok in /home/user/sub", out, err)
	}
	if len(out.FilesOut) != 1 || out.FilesOut[0].Path != "sub/greeting.txt" {
		t.Errorf("files_out: got %+v, want sub/greeting.txt", out.FilesOut)
	}
	if b, _, err := s.Store.ReadAll(ctx, run, "sub/greeting.txt"); err != nil || string(b) != "hello\n" {
		t.Errorf("stored sub/greeting.txt: got %q, %v", b, err)
	}

	cel := string(journal(t, s, run))
	if n := strings.Count(cel, "language=bash"); n != 2 {
		t.Errorf("Step Blocks with language bash: got %d, want 2\n%s", n, cel)
	}
	if !strings.Contains(cel, `env=\["GREETING"\]`) || strings.Contains(cel, "hello") {
		t.Errorf("the journal names the environment variables, never their values:\n%s", cel)
	}

	for _, bad := range []wire.ExecRequest{
		{Language: "bash", Code: "true", Cwd: "../etc"},
		{Language: "bash", Code: "true", Env: map[string]string{"A=B": "c"}},
		{Code: "1", Env: map[string]string{"A": "b"}},
		{Language: "ruby", Code: "1"},
	} {
		if _, err := s.Orch.Exec(ctx, run, bad); fault.From(err).Kind != fault.BadInput {
			t.Errorf("Exec(%+v): got %v, want bad_input", bad, err)
		}
	}
	// bash with a context runs in that context (the run's bash kernel, or
	// one made with NewContext): a context the run does not have is not
	// found, as for any language.
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Language: "bash", Code: "true", Context: "ctx-x"}); fault.From(err).Kind != fault.NotFound {
		t.Errorf("bash in an unknown context: got %v, want not_found", err)
	}
}

// The wasm sandbox has no processes: a bash command is unsupported, and
// the answer says what to do.
func TestExecBashOnWasm(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	_, err := s.Orch.Exec(t.Context(), runid.New(), wire.ExecRequest{Language: "bash", Code: "echo hi"})
	fe := fault.From(err)
	if fe.Kind != fault.Unsupported || !strings.Contains(fe.Suggestion, "--sandbox docker") {
		t.Fatalf("got %v (suggestion %q), want unsupported suggesting --sandbox docker", err, fe.Suggestion)
	}
	if _, err := s.Orch.StartCommand(t.Context(), runid.New(), wire.ExecRequest{Code: "echo hi"}, nil); fault.From(err).Kind != fault.Unsupported {
		t.Errorf("StartCommand on wasm: got %v, want unsupported", err)
	}
}

// A background command does not hold the run: a cell runs while it does
// and makes the file it waits for. Its start and its end are steps of the
// journal; killing it leaves the kernel and its variables alone.
func TestStartCommand(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Warm: 1})
	ctx := t.Context()
	run := runid.New()
	if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "x = 21"}); err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	streamed := make(chan struct{})
	c, err := s.Orch.StartCommand(ctx, run, wire.ExecRequest{Code: "echo waiting; while [ ! -e go ]; do sleep 0.05; done; echo went > went.txt"},
		func(e orchestrator.ExecEvent) {
			if e.Type == wire.EventStdout && stdout.Len() == 0 {
				close(streamed)
			}
			stdout.WriteString(e.Text)
		})
	if err != nil {
		t.Fatal(err)
	}
	<-streamed // its output arrives while it runs
	cell, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "open('go', 'w').close()\nx"})
	if err != nil || !cell.OK {
		t.Fatalf("a cell while the command runs: %+v, %v", cell, err)
	}
	out, err := c.Wait(ctx)
	if err != nil || !out.OK || out.ExitCode == nil || *out.ExitCode != 0 {
		t.Fatalf("wait: got %+v, %v; want exit code 0", out, err)
	}
	if stdout.String() != "waiting\n" || out.Stdout != "waiting\n" {
		t.Errorf("stdout: streamed %q, answered %q; want waiting", stdout.String(), out.Stdout)
	}
	// The command's file is harvested by whichever call ends first after
	// it was written: the cell's, or the command's end.
	if n := len(cell.FilesOut) + len(out.FilesOut); n != 2 || !slices.ContainsFunc(append(cell.FilesOut, out.FilesOut...), func(f wire.FileRef) bool { return f.Path == "went.txt" }) {
		t.Errorf("files_out of the cell and the command's end: got %+v and %+v, want go and went.txt", cell.FilesOut, out.FilesOut)
	}
	if b, _, err := s.Store.ReadAll(ctx, run, "went.txt"); err != nil || string(b) != "went\n" {
		t.Errorf("went.txt in the store: got %q, %v", b, err)
	}

	k, err := s.Orch.StartCommand(ctx, run, wire.ExecRequest{Code: "sleep 600"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k.Kill()
	out, err = k.Wait(ctx)
	if err != nil || out.OK || out.Error == nil || out.Error.Kind != wire.CellInterrupted {
		t.Fatalf("killed: got %+v (error %+v), %v; want kind interrupted", out, out.Error, err)
	}
	if out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "x * 2"}); err != nil || out.Kernel.Restarted || out.Result == nil || out.Result.Data["text/plain"] != "42" {
		t.Errorf("x after the kill: got %+v, %v; want 42 from the same kernel", out.Result, err)
	}

	cel := string(journal(t, s, run))
	var order []string
	for _, blk := range blocks(t, []byte(cel)) {
		b := blk.body
		switch {
		case strings.Contains(b, `command=\#1 started`):
			order = append(order, "start")
		case strings.Contains(b, `command=\#1 ended`):
			order = append(order, "end")
		case strings.Contains(b, "open('go'"):
			order = append(order, "cell")
		}
	}
	if strings.Join(order, " ") != "start cell end" {
		t.Errorf("steps of command #1 and the cell: got %v, want start cell end\n%s", order, cel)
	}
	if !strings.Contains(cel, `Bash command \#2 (started in the background) ended with exit code`) {
		t.Errorf("the killed command's end is not recorded:\n%s", cel)
	}
}

// Contexts are interpreters of their own in the run's sandbox: separate
// variables, restarted alone, named in the Step Block; an unknown one is
// not_found; after the run's kernel is stopped a context comes back fresh
// and says so.
func TestContexts(t *testing.T) {
	for _, sb := range []string{"docker", "wasm"} {
		t.Run(sb, func(t *testing.T) {
			s := orchestratortest.New(t, orchestratortest.Options{Sandbox: sb, Warm: 1})
			ctx := t.Context()
			run := runid.New()
			exec := func(id, code string) wire.ExecResponse {
				t.Helper()
				out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: code, Context: id})
				if err != nil {
					t.Fatalf("exec %q in %q: %v", code, id, err)
				}
				return out
			}
			text := func(out wire.ExecResponse) any {
				if out.Result == nil {
					return nil
				}
				return out.Result.Data["text/plain"]
			}
			a, err := s.Orch.NewContext(ctx, run, "", "")
			if err != nil {
				t.Fatal(err)
			}
			b, err := s.Orch.NewContext(ctx, run, "sub", "")
			if err != nil {
				t.Fatal(err)
			}
			exec("", "v = 'kernel'")
			exec(a.ID, "v = 'a'")
			exec(b.ID, "v = 'b'\nopen('made-by-b.txt', 'w').write('b')")
			if got := text(exec(a.ID, "v")); got != "'a'" {
				t.Errorf("v in a: got %v, want 'a'", got)
			}
			if _, _, err := s.Store.ReadAll(ctx, run, "sub/made-by-b.txt"); err != nil {
				t.Errorf("b's file is not a run file: %v", err)
			}
			if err := s.Orch.RestartContext(ctx, run, a.ID); err != nil {
				t.Fatal(err)
			}
			if got := exec(a.ID, "v"); got.Error == nil || got.Error.Ename != "NameError" {
				t.Errorf("v in a after its restart: got %+v, want NameError", got.Error)
			}
			if got := text(exec(b.ID, "v")); got != "'b'" {
				t.Errorf("v in b after a's restart: got %v, want 'b'", got)
			}
			if got := text(exec("", "v")); got != "'kernel'" {
				t.Errorf("v in the kernel after a's restart: got %v, want 'kernel'", got)
			}
			if ids := s.Orch.Contexts(run); len(ids) != 2 || ids[0].ID != a.ID || ids[1].ID != b.ID || ids[1].Cwd != "sub" {
				t.Errorf("contexts: got %+v, want a then b (in sub)", ids)
			}

			_, err = s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "1", Context: "ctx-nope"})
			if fault.From(err).Kind != fault.NotFound {
				t.Errorf("an unknown context: got %v, want not_found", err)
			}
			if err := s.Orch.RestartContext(ctx, run, "ctx-nope"); fault.From(err).Kind != fault.NotFound {
				t.Errorf("restart an unknown context: got %v, want not_found", err)
			}

			// The kernel stops (idle, or a sandbox past its timeout): b
			// comes back fresh on its next cell, and says so.
			if err := s.Orch.Stop(ctx, run); err != nil {
				t.Fatal(err)
			}
			if got := exec(b.ID, "str(globals().get('v'))"); !got.Kernel.Restarted || text(got) != "'None'" {
				t.Errorf("b after the kernel stopped: got restarted=%v %v, want restarted and no v", got.Kernel.Restarted, text(got))
			}

			if err := s.Orch.RemoveContext(ctx, run, b.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "1", Context: b.ID}); fault.From(err).Kind != fault.NotFound {
				t.Errorf("a removed context: got %v, want not_found", err)
			}
			cel := string(journal(t, s, run))
			if !strings.Contains(cel, "context="+a.ID) || strings.Contains(cel, "ctx-nope") {
				t.Errorf("Step Blocks name the context; refused calls are not steps:\n%s", cel)
			}
			ops := map[string]int{}
			for _, blk := range blocks(t, []byte(cel)) {
				if blk.tool == orchestrator.ToolContext {
					for _, op := range []string{"create", "restart", "remove"} {
						if strings.Contains(blk.body, "op="+op) {
							ops[op]++
						}
					}
				}
			}
			if ops["create"] != 2 || ops["restart"] != 1 || ops["remove"] != 1 {
				t.Errorf("sandbox.context steps: got %v, want 2 creates, 1 restart, 1 remove\n%s", ops, cel)
			}
		})
	}
}

// A caller who hangs up mid-cell gets the cell interrupted and the kernel
// kept, with its variables.
func TestExecHangUpKeepsKernel(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Warm: 1, InterruptGrace: 30 * time.Second})
	run := runid.New()
	if _, err := s.Orch.Exec(t.Context(), run, wire.ExecRequest{Code: "kept = 1"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	out, err := s.Orch.ExecStream(ctx, run, wire.ExecRequest{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(600)"},
		func(e orchestrator.ExecEvent) {
			if e.Type == wire.EventStdout {
				cancel()
			}
		})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("hung up: %v", err)
	}
	if out.Error == nil || out.Error.Kind != wire.CellInterrupted || out.Kernel.Restarted {
		t.Fatalf("hung up: got %+v restarted=%v, want kind interrupted and the kernel kept", out.Error, out.Kernel.Restarted)
	}
	again, err := s.Orch.Exec(t.Context(), run, wire.ExecRequest{Code: "kept", TimeoutS: ptr(60.0)})
	if err != nil || again.Kernel.Restarted || again.Result == nil || again.Result.Data["text/plain"] != "1" {
		t.Errorf("after the hang-up: got %+v, %v; want kept = 1 from the same kernel", again.Result, err)
	}
}
