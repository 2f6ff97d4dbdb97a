package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// memoryRuns is how many short runs TestRunMemory makes.
const memoryRuns = 10000

// A server that has served many short runs gives their memory back: once
// they are idle, nothing the process keeps by run is left, and its RSS is
// within 50 MiB of where it started, with no file descriptors left open.
//
// A short run is what an agent does for a quick question: it mints a run,
// writes a file (a Step Block, a trace line, an evaluation, the artifact
// index: every per-run record), and stops. Some of them also search (the
// citations), read the run's status and journal and add a note, upload a
// file by stream, and one in a hundred runs a cell, which starts a kernel
// of its own on the wasm backend, materialises the run's files and
// harvests them: the kernel path, reaped when idle. A cell for every run
// would measure kernel start-up ten thousand times, not the run's memory.
func TestRunMemory(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true,
		KernelIdle: 200 * time.Millisecond, RunIdle: 100 * time.Millisecond})
	c := apiServer(t, api.Config{Orchestrator: s.Orch})
	// One run's answers are checked against the OpenAPI document (which
	// loads the checker's copy before measuring); the loop's by status.
	if e := shortRun(c, 0); e != "" {
		t.Fatal(e)
	}
	fast := *c
	fast.h = nil

	drained := func() {
		t.Helper()
		// No wall-clock bound of its own: a loaded machine drains slower,
		// and a leak never drains. The bound is the test binary's, less
		// the time to report (go test -timeout).
		deadline := time.Now().Add(30 * time.Minute)
		if d, ok := t.Deadline(); ok {
			deadline = d.Add(-time.Minute)
		}
		for s.Kernels.Live() > 0 || s.Orch.Caches().Total() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("after the runs: %d kernels live, %+v kept by run; want none", s.Kernels.Live(), s.Orch.Caches())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Warm up first: pools, compiled code, the evaluator and the wasm
	// module's cache are the server's, not the runs'.
	many(t, &fast, 1, 300)
	drained()
	rss0, fds0 := rss(t), fds(t)
	many(t, &fast, 300, memoryRuns)
	drained()
	rss1, fds1 := rss(t), fds(t)
	if p := os.Getenv("TRIAD_HEAP_PROFILE"); p != "" {
		// What is kept, by allocation site: go tool pprof -inuse_space -top.
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	t.Logf("RSS %d MiB before %d short runs, %d MiB after they went idle (%+d MiB); open files %d, then %d",
		rss0>>20, memoryRuns, rss1>>20, (rss1-rss0)>>20, fds0, fds1)
	if rss1-rss0 > 50<<20 {
		t.Errorf("RSS grew by %d MiB over %d runs, want at most 50 MiB", (rss1-rss0)>>20, memoryRuns)
	}
	if fds1-fds0 > 32 {
		t.Errorf("open files: got %d after the runs, want about the %d before", fds1, fds0)
	}
}

// many makes short runs number from to to-1, four at a time.
func many(t *testing.T, c *client, from, to int) {
	t.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var failed string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := shortRun(c, i); err != "" {
					once.Do(func() { failed = err })
				}
			}
		}()
	}
	for i := from; i < to && failed == ""; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed != "" {
		t.Fatal(failed)
	}
}

// shortRun is run number i; it returns what went wrong, or "".
func shortRun(c *client, i int) string {
	a := c.post("/runs", "", map[string]any{})
	var nr wire.NewRunResponse
	if a.status != 201 || json.Unmarshal(a.body, &nr) != nil {
		return fmt.Sprintf("run %d: POST /runs: %d %s", i, a.status, a.body)
	}
	run := nr.RunID
	check := func(what string, a answer, want int) string {
		if a.status != want {
			return fmt.Sprintf("run %d: %s: got %d %s, want %d", i, what, a.status, a.body, want)
		}
		return ""
	}
	if e := check("tmp.write", c.post("/tmp/write", run, map[string]any{"path": "notes/q.txt", "text": strings.Repeat("question ", 20) + strconv.Itoa(i)}), 200); e != "" {
		return e
	}
	if i%20 == 0 {
		if e := check("browser.search", c.post("/browser/search", run, map[string]any{"query": "inflation " + strconv.Itoa(i%7)}), 200); e != "" {
			return e
		}
	}
	if i%10 == 0 {
		if e := check("note", c.post("/cel/note", run, map[string]any{"text": "looked at " + strconv.Itoa(i)}), 200); e != "" {
			return e
		}
		if e := check("GET /runs/{id}", c.do("GET", "/runs/"+run, "", nil), 200); e != "" {
			return e
		}
		if e := check("GET /cel", c.do("GET", "/cel", run, nil), 200); e != "" {
			return e
		}
	}
	if i%50 == 0 {
		if e := check("PUT /tmp/files", c.do("PUT", "/tmp/files/data/x.csv", run, bytes.NewReader([]byte("a,b\n1,2\n"))), 200); e != "" {
			return e
		}
	}
	if i%100 == 0 {
		a := c.post("/sandbox/exec", run, map[string]any{"code": "open('out.txt','w').write(open('notes/q.txt').read()[:8])\n1+1"})
		var out wire.ExecResponse
		if a.status != 200 || json.Unmarshal(a.body, &out) != nil || !out.OK || len(out.FilesOut) == 0 {
			return fmt.Sprintf("run %d: sandbox.exec: got %d %s, want an ok cell that wrote out.txt", i, a.status, a.body)
		}
	}
	return ""
}

// rss returns this process's resident memory after a collection.
func rss(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	v, _, err := procmem.RSS(0)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// fds is the number of files the process has open.
func fds(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
