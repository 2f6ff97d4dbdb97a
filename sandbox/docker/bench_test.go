package docker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
)

// baselineScript times jupyter_client's blocking execute (the reference
// Python client, from Debian's python3-jupyter-client in the image): `1+1`,
// waiting for both execute_reply and status idle, as execute_interactive
// does and as ours does. It connects over ipc to a kernel started by
// Backend.Start, so kernel and jail are the same as ours and only the
// client differs. Each line on stdin asks for n executes; it answers with
// one JSON line of n durations in seconds. Taking requests lets the
// benchmark interleave baseline and ours, so load from elsewhere on the
// machine hits both alike.
const baselineScript = `
import json, sys, time
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient(connection_file="/run/kernel/conn.json")
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=60)
quiet = lambda msg: None
for _ in range(20):
    kc.execute_interactive("1+1", output_hook=quiet, timeout=30)
print("[]", flush=True)
for line in sys.stdin:
    ts = []
    for _ in range(int(line)):
        t0 = time.perf_counter()
        r = kc.execute_interactive("1+1", output_hook=quiet, timeout=30)
        ts.append(time.perf_counter() - t0)
        assert r["content"]["status"] == "ok", r
    print(json.dumps(ts), flush=True)
kc.stop_channels()
`

// baseline is jupyter_client driving a kernel of ours.
type baseline struct {
	lines *bufio.Scanner
	stdin io.WriteCloser
	close func()
}

// startBaseline starts a kernel with Backend.Start, drops our client of it,
// and runs baselineScript against it in a second container from the sandbox
// image that shares the kernel's socket directory. The client container is
// jailed like a kernel (one CPU, no network), as our client is a process of
// its own on the host.
func startBaseline(b *testing.B, be *Backend) *baseline {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sk, err := be.Start(ctx, sandbox.Spec{Owner: "bench-baseline-kernel"})
	if err != nil {
		b.Fatal(err)
	}
	kern := sk.(*Kernel)
	// Our client would also subscribe to iopub and make the kernel send
	// every message twice; the baseline kernel serves jupyter_client only.
	kern.stopKernel()
	pids := int64(DefaultPids)
	resp, err := be.cli.ContainerCreate(ctx, &container.Config{
		Image:           be.cfg.Image,
		User:            fmt.Sprintf("%d:%d", be.cfg.UID, be.cfg.GID),
		Cmd:             []string{"python3", "-c", baselineScript},
		NetworkDisabled: true,
		OpenStdin:       true,
		AttachStdin:     true,
		AttachStdout:    true,
		AttachStderr:    true,
		Labels:          be.labels("bench-baseline-client"),
	}, &container.HostConfig{
		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{"/tmp": "rw,size=64m,mode=1777"},
		Mounts:         []mount.Mount{{Type: mount.TypeBind, Source: kern.sockDir, Target: ctrSockets}},
		Resources:      container.Resources{Memory: DefaultMemory, MemorySwap: DefaultMemory, NanoCPUs: 1e9, PidsLimit: &pids},
	}, nil, nil, "")
	if err != nil {
		sk.Close()
		b.Fatal(err)
	}
	remove := func() {
		_ = be.cli.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
		_ = sk.Close()
	}
	att, err := be.cli.ContainerAttach(ctx, resp.ID, container.AttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		remove()
		b.Fatal(err)
	}
	if err := be.cli.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		att.Close()
		remove()
		b.Fatal(err)
	}
	pr, pw := io.Pipe()
	var stderr testenv.Buffer
	go func() {
		_, err := stdcopy.StdCopy(pw, &stderr, att.Reader)
		pw.CloseWithError(fmt.Errorf("baseline ended (%v): %s", err, stderr.String()))
	}()
	bl := &baseline{lines: bufio.NewScanner(pr), stdin: att.Conn, close: func() { att.Close(); remove() }}
	bl.lines.Buffer(nil, 1<<20)
	if !bl.lines.Scan() { // the ready line
		bl.close()
		b.Fatalf("baseline did not start: %v", bl.lines.Err())
	}
	return bl
}

// run asks the baseline for n executes and returns their durations.
func (bl *baseline) run(b *testing.B, n int) []time.Duration {
	b.Helper()
	if _, err := fmt.Fprintf(bl.stdin, "%d\n", n); err != nil {
		b.Fatal(err)
	}
	if !bl.lines.Scan() {
		b.Fatalf("baseline: %v", bl.lines.Err())
	}
	var secs []float64
	if err := json.Unmarshal(bl.lines.Bytes(), &secs); err != nil || len(secs) != n {
		b.Fatalf("baseline answered %q: %v", bl.lines.Text(), err)
	}
	ts := make([]time.Duration, n)
	for i, s := range secs {
		ts[i] = time.Duration(s * float64(time.Second))
	}
	return ts
}

