package docker

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// waitFile polls a kernel's working directory until path exists. It bounds
// a wait for the kernel; it measures nothing.
func waitFile(t *testing.T, k sandbox.Kernel, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		r, _, err := k.Files().Open(ctx, path)
		if err == nil {
			r.Close()
			return
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("open %s: %v", path, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never appeared", path)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestBackgroundThreads pins down what happens to threads a cell leaves
// running: each Result names them (also after an exception and after a
// timeout, which does not stop them), and what one prints after its cell
// returned is dropped, whether or not another cell runs at the time (the
// kernel tags a thread's prints with the cell that started it), while
// what it displays goes with the cell running at the time.
func TestBackgroundThreads(t *testing.T) {
	t.Parallel()
	// The timed-out cell must keep its kernel, so the grace is long
	// enough for a loaded host to deliver the interrupt.
	b := newBackend(t, Config{InterruptGrace: 30 * time.Second})
	k := startKernel(t, b, sandbox.Spec{Owner: "run-threads"})
	put := func(path string) {
		t.Helper()
		if _, err := k.Files().Put(t.Context(), path, strings.NewReader("")); err != nil {
			t.Fatal(err)
		}
	}

	// A thread waiting for a signal is reported when its cell returns.
	res := run1(t, k, `import os, threading, time
def writer():
    while not os.path.exists('go'):
        time.sleep(0.02)
    print('from-thread', flush=True)
    open('late.txt', 'w').write('late')
threading.Thread(target=writer, name='writer').start()
'started'`, time.Minute)
	if !res.OK || !slices.Equal(res.Threads, []string{"writer"}) {
		t.Fatalf("starting a thread: got %s threads %q, want ok and [writer]", describe(res), res.Threads)
	}
	// Released between cells, it prints (flushed before it writes the
	// file) while no cell runs: that output is dropped.
	put("go")
	waitFile(t, k, "late.txt")
	res = run1(t, k, "import threading\n[t.join() for t in threading.enumerate() if t.name == 'writer']\nprint('cell2')", time.Minute)
	if !res.OK || res.Stdout.String() != "cell2\n" || res.Threads != nil {
		t.Errorf("next cell: got %s threads %q, want stdout exactly cell2 and no threads", describe(res), res.Threads)
	}

	// Released while a later cell runs, its prints are still its own
	// cell's, and dropped; its displays go with the running cell.
	res = run1(t, k, `def talker():
    while not os.path.exists('go2'):
        time.sleep(0.02)
    print('during', flush=True)
    display('shown')
threading.Thread(target=talker, name='talker').start()`, time.Minute)
	if !slices.Equal(res.Threads, []string{"talker"}) {
		t.Errorf("got threads %q, want [talker]", res.Threads)
	}
	res = run1(t, k, "print('before', flush=True)\nopen('go2', 'w').close()\n[t.join() for t in threading.enumerate() if t.name == 'talker']\nprint('after')", time.Minute)
	if !res.OK || res.Stdout.String() != "before\nafter\n" || res.Threads != nil {
		t.Errorf("cell releasing the thread: got %s threads %q, want only its own prints and no threads", describe(res), res.Threads)
	}
	if len(res.Display) != 1 || string(res.Display[0].Data["text/plain"]) != `"'shown'"` {
		t.Errorf("cell releasing the thread: got displays %+v, want the thread's 'shown'", res.Display)
	}

	// A cell that raises, and one stopped at its timeout, still report
	// what they left running; the timeout does not stop the thread.
	res = run1(t, k, `def sleeper():
    while not os.path.exists('stop'):
        time.sleep(0.02)
threading.Thread(target=sleeper, name='sleeper', daemon=True).start()
1/0`, time.Minute)
	if res.Error == nil || res.Error.Kind != sandbox.KindExecution || !slices.Equal(res.Threads, []string{"sleeper"}) {
		t.Errorf("raising cell: got %s threads %q, want execution_error and [sleeper]", describe(res), res.Threads)
	}
	res = run1(t, k, "time.sleep(600)", 2*time.Second)
	if res.Error == nil || res.Error.Kind != sandbox.KindTimeout || res.Restarted || !slices.Equal(res.Threads, []string{"sleeper"}) {
		t.Errorf("timed-out cell: got %s threads %q, want a timeout without a restart, and [sleeper]", describe(res), res.Threads)
	}
	put("stop")
	if res := run1(t, k, "[t.join() for t in threading.enumerate() if t.name == 'sleeper']", time.Minute); !res.OK || res.Threads != nil {
		t.Errorf("after stopping it: got %s threads %q, want none", describe(res), res.Threads)
	}
}
