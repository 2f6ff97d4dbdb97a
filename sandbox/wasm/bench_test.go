package wasm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/sandbox"
)

// The benchmarks report their figures as ratios to a baseline measured in the
// same run: the host's own CPython (python3 on PATH), the cheapest fresh
// interpreter there is. Without python3 they report absolute figures only.
//
//	go test -run '^$' -bench . -benchtime 3s ./sandbox/wasm

// nativePython returns the host's python3, or "" if there is none.
func nativePython() string {
	p, err := exec.LookPath("python3")
	if err != nil {
		return ""
	}
	return p
}

// nativeStart measures the median time of `python3 -S -c 'print(1+1)'`:
// a new native interpreter to its first result.
func nativeStart(b *testing.B, py string) time.Duration {
	b.Helper()
	var ds []time.Duration
	for range 15 {
		t0 := time.Now()
		out, err := exec.Command(py, "-S", "-c", "print(1+1)").Output()
		if err != nil || strings.TrimSpace(string(out)) != "2" {
			b.Fatalf("native baseline: %q, %v", out, err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkStart measures a new kernel to its first result: Start, then
// Execute("1+1"). Close is not timed.
func BenchmarkStart(b *testing.B) {
	be := testBackend(b)
	ctx := context.Background()
	var native time.Duration
	if py := nativePython(); py != "" {
		native = nativeStart(b, py)
	}
	var total time.Duration
	for b.Loop() {
		t0 := time.Now()
		k, err := be.Start(ctx, sandbox.Spec{Owner: "bench-start"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute})
		if err != nil || !res.OK {
			b.Fatalf("first cell: %+v %v", res, err)
		}
		total += time.Since(t0)
		b.StopTimer()
		_ = k.Close()
		b.StartTimer()
	}
	perOp := total / time.Duration(b.N)
	b.ReportMetric(float64(perOp.Microseconds())/1000, "ms/start")
	if native > 0 {
		b.ReportMetric(float64(native.Microseconds())/1000, "ms/native-start")
		b.ReportMetric(float64(perOp)/float64(native), "x-native")
	}
}

// BenchmarkColdStart measures a new process's path to its first result:
// New with a warm compilation cache (python.wasm compiled by an earlier
// run), Start, and a `1+1` cell.
func BenchmarkColdStart(b *testing.B) {
	ctx := context.Background()
	testBackend(b) // fills the compilation cache
	for b.Loop() {
		be, err := New(ctx, Config{CacheDir: testCacheDir()})
		if err != nil {
			b.Fatal(err)
		}
		k, err := be.Start(ctx, sandbox.Spec{Owner: "bench-cold"})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute}); err != nil || !res.OK {
			b.Fatalf("first cell: %+v %v", res, err)
		}
		b.StopTimer()
		_ = be.Close()
		b.StartTimer()
	}
}

// BenchmarkCompile measures New without a compilation cache: what the very
// first run on a machine pays to compile python.wasm.
func BenchmarkCompile(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		be, err := New(ctx, Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = be.Close()
		b.StartTimer()
	}
}

// nativeREPL is a host CPython evaluating one line per request over pipes:
// the same round trip as a warm kernel, without the sandbox.
type nativeREPL struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startNativeREPL(b *testing.B, py string) *nativeREPL {
	b.Helper()
	cmd := exec.Command(py, "-S", "-u", "-c",
		"import sys\nfor line in sys.stdin:\n    print(repr(eval(line)), flush=True)")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := &nativeREPL{cmd: cmd, in: in, out: bufio.NewReader(out)}
	b.Cleanup(func() { _ = in.Close(); _ = cmd.Wait() })
	return r
}

func (r *nativeREPL) eval(b *testing.B, line string) string {
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		b.Fatal(err)
	}
	s, err := r.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(s)
}

// BenchmarkExecWarm measures one `1+1` cell on a warm kernel, against the
// same round trip to a native python3 over pipes.
func BenchmarkExecWarm(b *testing.B) {
	be := testBackend(b)
	ctx := context.Background()
	k := startKernel(b, be, sandbox.Spec{Owner: "bench-warm"})
	mustOK(b, k, "1+1")

	var native time.Duration
	if py := nativePython(); py != "" {
		r := startNativeREPL(b, py)
		const n = 2000
		r.eval(b, "1+1")
		t0 := time.Now()
		for range n {
			if got := r.eval(b, "1+1"); got != "2" {
				b.Fatalf("native 1+1 = %q", got)
			}
		}
		native = time.Since(t0) / n
	}

	t0 := time.Now()
	for b.Loop() {
		res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute})
		if err != nil || !res.OK {
			b.Fatalf("1+1: %+v %v", res, err)
		}
	}
	perOp := time.Since(t0) / time.Duration(b.N)
	if native > 0 {
		b.ReportMetric(float64(native.Nanoseconds())/1000, "µs/native-op")
		b.ReportMetric(float64(perOp)/float64(native), "x-native")
	}
}