// BenchmarkExecWarm times `1+1` through Kernel.Execute on a warm kernel
// and, interleaved in chunks in the same run, jupyter_client's blocking
// execute against another kernel started the same way. ratio-p50 is ours over theirs:
// below 1 means ours is faster.
func BenchmarkExecWarm(b *testing.B) {
	be := newBackend(b, Config{})
	k := startKernel(b, be, sandbox.Spec{Owner: "bench-warm"})
	bl := startBaseline(b, be)
	defer bl.close()
	ctx := context.Background()
	for range 20 {
		if res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 30 * time.Second}); err != nil || !res.OK {
			b.Fatalf("warm-up: %v %v", res, err)
		}
	}
	const chunk = 25
	var ours, theirs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%chunk == 0 {
			b.StopTimer()
			theirs = append(theirs, bl.run(b, chunk)...)
			b.StartTimer()
		}
		var out sandbox.Collector
		t0 := time.Now()
		res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 30 * time.Second, Output: out.Add})
		ours = append(ours, time.Since(t0))
		if err != nil || !res.OK || out.Value == nil {
			b.Fatalf("1+1: %v %v", res, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(median(ours)), "p50-ms")
	b.ReportMetric(ms(quantile(ours, 0.9)), "p90-ms")
	b.ReportMetric(ms(median(theirs)), "jupyter_client-p50-ms")
	b.ReportMetric(ms(quantile(theirs, 0.9)), "jupyter_client-p90-ms")
	b.ReportMetric(float64(median(ours))/float64(median(theirs)), "ratio-p50")
}

// BenchmarkStartCold times Backend.Start up to the first `1+1` result: a
// new working directory with its quota, a new container, a booted kernel.
func BenchmarkStartCold(b *testing.B) {
	be := newBackend(b, Config{})
	ctx := context.Background()
	var ts []time.Duration
	for i := 0; i < b.N; i++ {
		b.StartTimer()
		t0 := time.Now()
		k, err := be.Start(ctx, sandbox.Spec{Owner: "bench-cold"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: 30 * time.Second})
		ts = append(ts, time.Since(t0))
		b.StopTimer()
		if err != nil || !res.OK {
			b.Fatalf("1+1: %v %v", res, err)
		}
		if err := k.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(median(ts)), "p50-ms")
}

// BenchmarkIdleKernelMemory reports the memory an idle kernel's container
// uses (cgroup usage less page cache), fresh and after importing the usual
// data libraries.
func BenchmarkIdleKernelMemory(b *testing.B) {
	be := newBackend(b, Config{})
	for _, tc := range []struct{ name, code string }{
		{"fresh", "1+1"},
		{"pandas+matplotlib", "import pandas, numpy, matplotlib.pyplot"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			k := startKernel(b, be, sandbox.Spec{Owner: "bench-mem"})
			if res, err := k.Execute(context.Background(), sandbox.Cell{Code: tc.code, Timeout: time.Minute}); err != nil || !res.OK {
				b.Fatalf("%s: %v %v", tc.code, res, err)
			}
			time.Sleep(time.Second)
			var sum float64
			for b.Loop() {
				sum += float64(memoryUsage(b, be, k.(*Kernel).containerID))
			}
			b.ReportMetric(sum/float64(b.N)/(1<<20), "MiB/kernel")
		})
	}
}

// memoryUsage reads a container's memory use the way `docker stats` shows
// it: usage minus page cache (cgroup v1 "cache", v2 "inactive_file").
func memoryUsage(b *testing.B, be *Backend, id string) uint64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := be.cli.ContainerStatsOneShot(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
		b.Fatal(err)
	}
	use := st.MemoryStats.Usage
	for _, key := range []string{"total_inactive_file", "inactive_file", "cache"} {
		if v, ok := st.MemoryStats.Stats[key]; ok && v < use {
			return use - v
		}
	}
	return use
}

func median(ts []time.Duration) time.Duration { return quantile(ts, 0.5) }

func quantile(ts []time.Duration, q float64) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkStartPhases logs where Start's time goes (workdir, create,
// start, dial, ready); run with -v.
func BenchmarkStartPhases(b *testing.B) {
	be := newBackend(b, Config{Logger: slog.New(slog.NewTextHandler(testWriter{b}, nil))})
	for i := 0; i < b.N; i++ {
		k, err := be.Start(context.Background(), sandbox.Spec{Owner: "bench-phases"})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = k.Close()
		b.StartTimer()
	}
}

// testWriter sends log lines to b.Log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// BenchmarkFloodMemory runs a print loop into the output limit (the
// default 64 MiB) and reports how far the process's resident memory rose
// above where it started, in MiB, against the limit itself as the
// baseline: the host's cost of one flooding cell. Run it alone (-run '^$'):
// it reads the process's peak RSS.
func BenchmarkFloodMemory(b *testing.B) {
	be := newBackend(b, Config{InterruptGrace: 20 * time.Second})
	k := startKernel(b, be, sandbox.Spec{Owner: "bench-flood"})
	var growth, delivered int64
	for b.Loop() {
		runtime.GC()
		before, _ := procRSS(b)
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			b.Skipf("cannot reset the peak RSS: %v", err)
		}
		delivered = 0
		res, err := k.Execute(context.Background(), sandbox.Cell{Code: "while True:\n    print('x' * 10000)", Timeout: 10 * time.Minute,
			Output: func(e sandbox.Event) { delivered += e.Size() }})
		if err != nil || res.Error == nil || res.Error.Kind != sandbox.KindOutputLimit {
			b.Fatalf("flood: %+v, %v", res, err)
		}
		_, peak := procRSS(b)
		growth = max(growth, peak-before)
	}
	b.ReportMetric(float64(growth)/(1<<20), "rss-growth-MiB")
	b.ReportMetric(float64(delivered)/(1<<20), "delivered-MiB")
	b.ReportMetric(float64(growth)/float64(sandbox.DefaultOutputBytes), "x-limit")
}

// procRSS returns the process's resident and peak resident memory.
func procRSS(b *testing.B) (cur, peak int64) {
	cur, peak, err := procmem.RSS(0)
	if err != nil {
		b.Fatal(err)
	}
	return cur, peak
}
