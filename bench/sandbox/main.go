// Command sandbox measures the sandboxes through the HTTP API, with every baseline measured in the same run.
//
// Usage (a Docker engine and the sandbox image are needed; see scripts/docker.sh):
//
//	go run ./bench/sandbox [-n 40] [-new 10]
//
// It reports p50/p90 for:
//   - warm `1+1` through POST /sandbox/exec on Docker, with the journal and
//     evaluator (the real path: interleaved with other calls, as an agent
//     leaves time between calls, and back to back) and without them (the
//     bare tool call), against jupyter_client's blocking execute on the
//     same kind of kernel in the same image and jail (Debian's
//     python3-jupyter-client), measured in chunks between chunks of ours.
//     No timed call overlaps the recording of another run's journaled
//     call (which runs after its answer), except in one row that shows
//     what that overlap costs a bare call;
//   - the first exec of a new run: Docker with the warm pool, Docker cold,
//     and the embedded wasm sandbox (with its pool);
//   - warm `1+1` on wasm;
//   - memory per idle kernel: a Docker kernel's cgroup usage, and a wasm
//     interpreter's share of this process's RSS.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/bench/internal/benchenv"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// baseline runs inside a container of the sandbox image: it starts an
// ipykernel with jupyter_client's KernelManager, warms it, then for each
// number n it reads on stdin times n warm `1+1` executes with the blocking
// client (waiting for the reply and idle, as execute_interactive does) and
// prints them as a JSON list. Kept running, it is measured in chunks
// between chunks of ours, so load from elsewhere hits both alike.
const baseline = `
import json, sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
quiet = lambda m: None
for _ in range(10):
    kc.execute_interactive("1+1", output_hook=quiet, timeout=30)
print("ready", flush=True)
for line in sys.stdin:
    out = []
    for _ in range(int(line)):
        t = time.perf_counter()
        kc.execute_interactive("1+1", output_hook=quiet, timeout=30)
        out.append(time.perf_counter() - t)
    print(json.dumps(out), flush=True)
kc.stop_channels(); km.shutdown_kernel(now=True)
`

