// Command gvisor measures Docker kernels under gVisor (runsc) against runc in the same run, calls interleaved.
//
// Usage (a Docker engine with runsc registered, scripts/gvisor.sh docker,
// and the sandbox image are needed):
//
//	go run ./bench/gvisor [-n 30] [-new 8] [-starts 5] [-variant NAME]
//
// With -variant, the two sides are runsc and NAME, another registration of
// the same runsc with other flags (scripts/gvisor.sh docker NAME FLAGS...),
// to find where gVisor's time goes.
//
// Two servers run side by side in this process, each with its own Docker
// backend (one per runtime), warm pool, journal and evaluator, on one
// store. Every measure alternates between them call by call, so load on
// the machine hits both alike, and is reported as p50/p90 per runtime with
// the runsc/runc ratio of the p50s:
//   - warm `1+1` through POST /sandbox/exec, journaled (each call's
//     recording finishes before the next timed call);
//   - pandas `groupby` over 1 M rows already in the kernel;
//   - a 100 MB file written by a cell and harvested (hashed and stored);
//   - the first exec of a new run, with the warm pool;
//   - a kernel's start (sandbox.Backend.Start until it answers);
//   - an idle kernel's host memory: the PSS of every host process of its
//     container (for runsc: the Sentry, the gofer and the systrap stubs)
//     and of its containerd shim.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
)

// side is one runtime's backend and server.
type side struct {
	rt     string
	b      *docker.Backend
	k      *kernels.Manager
	url    string
	timing map[string][]time.Duration
}

func main() {
	n := flag.Int("n", 30, "timed calls per warm measure and runtime")
	newRuns := flag.Int("new", 8, "new runs per first-exec measure and runtime")
	starts := flag.Int("starts", 5, "kernel starts per runtime")
	variant := flag.String("variant", "", "compare runsc with this other registration of it (say, runsc with other flags in the engine's daemon.json) instead of runc with runsc")
	flag.Parse()
	// Each side is a runtime as the backend takes it and the engine's name
	// for it.
	runtimes := [][2]string{{docker.RuntimeRunc, docker.RuntimeRunc}, {docker.RuntimeRunsc, docker.RuntimeRunsc}}
	if *variant != "" {
		runtimes = [][2]string{{docker.RuntimeRunsc, docker.RuntimeRunsc}, {docker.RuntimeRunsc, *variant}}
	}
	ctx := context.Background()
	fmt.Printf("load average at start: %s\n", benchenv.LoadAvg())
	defer func() { fmt.Printf("load average at end: %s\n", benchenv.LoadAvg()) }()
	dir, err := os.MkdirTemp("", "triad-bench-gvisor-")
	check(err)
	defer os.RemoveAll(dir)

	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	check(err)
	tag, err := image.Ensure(ctx, cli, image.Options{Progress: os.Stderr})
	check(err)
	store := newStore(filepath.Join(dir, "store"))
	evalWasm, err := wasm.New(ctx, wasm.Config{CacheDir: filepath.Join(dir, "wazero"), MemoryLimitBytes: 512 << 20})
	check(err)
	defer evalWasm.Close()
	ev, err := evaluator.New(evaluator.Config{Store: store, Dir: filepath.Join(dir, "eval"),
		Interpreter: evaluator.InterpreterFunc(func(ctx context.Context, s []byte, d string) (evaluator.Process, error) {
			return evalWasm.StartProgram(ctx, s, d)
		})})
	check(err)
	defer ev.Close()

	var sides []*side
	for _, r := range runtimes {
		rt := r[1]
		b, err := docker.New(ctx, docker.Config{Image: tag, WorkRoot: filepath.Join(dir, "work-"+rt), Runtime: r[0], RunscName: r[1]})
		check(err)
		defer b.Close()
		if b.Runtime() != r[0] {
			panic(fmt.Sprintf("backend runtime %q, want %q (register runsc: scripts/gvisor.sh docker)", b.Runtime(), r[0]))
		}
		k := kernels.New(kernels.Config{Backend: b, Store: store, Warm: 2, Protect: runfiles.IsKept, Omit: runfiles.IsCheckpoint})
		defer k.Close()
		url := httptest.NewServer(api.New(api.Config{Orchestrator: orchestrator.New(orchestrator.Config{
			Store: store, Kernels: k, Journal: cel.New(store), Evaluator: ev})})).URL
		sides = append(sides, &side{rt: rt, b: b, k: k, url: url, timing: map[string][]time.Duration{}})
	}
	for _, s := range sides {
		for s.k.Pooled() < 2 {
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Each side's run for the warm measures, warmed up and holding the
	// data frame.
	runs := map[string]runid.ID{}
	const setup = "import pandas as pd, numpy as np\nrng = np.random.default_rng(0)\ndf = pd.DataFrame({'k': rng.integers(0, 1000, 1_000_000), 'v': rng.random(1_000_000)})\nlen(df)"
	for _, s := range sides {
		runs[s.rt] = runid.New()
		execute(s.url, runs[s.rt], setup)
		for range 3 {
			execute(s.url, runs[s.rt], "1+1")
			execute(s.url, runs[s.rt], "df.groupby('k').v.sum().size")
		}
		settle(s.url, runs[s.rt])
	}
	measure := func(name, code string, count int) {
		for range count {
			for _, s := range sides {
				s.timing[name] = append(s.timing[name], execute(s.url, runs[s.rt], code))
				settle(s.url, runs[s.rt])
			}
		}
	}
	measure("warm `1+1`, journaled", "1+1", *n)
	measure("pandas groupby, 1 M rows", "df.groupby('k').v.sum().size", *n)
	measure("100 MB file written and harvested", "import os\nwith open('big.bin', 'wb') as f: f.write(os.urandom(100 << 20))\nNone", max(*n/3, 5))

	// The first exec of a new run: the pool refills between calls.
	for range *newRuns {
		for _, s := range sides {
			for s.k.Pooled() < 2 {
				time.Sleep(20 * time.Millisecond)
			}
			r := runid.New()
			s.timing["first exec of a new run (pool)"] = append(s.timing["first exec of a new run (pool)"], execute(s.url, r, "1+1"))
			settle(s.url, r)
		}
	}

	// Kernel start, and idle memory of the last kernel started.
	mem := map[string]string{}
	for i := range *starts {
		for _, s := range sides {
			t0 := time.Now()
			k, err := s.b.Start(ctx, sandbox.Spec{Owner: "bench-start-" + s.rt})
			check(err)
			s.timing["kernel start"] = append(s.timing["kernel start"], time.Since(t0))
			if i == *starts-1 {
				_, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 10 * time.Second})
				check(err)
				time.Sleep(2 * time.Second) // idle
				mem[s.rt] = hostMemory(ctx, cli, k.ID())
			}
			check(k.Close())
		}
	}

	fmt.Printf("\n%-40s %-24s %-24s %s\n", "measure (p50 / p90)", sides[0].rt, sides[1].rt, sides[1].rt+"/"+sides[0].rt+" p50")
	for _, name := range []string{"warm `1+1`, journaled", "pandas groupby, 1 M rows", "100 MB file written and harvested", "first exec of a new run (pool)", "kernel start"} {
		a, b := sides[0].timing[name], sides[1].timing[name]
		fmt.Printf("%-40s %-24s %-24s %.2f×\n", name, pct(a), pct(b), float64(p50(b))/float64(p50(a)))
	}
	fmt.Printf("%-40s %-24s %-24s\n", "idle kernel host memory (PSS)", mem[sides[0].rt], mem[sides[1].rt])
}

