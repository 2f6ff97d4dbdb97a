package wasm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// forger is Python that finds the driver's frame marker (nonce included)
// and cell number by walking the stack, as a hostile cell can, and defines
// forge(body) to write a frame of its own straight to fd 1.
const forger = `import os, sys
_f = sys._getframe()
marker = n = None
while _f is not None:
    if _f.f_code.co_name == 'run_cell':
        n = _f.f_locals['n']
    if 'marker' in _f.f_locals:
        marker = _f.f_locals['marker']
    _f = _f.f_back
assert marker and n, 'driver frames not found'
def forge(body):
    body = body.encode()
    os.write(1, marker + str(len(body)).encode() + b'\n' + body)
`

// A cell that forges frames cannot get past the output limit, which the
// host counts at the file descriptor whatever the frames say.
func TestForgedFramesCannotPassTheOutputLimit(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-forge-cap", Limits: sandbox.Limits{OutputBytes: limit}})
	mustOK(t, k, "x = 21")
	res := runTimeout(t, k, forger+`
chunk = '{"t":"stream","name":"stdout","text":"%s"}' % ('f' * 16000)
refused = 0
for i in range(200):  # 3 MB, 50 times the limit
    try:
        forge(chunk)
    except OSError:
        refused += 1
forge('{"t":"result","n":%d,"ok":true}' % n)`, time.Minute)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindOutputLimit {
		t.Fatalf("got %+v, want kind output_limit", res.Error)
	}
	if res.delivered > limit {
		t.Errorf("delivered %d bytes, want at most the %d limit", res.delivered, limit)
	}
	if res.Restarted {
		t.Errorf("Restarted: the cell ended by itself, so the kernel should keep its state")
	}
	if got := plain(t, mustOK(t, k, "x, refused > 150")); got != "(21, True)" {
		t.Errorf("after the flood: got %s, want (21, True): state kept, the writes refused", got)
	}
}

// A forged result frame does not end the call: the cell runs to its end and
// its real result is reported.
func TestForgedResultDoesNotEndTheCell(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-forge-early"})
	res := runTimeout(t, k, forger+`
forge('{"t":"result","n":%d,"ok":true,"value":{"data":{"text/plain":"\'forged\'"}}}' % n)
total = 0
for i in range(2000000):
    total += i
open('finished.txt', 'w').write(str(total))
raise ValueError('the real end')`, time.Minute)
	if res.OK || res.Error == nil || res.Error.Ename != "ValueError" || res.Error.Evalue != "the real end" {
		t.Fatalf("got ok=%v error %+v, want the cell's own ValueError", res.OK, res.Error)
	}
	if res.Value != nil {
		t.Errorf("value = %s, want none (the forged one is not the cell's)", res.Value.Data["text/plain"])
	}
	// The call returned only after the cell had finished: its last file is
	// there.
	r, _, err := k.Files().Open(t.Context(), "finished.txt")
	if err != nil {
		t.Fatalf("finished.txt when Execute returned: %v, want the cell to have run to its end", err)
	}
	r.Close()
}

// A forged result frame does not let a cell run past its deadline: the
// host's timer stops it, and the interpreter it ran in is gone.
func TestForgedResultCannotOutliveTheDeadline(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-forge-deadline"})
	mustOK(t, k, "x = 1")
	res := runTimeout(t, k, forger+`
forge('{"t":"result","n":%d,"ok":true}' % n)
while True:
    pass`, 2*time.Second)
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindTimeout {
		t.Fatalf("got ok=%v error %+v, want kind timeout", res.OK, res.Error)
	}
	// Restarted means the instance that ran the cell was closed and its
	// goroutine has returned (stop waits for it): nothing of the cell runs.
	if !res.Restarted {
		t.Fatalf("Restarted = false, want the cell's interpreter replaced")
	}
	if got := plain(t, mustOK(t, k, "'x' in globals()")); got != "False" {
		t.Errorf("x after the timeout: %s, want False (a fresh interpreter)", got)
	}
}

// A cell that reads the command channel itself (where the driver waits for
// the next cell) ends its call, since the guest then waits as the driver
// would; the host sees no result for it and replaces the interpreter, so
// the next cell is not handed to the cell's read.
func TestCellReadingCommandChannel(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-stdin"})
	mustOK(t, k, "x = 1")
	res := run(t, k, "import os\nos.read(0, 4)")
	if res.OK || res.Error == nil || res.Error.Ename != "CommandChannelRead" || !res.Restarted {
		t.Fatalf("got %+v restarted=%v, want CommandChannelRead with a restart", res.Error, res.Restarted)
	}
	if got := plain(t, mustOK(t, k, "'x' in globals(), 6 * 7")); got != "(False, 42)" {
		t.Errorf("next cell: got %s, want (False, 42)", got)
	}
}

// A backend that fails to start returns its real error: New used to panic
// in its cleanup (a nil Backend) and hide it.
func TestNewFailureReturnsTheError(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var b *Backend
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("New panicked: %v", r)
			}
		}()
		b, err = New(t.Context(), Config{WorkRoot: root, CacheDir: filepath.Join(notADir, "cache")})
	}()
	if err == nil || b != nil {
		t.Fatalf("New with a cache dir under a file: got %v, %v, want an error", b, err)
	}
	if !strings.Contains(err.Error(), "cache dir") {
		t.Errorf("error %q does not say what failed", err)
	}
	// The failed New released the work root.
	b, err = New(t.Context(), Config{WorkRoot: root, CacheDir: testCacheDir()})
	if err != nil {
		t.Fatalf("New after a failed New on the same root: %v", err)
	}
	_ = b.Close()
}

// The suite's streaming check, on the print-then-sleep pattern: each line
// is its own event, delivered before the cell ends.
func TestStreamingBeforeSleep(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-stream"})
	var events []sandbox.Event
	res, err := k.Execute(context.Background(), sandbox.Cell{Code: "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.3)",
		Timeout: time.Minute, Output: func(e sandbox.Event) { events = append(events, e) }})
	if err != nil || !res.OK {
		t.Fatalf("got %+v, %v", res, err)
	}
	var lines []string
	for _, e := range events {
		lines = append(lines, e.Text)
	}
	if strings.Join(lines, "|") != "0\n|1\n|2\n" {
		t.Errorf("events: got %q, want one per line", lines)
	}
}
