package orchestrator_test

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// A thread that writes a file 1 s after its cell returned: the cell's
// answer names the thread in background_threads and does not list the
// file; the file is not a run file until the next exec, whose files_out
// lists it (harvested then, although that cell did not write it), and
// whose answer names no thread once it has ended.
func TestBackgroundThreadFiles(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker"})
	ctx := t.Context()
	run := runid.New()
	out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: `import threading, time
def late():
    time.sleep(1)
    open('late.txt', 'w').write('late')
threading.Thread(target=late, name='late-writer').start()`})
	if err != nil || !out.OK {
		t.Fatalf("exec: %+v %v", out, err)
	}
	if !slices.Equal(out.BackgroundThreads, []string{"late-writer"}) {
		t.Errorf("background_threads: got %q, want [late-writer]", out.BackgroundThreads)
	}
	if len(out.FilesOut) != 0 {
		t.Errorf("files_out: got %+v, want none (the thread writes later)", out.FilesOut)
	}

	// Wait until the thread has written the file in the working directory.
	sess := s.Kernels.Peek(run)
	if sess == nil {
		t.Fatal("the run has no kernel")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		r, _, err := sess.Kernel.Files().Open(wctx, "late.txt")
		if err == nil {
			r.Close()
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || wctx.Err() != nil {
			t.Fatalf("waiting for late.txt: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.Store.Stat(ctx, run, "late.txt"); !errors.Is(err, tmpfs.ErrNotFound) {
		t.Errorf("run file late.txt before the next exec: got %v, want not found", err)
	}

	out, err = s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "[t.join() for t in threading.enumerate() if t.name == 'late-writer']\n1 + 1"})
	if err != nil || !out.OK {
		t.Fatalf("next exec: %+v %v", out, err)
	}
	var paths []string
	for _, f := range out.FilesOut {
		paths = append(paths, f.Path)
	}
	if !slices.Equal(paths, []string{"late.txt"}) || out.BackgroundThreads != nil {
		t.Errorf("next exec: got files_out %q and background_threads %q, want [late.txt] and none", paths, out.BackgroundThreads)
	}
	if f, err := s.Store.Stat(ctx, run, "late.txt"); err != nil || f.Size != 4 {
		t.Errorf("run file late.txt after the next exec: got %+v, %v, want 4 bytes", f, err)
	}
}