// hostMemory sums the proportional set size of every host process of the
// kernel's container: those in its memory cgroup, its containerd shim, and
// any other process naming its full id (runsc's gofer).
func hostMemory(ctx context.Context, cli *client.Client, id string) string {
	name := id
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name = name[:i]
	}
	info, err := cli.ContainerInspect(ctx, name)
	check(err)
	pids := map[int]string{}
	if cg := memoryCgroup(info.State.Pid); cg != "" {
		data, err := os.ReadFile(cg + "/cgroup.procs")
		check(err)
		for _, f := range strings.Fields(string(data)) {
			p, _ := strconv.Atoi(f)
			pids[p] = "container"
		}
	}
	ents, err := os.ReadDir("/proc")
	check(err)
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if _, ok := pids[p]; !ok && bytes.Contains(cmd, []byte(info.ID)) {
			pids[p] = filepath.Base(string(bytes.SplitN(cmd, []byte{0}, 2)[0]))
		}
	}
	var total int64
	parts := map[string]int64{}
	for p, what := range pids {
		kb := pssKB(p)
		total += kb
		parts[what] += kb
	}
	var detail []string
	for what, kb := range parts {
		detail = append(detail, fmt.Sprintf("%s %.1f", what, float64(kb)/1024))
	}
	sort.Strings(detail)
	return fmt.Sprintf("%.1f MiB (%s; %d processes)", float64(total)/1024, strings.Join(detail, ", "), len(pids))
}

// memoryCgroup is the cgroup v1 memory directory of pid (or its v2
// directory).
func memoryCgroup(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	v2 := ""
	for _, l := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return "/sys/fs/cgroup/memory" + parts[2]
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = "/sys/fs/cgroup" + parts[2]
		}
	}
	return v2
}

func pssKB(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb
		}
	}
	return 0
}

func newStore(dir string) *tmpfs.Store {
	b, err := local.NewBlobs(dir)
	check(err)
	x, err := local.NewIndex(dir)
	check(err)
	return tmpfs.New(b, x, nil)
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
		panic(fmt.Sprintf("exec %q: %d %s", code, resp.StatusCode, b))
	}
	return d
}

// settle waits for the run's last call to be recorded (GET /cel waits).
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

func p50(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func pct(d []time.Duration) string {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("%.1f / %.1f ms", ms(s[len(s)/2]), ms(s[len(s)*9/10]))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func check(err error) {
	if err != nil {
		panic(err)
	}
}
