// Command neighbour measures how much one run's flood slows another run's warm `1+1` on one triad server, as ratios to a quiet p50 measured in the same run.
//
// Usage (a Docker engine and the sandbox image are needed; see scripts/docker.sh):
//
//	go run ./bench/neighbour [-n 30] [-kinds prints,displays,files,html] [-url http://127.0.0.1:8080]
//
// Without -url it builds cmd/triad and starts `triad serve --sandbox docker`
// on a loopback port with a fresh data directory. For each kind of flood it
// times run A's `1+1` through POST /sandbox/exec n times while nothing else
// runs (quiet), then while other runs flood in a loop (at least n times,
// and until the flood has completed -floods calls):
//   - prints: run B's cell prints 1 GiB, cut at the 64 MiB output limit;
//   - displays: run B's cell displays 1000 small distinct PNGs, which
//     Triad stores as run files;
//   - files: run B's cell rewrites 3000 small files, which Triad harvests;
//   - html: four runs each write a 4 MiB HTML report with tmp.write, which
//     the evaluator parses (the case issue 12 reports).
//
// It reports each phase's p50 and p90, the ratio of the flooded p50 to the
// quiet p50 just before it (the goal is at most 2), the p50 of the time A's
// cell spent in its kernel in each phase (the answer's duration_ms), how
// many calls A and B made during the flooded phase, and the load average.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/triadhq/triad/bench/internal/benchenv"
	"github.com/triadhq/triad/wire"
)

// flood is what the flooding runs repeat: a cell, or (html) a tmp.write
// of a large HTML report, by runs at once.
type flood struct {
	cell  string
	html  bool
	runs  int
	about string
}

// floods are the kinds of flood, by name.
var floods = map[string]flood{
	"prints": {runs: 1, about: "a cell printing 1 GiB into the 64 MiB output limit", cell: "for _ in range(16384):\n    print('x' * 65535)"},
	"displays": {runs: 1, about: "a cell displaying 1000 small distinct PNGs", cell: `import struct, zlib
from IPython.display import Image, display
def png(i):
    raw = b''.join(b'\x00' + bytes([i % 256, (i >> 8) % 256, 7]) * 16 for _ in range(16))
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 16, 16, 8, 2, 0, 0, 0)) +
            chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
for i in range(1000):
    display(Image(data=png(i)))`},
	"files": {runs: 1, about: "a cell rewriting 3000 small files", cell: `import os
n = globals().get('n', 0) + 1
os.makedirs('many', exist_ok=True)
for i in range(3000):
    with open('many/f%d.txt' % i, 'w') as f:
        f.write('%d %d' % (n, i))`},
	"html": {runs: 4, html: true, about: "4 runs each writing a 4 MiB HTML report with tmp.write"},
}

// report is a large HTML report with claims, numbers and links, for the
// evaluator to parse.
func report(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<html><head><title>Report %d</title></head><body><h1>Findings</h1>\n", i)
	for j := 0; b.Len() < 4<<20; j++ {
		fmt.Fprintf(&b, "<p>Region %d grew <b>%d.%d%%</b> in quarter %d, see <a href=\"https://example.org/src/%d\">source %d</a>.</p>\n", j, j%97, j%10, j%4+1, j, j)
	}
	b.WriteString("</body></html>\n")
	return b.String()
}

func main() {
	n := flag.Int("n", 30, "`1+1` calls per phase")
	kinds := flag.String("kinds", "prints,displays,files,html", "flood kinds to measure, comma-separated")
	url := flag.String("url", "", "a running triad server (default: build and start one with --sandbox docker)")
	minFloods := flag.Int("floods", 3, "flooding calls completed while run A is timed, at least")
	maxPhase := flag.Duration("max", 5*time.Minute, "longest a flooded phase goes on waiting for -floods calls")
	flag.Parse()
	for _, k := range strings.Split(*kinds, ",") {
		if _, ok := floods[k]; !ok {
			fail(fmt.Errorf("unknown kind %q (prints, displays, files, html)", k))
		}
	}
	base := *url
	if base == "" {
		base, cleanup = startServer()
		defer cleanup()
	}
	c := &client{base: base}
	quietRun := fmt.Sprintf("r-neighbour-a-%d", os.Getpid())
	floodRun := func(kind string, i int) string { return fmt.Sprintf("r-neighbour-%s-%d-%d", kind, i, os.Getpid()) }
	for range 10 {
		c.exec(quietRun, "1+1", true)
	}
	fmt.Printf("run A's warm 1+1 through POST /sandbox/exec on %s, n=%d per phase\n", base, *n)
	for _, kind := range strings.Split(*kinds, ",") {
		fmt.Printf("  %-9s %s\n", kind, floods[kind].about)
	}
	fmt.Printf("%-9s %-21s %-21s %6s  %-15s %7s %7s  %s\n", "flood", "quiet p50 / p90", "flooded p50 / p90", "ratio", "kernel p50 q/f", "calls", "floods", "load")
	for _, kind := range strings.Split(*kinds, ",") {
		fl := floods[kind]
		var runs []string
		for i := range fl.runs {
			runs = append(runs, floodRun(kind, i))
			if !fl.html {
				c.exec(runs[i], "1+1", true) // its kernel is warm before the flood
			}
		}
		quiet := c.times(quietRun, *n)
		f := c.flood(runs, fl)
		// Time A while the flood's calls run, are harvested, stored and
		// graded: at least n calls, and until the flood has completed at
		// least -floods calls, so that every phase of one is sampled.
		var loud []call
		deadline := time.Now().Add(*maxPhase)
		for len(loud) < *n || (f.calls.Load() < int64(*minFloods) && time.Now().Before(deadline)) {
			d, _ := c.exec(quietRun, "1+1", true)
			loud = append(loud, d)
		}
		calls, last := f.stop()
		qt, lt := totals(quiet), totals(loud)
		r := float64(p(lt, 50)) / float64(p(qt, 50))
		fmt.Printf("%-9s %8.1f / %8.1f ms  %8.1f / %8.1f ms  %5.2fx  %5.0f / %5.0f ms %7d %7d  %s\n", kind, ms(p(qt, 50)), ms(p(qt, 90)), ms(p(lt, 50)), ms(p(lt, 90)), r,
			ms(p(kernels(quiet), 50)), ms(p(kernels(loud), 50)), len(loud), calls, benchenv.LoadAvg())
		if last != "" {
			fmt.Printf("          (last flood answer: %s)\n", last)
		}
	}
}