func main() {
	n := flag.Int("n", 40, "warm executes per measurement")
	newRuns := flag.Int("new", 10, "new runs per first-exec measurement")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the warm-exec rounds (this process: the servers, not the kernels) to this file")
	flag.Parse()
	ctx := context.Background()
	fmt.Printf("load average at start: %s\n", benchenv.LoadAvg())
	defer func() { fmt.Printf("load average at end: %s\n", benchenv.LoadAvg()) }()
	dir, err := os.MkdirTemp("", "triad-bench-sandbox-")
	check(err)
	defer os.RemoveAll(dir)

	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	check(err)
	tag, err := image.Ensure(ctx, cli, image.Options{Progress: os.Stderr})
	check(err)

	store := newStore(filepath.Join(dir, "store"))
	cache := filepath.Join(dir, "wazero")
	evalWasm, err := wasm.New(ctx, wasm.Config{CacheDir: cache, MemoryLimitBytes: 512 << 20})
	check(err)
	defer evalWasm.Close()
	ev, err := evaluator.New(evaluator.Config{Store: store, Dir: filepath.Join(dir, "eval"),
		Interpreter: evaluator.InterpreterFunc(func(ctx context.Context, s []byte, d string) (evaluator.Process, error) {
			return evalWasm.StartProgram(ctx, s, d)
		})})
	check(err)
	defer ev.Close()

	dockerB, err := docker.New(ctx, docker.Config{Image: tag, WorkRoot: filepath.Join(dir, "work-docker")})
	check(err)
	defer dockerB.Close()
	pooled := kernels.New(kernels.Config{Backend: dockerB, Store: store, Warm: 2, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
	defer pooled.Close()
	cold := kernels.New(kernels.Config{Backend: dockerB, Store: store, Warm: 0, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
	defer cold.Close()
	wasmB, err := wasm.New(ctx, wasm.Config{WorkRoot: filepath.Join(dir, "work-wasm"), CacheDir: cache})
	check(err)
	defer wasmB.Close()
	wasmK := kernels.New(kernels.Config{Backend: wasmB, Store: store, Warm: 2, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
	defer wasmK.Close()

	full := serve(orchestrator.New(orchestrator.Config{Store: store, Kernels: pooled, Journal: cel.New(store), Evaluator: ev}))
	bare := serve(orchestrator.New(orchestrator.Config{Store: store, Kernels: pooled}))
	coldS := serve(orchestrator.New(orchestrator.Config{Store: store, Kernels: cold, Journal: cel.New(store), Evaluator: ev}))
	wasmS := serve(orchestrator.New(orchestrator.Config{Store: store, Kernels: wasmK, Journal: cel.New(store), Evaluator: ev}))
	wasmBare := serve(orchestrator.New(orchestrator.Config{Store: store, Kernels: wasmK}))
	waitPool(pooled, 2)
	waitPool(wasmK, 2)

	// (a) warm 1+1, in rounds so load hits all alike: each round times a
	// chunk of jupyter_client's executes, then ours.
	rf, rfb, rb, rw, rwb := runid.New(), runid.New(), runid.New(), runid.New(), runid.New()
	for _, p := range []struct {
		url string
		run runid.ID
	}{{full, rf}, {full, rfb}, {bare, rb}, {wasmS, rw}, {wasmBare, rwb}} {
		for range 5 {
			execute(p.url, p.run, "1+1")
		}
	}
	jc := startJupyterClient(tag)
	defer jc.close()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
	}
	const chunk = 5
	var tjc, tf, tfb, tb, tbo, tbl, tw, twb []time.Duration
	for range (*n + chunk - 1) / chunk {
		tjc = append(tjc, jc.run(chunk)...)
		// One journaled call, then other calls. The journaled call's
		// recording runs after its answer, as it does while an agent
		// thinks: once untimed (GET /cel waits for it), so that no
		// timed call below pays for another run's recording, and once
		// overlapping the next bare call, to show what that costs it.
		for range chunk {
			tf = append(tf, execute(full, rf, "1+1"))
			settle(full, rf)
			tb = append(tb, execute(bare, rb, "1+1"))
			tw = append(tw, execute(wasmS, rw, "1+1"))
			settle(wasmS, rw)
			twb = append(twb, execute(wasmBare, rwb, "1+1"))
			execute(full, rf, "1+1")
			tbo = append(tbo, execute(bare, rb, "1+1"))
			settle(full, rf)
		}
		// Journaled calls back to back: each waits for the recording of
		// the one before (a run's next call starts after its verdict).
		for range chunk {
			tfb = append(tfb, execute(full, rfb, "1+1"))
		}
		// The bare HTTP call in a loop of its own: interleaved with
		// journaled calls, it also pays for their recording and garbage.
		for range chunk {
			tbl = append(tbl, execute(bare, rb, "1+1"))
		}
	}
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	// The kernel alone, without HTTP or the orchestrator.
	sess, err := pooled.Acquire(ctx, rb, sandbox.Spec{}, nil)
	check(err)
	var tk []time.Duration
	for range *n {
		t0 := time.Now()
		_, err := sess.Kernel.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 10 * time.Second})
		check(err)
		tk = append(tk, time.Since(t0))
	}
	pooled.Release(sess)
	bareO := orchestrator.New(orchestrator.Config{Store: store, Kernels: pooled})
	var to []time.Duration
	for range *n {
		t0 := time.Now()
		out, err := bareO.Exec(ctx, rb, wire.ExecRequest{Code: "1+1"})
		check(err)
		if !out.OK {
			panic("exec failed")
		}
		to = append(to, time.Since(t0))
	}
	fmt.Printf("warm 1+1 (p50 / p90), n=%d, in rounds of %d:\n", len(tf), chunk)
	fmt.Printf("  docker, POST /sandbox/exec, journal+evaluator  %s\n", pct(tf))
	fmt.Printf("  docker, same, journaled calls back to back     %s\n", pct(tfb))
	fmt.Printf("  docker, POST /sandbox/exec, bare call          %s\n", pct(tb))
	fmt.Printf("  docker, same, bare, own loop                   %s\n", pct(tbl))
	fmt.Printf("  docker, same, bare, while a journaled call of another run records %s\n", pct(tbo))
	fmt.Printf("  docker, Orchestrator.Exec (no HTTP), bare      %s\n", pct(to))
	fmt.Printf("  docker, Kernel.Execute directly                %s\n", pct(tk))
	fmt.Printf("  jupyter_client blocking execute (baseline)     %s\n", pct(tjc))
	fmt.Printf("  ratio to jupyter_client: bare %.2f (own loop %.2f, while another run records %.2f), journaled %.2f (back to back %.2f)\n",
		ratio(tb, tjc), ratio(tbl, tjc), ratio(tbo, tjc), ratio(tf, tjc), ratio(tfb, tjc))
	fmt.Printf("  wasm, POST /sandbox/exec, journal+evaluator    %s\n", pct(tw))
	fmt.Printf("  wasm, POST /sandbox/exec, bare call            %s\n", pct(twb))
	fmt.Printf("  ratio wasm/docker (bare) %.2f\n", ratio(twb, tb))

	// (b) first exec of a new run.
	first := func(url string, k *kernels.Manager, want int) []time.Duration {
		var out []time.Duration
		for range *newRuns {
			if k != nil {
				waitPool(k, want)
			}
			out = append(out, execute(url, runid.New(), "1+1"))
		}
		return out
	}
	fp := first(full, pooled, 2)
	fc := first(coldS, nil, 0)
	fw := first(wasmS, wasmK, 2)
	fmt.Printf("first exec of a new run (p50 / p90), n=%d, journal+evaluator included:\n", *newRuns)
	fmt.Printf("  docker with the warm pool  %s\n", pct(fp))
	fmt.Printf("  docker cold                %s\n", pct(fc))
	fmt.Printf("  wasm (pool)                %s\n", pct(fw))

	// (c) memory per idle kernel.
	fmt.Printf("memory per idle kernel:\n")
	fmt.Printf("  docker: %s\n", dockerIdleMemory(filepath.Join(dir, "work-docker")))
	fmt.Printf("  wasm:   %s\n", wasmIdleMemory(ctx, wasmB))
}

func newStore(dir string) *tmpfs.Store {
	b, err := local.NewBlobs(dir)
	check(err)
	x, err := local.NewIndex(dir)
	check(err)
	return tmpfs.New(b, x, nil)
}

func serve(o *orchestrator.Orchestrator) string {
	return httptest.NewServer(api.New(api.Config{Orchestrator: o})).URL
}

func waitPool(k *kernels.Manager, n int) {
	for k.Pooled() < n {
		time.Sleep(20 * time.Millisecond)
	}
}

func execute(url string, run runid.ID, code string) time.Duration {
	body, _ := json.Marshal(map[string]any{"code": code})
	req, _ := http.NewRequest(http.MethodPost, url+"/sandbox/exec", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", run.String())
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	check(err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"ok":true`)) {
		panic(fmt.Sprintf("exec: %d %s", resp.StatusCode, b))
	}
	return d
}

// settle waits, untimed, for the recording of run's last call: GET /cel
// answers once the run's pending journal work is done.
func settle(url string, run runid.ID) {
	req, _ := http.NewRequest(http.MethodGet, url+"/cel", nil)
	req.Header.Set("X-Run-Id", run.String())
	resp, err := http.DefaultClient.Do(req)
	check(err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		panic(fmt.Sprintf("GET /cel: %d", resp.StatusCode))
	}
}

// jupyterClient is the baseline's container, kept running between chunks.
type jupyterClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startJupyterClient(tag string) *jupyterClient {
	cmd := exec.Command("docker", "run", "-i", "--rm", "--network", "none", "-e", "HOME=/tmp", tag, "python3", "-c", baseline)
	in, err := cmd.StdinPipe()
	check(err)
	outp, err := cmd.StdoutPipe()
	check(err)
	cmd.Stderr = os.Stderr
	check(cmd.Start())
	jc := &jupyterClient{cmd: cmd, in: in, out: bufio.NewScanner(outp)}
	for jc.out.Scan() {
		if strings.TrimSpace(jc.out.Text()) == "ready" {
			return jc
		}
	}
	panic(fmt.Sprintf("jupyter_client baseline did not start: %v", jc.out.Err()))
}

// run times n executes.
func (jc *jupyterClient) run(n int) []time.Duration {
	_, err := fmt.Fprintf(jc.in, "%d\n", n)
	check(err)
	if !jc.out.Scan() {
		panic(fmt.Sprintf("jupyter_client baseline: %v", jc.out.Err()))
	}
	var secs []float64
	check(json.Unmarshal(jc.out.Bytes(), &secs))
	d := make([]time.Duration, len(secs))
	for i, s := range secs {
		d[i] = time.Duration(s * float64(time.Second))
	}
	return d
}

func (jc *jupyterClient) close() {
	jc.in.Close()
	jc.cmd.Wait()
}

// dockerIdleMemory reads the cgroup memory usage of the idle pooled kernels.
func dockerIdleMemory(workRoot string) string {
	out, err := exec.Command("docker", "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}").Output()
	check(err)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, "triad-") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// wasmIdleMemory starts 8 idle interpreters and reports the RSS growth per
// interpreter.
func wasmIdleMemory(ctx context.Context, b *wasm.Backend) string {
	before := rss()
	var ks []sandbox.Kernel
	for range 8 {
		k, err := b.Start(ctx, sandbox.Spec{})
		check(err)
		_, err = k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 10 * time.Second})
		check(err)
		ks = append(ks, k)
	}
	after := rss()
	for _, k := range ks {
		k.Close()
	}
	return fmt.Sprintf("%.1f MiB per idle interpreter (RSS %d → %d MiB for 8)", float64(after-before)/8/(1<<20), before>>20, after>>20)
}

func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	check(err)
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func sorted(d []time.Duration) []time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

func pct(d []time.Duration) string {
	s := sorted(d)
	return fmt.Sprintf("%7.1f ms / %7.1f ms", ms(s[len(s)/2]), ms(s[len(s)*9/10]))
}

func ratio(a, b []time.Duration) float64 {
	return float64(sorted(a)[len(a)/2]) / float64(sorted(b)[len(b)/2])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func check(err error) {
	if err != nil {
		panic(err)
	}
}