// BenchmarkPurePython measures CPU-bound Python (a loop over a million
// integers) in a warm kernel against the same code in the native REPL.
func BenchmarkPurePython(b *testing.B) {
	const code = "sum(i * i % 7 for i in range(1000000))"
	be := testBackend(b)
	ctx := context.Background()
	k := startKernel(b, be, sandbox.Spec{Owner: "bench-cpu"})
	want := plain(b, mustOK(b, k, code))

	var native time.Duration
	if py := nativePython(); py != "" {
		r := startNativeREPL(b, py)
		t0 := time.Now()
		const n = 5
		for range n {
			if got := r.eval(b, code); got != want {
				b.Fatalf("native = %q, wasm = %q", got, want)
			}
		}
		native = time.Since(t0) / n
	}
	t0 := time.Now()
	for b.Loop() {
		if res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: time.Minute}); err != nil || !res.OK {
			b.Fatalf("%+v %v", res, err)
		}
	}
	perOp := time.Since(t0) / time.Duration(b.N)
	if native > 0 {
		b.ReportMetric(float64(native.Microseconds())/1000, "ms/native-op")
		b.ReportMetric(float64(perOp)/float64(native), "x-native")
	}
}

// procRSS returns the VmRSS of a process in bytes (pid 0 for this one).
func procRSS(pid int) (int64, bool) {
	rss, _, err := procmem.RSS(pid)
	return rss, err == nil
}

// BenchmarkIdleMemory reports what an idle interpreter costs: it starts
// idleKernels kernels, runs one cell in each, and divides the growth of the
// process's RSS by their number. The linear memory (the guest's heap as
// wazero sized it) is reported too; only its touched pages are resident.
// The timed loop is a `1+1` round robin over the idle kernels.
func BenchmarkIdleMemory(b *testing.B) {
	const idleKernels = 16
	be := testBackend(b)
	ctx := context.Background()
	warm := startKernel(b, be, sandbox.Spec{Owner: "bench-mem-warmup"})
	mustOK(b, warm, "1+1")
	runtime.GC()
	before, haveRSS := procRSS(0)

	ks := make([]*Kernel, idleKernels)
	var linear uint64
	for i := range ks {
		ks[i] = startKernel(b, be, sandbox.Spec{Owner: fmt.Sprintf("bench-mem-%d", i)})
		mustOK(b, ks[i], "x = 1")
		linear += ks[i].MemoryBytes()
	}
	runtime.GC()
	after, _ := procRSS(0)

	i := 0
	for b.Loop() {
		res, err := ks[i%idleKernels].Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute})
		if err != nil || !res.OK {
			b.Fatalf("1+1: %+v %v", res, err)
		}
		i++
	}
	b.ReportMetric(float64(linear)/idleKernels/(1<<20), "linear-MiB/kernel")
	if haveRSS {
		perKernel := float64(after-before) / idleKernels
		b.ReportMetric(perKernel/(1<<20), "rss-MiB/kernel")
		if py := nativePython(); py != "" {
			r := startNativeREPL(b, py)
			r.eval(b, "1+1")
			if native, ok := procRSS(r.cmd.Process.Pid); ok {
				b.ReportMetric(float64(native)/(1<<20), "rss-MiB/native")
				b.ReportMetric(perKernel/float64(native), "x-native")
			}
		}
	}
}