// client calls one server.
type client struct{ base string }

// call is one timed exec.
type call struct {
	total  time.Duration // the HTTP call
	kernel time.Duration // the cell in the kernel (the answer's duration_ms)
}

// exec runs one cell for run and returns how long the call took and a
// summary of the answer. With mustOK, an answer that is not ok ends the
// program.
func (c *client) exec(run, code string, mustOK bool) (call, string) {
	body, _ := json.Marshal(wire.ExecRequest{Code: code})
	req, _ := http.NewRequest(http.MethodPost, c.base+"/sandbox/exec", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", run)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fail(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	var out wire.ExecResponse
	_ = json.Unmarshal(b, &out)
	if mustOK && (resp.StatusCode != 200 || !out.OK) {
		fail(fmt.Errorf("exec %q for %s: %d %.300s", code, run, resp.StatusCode, b))
	}
	summary := fmt.Sprintf("%d ok=%v files_out=%d display=%d", resp.StatusCode, out.OK, len(out.FilesOut), len(out.Display))
	if out.Error != nil {
		summary += " error=" + out.Error.Kind
	}
	return call{total: d, kernel: time.Duration(out.DurationMs) * time.Millisecond}, summary
}

// times runs `1+1` n times for run, one after the other.
func (c *client) times(run string, n int) []call {
	ts := make([]call, n)
	for i := range ts {
		ts[i], _ = c.exec(run, "1+1", true)
	}
	return ts
}

// flooder repeats a flood's call in each of its runs until stopped.
type flooder struct {
	quit  chan struct{}
	done  sync.WaitGroup
	calls atomic.Int64
	last  atomic.Value // string
}

func (c *client) flood(runs []string, fl flood) *flooder {
	f := &flooder{quit: make(chan struct{})}
	for _, run := range runs {
		f.done.Add(1)
		go func() {
			defer f.done.Done()
			for i := 0; ; i++ {
				select {
				case <-f.quit:
					return
				default:
				}
				var s string
				if fl.html {
					s = c.write(run, "report.html", report(i))
				} else {
					_, s = c.exec(run, fl.cell, false)
				}
				f.calls.Add(1)
				f.last.Store(s)
			}
		}()
	}
	return f
}

// write stores text as path in run with POST /tmp/write and summarises
// the answer.
func (c *client) write(run, path, text string) string {
	body, _ := json.Marshal(wire.WriteRequest{Path: path, Text: &text})
	req, _ := http.NewRequest(http.MethodPost, c.base+"/tmp/write", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", run)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fail(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return fmt.Sprintf("%d %.200s", resp.StatusCode, b)
}

// stop ends the flood after its calls in flight and reports how many
// calls it had completed and the last answer.
func (f *flooder) stop() (int64, string) {
	n := f.calls.Load()
	close(f.quit)
	f.done.Wait()
	s, _ := f.last.Load().(string)
	return n, s
}

// startServer builds cmd/triad and serves it on a loopback port with the
// Docker backend; stop ends it.
func startServer() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "triad-bench-neighbour-")
	if err != nil {
		fail(err)
	}
	bin, err := benchenv.BuildTriad(dir)
	if err != nil {
		fail(err)
	}
	addr, err := benchenv.FreeAddr()
	if err != nil {
		fail(err)
	}
	logs, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(bin, "serve", "--addr", addr, "--data", filepath.Join(dir, "data"), "--sandbox", "docker")
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logs.Close()
		os.RemoveAll(dir)
	}
	url = "http://" + addr
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		if r, err := http.Get(url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return url, stop
			}
		}
		select {
		case <-ctx.Done():
			cleanup = stop
			fail(errors.New("triad serve did not answer within 3 minutes"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func totals(cs []call) []time.Duration {
	out := make([]time.Duration, len(cs))
	for i, c := range cs {
		out[i] = c.total
	}
	return out
}

func kernels(cs []call) []time.Duration {
	out := make([]time.Duration, len(cs))
	for i, c := range cs {
		out[i] = c.kernel
	}
	return out
}

func p(ts []time.Duration, q int) time.Duration {
	s := append([]time.Duration(nil), ts...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*q/100]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cleanup stops the server this program started, if any.
var cleanup = func() {}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "neighbour:", err)
	cleanup()
	os.Exit(1)
}
