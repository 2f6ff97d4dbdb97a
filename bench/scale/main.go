// Command scale measures how a real `triad serve` behaves as concurrent runs grow: warm exec latency, cells per second and the server's CPU per call.
//
// Usage (a Docker engine and the sandbox image are needed; see scripts/docker.sh):
//
//	go run ./bench/scale [-runs 1,10,50] [-cells 60] [-bin PATH]
//
// For each level it starts a fresh `triad serve --sandbox docker` on
// loopback (its own data directory, no kernel quota), gives each of N runs
// its own kernel with a first cell, then has every run send warm `1+1`
// cells back to back through POST /sandbox/exec, each with the journal and
// the evaluator as every real call has them. It reports the p50 and p99
// of a cell's round trip, cells per second over all runs, and the
// server's CPU time (user+system, from /proc/<pid>/stat) per call during
// the warm phase. The server is the only process measured: the kernels'
// own CPU is Docker's.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/bench/internal/benchenv"
)

func main() {
	levels := flag.String("runs", "1,10,50", "concurrent runs per level, comma-separated")
	cells := flag.Int("cells", 60, "warm cells per run")
	bin := flag.String("bin", "", "triad binary (default: built from this checkout)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "triad-bench-scale-")
	check(err)
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin, err = benchenv.BuildTriad(dir)
		check(err)
	}
	fmt.Printf("load average at start: %s\n", benchenv.LoadAvg())
	fmt.Printf("%-6s %10s %10s %12s %14s %8s\n", "runs", "p50 ms", "p99 ms", "cells/s", "CPU ms/call", "calls")
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		check(err)
		r := level(*bin, filepath.Join(dir, "level-"+f), n, *cells)
		fmt.Printf("%-6d %10.1f %10.1f %12.1f %14.2f %8d\n", n, ms(r.p50), ms(r.p99), r.rate, r.cpu, r.calls)
	}
	fmt.Printf("load average at end: %s\n", benchenv.LoadAvg())
}

type result struct {
	p50, p99 time.Duration
	rate     float64 // cells per second, all runs
	cpu      float64 // server CPU ms per call
	calls    int
}

// level runs one level against a server of its own.
func level(bin, data string, runs, cells int) result {
	srv := start(bin, data, runs)
	defer srv.stop()
	ids := make([]string, runs)
	var wg sync.WaitGroup
	// Every run gets its kernel first (kernel starts are not what this
	// measures), then a few warm cells.
	for i := range ids {
		ids[i] = fmt.Sprintf("r-scale-%d-%d", runs, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				srv.exec(ids[i])
			}
		}()
	}
	wg.Wait()
	cpu0 := srv.cpu()
	t0 := time.Now()
	lat := make([][]time.Duration, runs)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cells {
				lat[i] = append(lat[i], srv.exec(ids[i]))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	cpu := srv.cpu() - cpu0
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return result{p50: all[len(all)/2], p99: all[len(all)*99/100], rate: float64(len(all)) / wall.Seconds(),
		cpu: float64(cpu.Microseconds()) / 1000 / float64(len(all)), calls: len(all)}
}

type server struct {
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
}

func start(bin, data string, runs int) *server {
	addr, err := benchenv.FreeAddr()
	check(err)
	cmd := exec.Command(bin, "serve", "--addr", addr, "--data", data, "--auth", "none", "--sandbox", "docker",
		"--warm", strconv.Itoa(min(runs, 10)), "--quota-kernels", "0", "--quota-runs-per-hour", "0")
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	check(cmd.Start())
	s := &server{cmd: cmd, url: "http://" + addr, logs: logs}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if r, err := http.Get(s.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.stop()
	panic(fmt.Sprintf("triad serve did not answer:\n%s", logs))
}

// stop ends the server as an operator would (SIGTERM), which stops its
// kernels.
func (s *server) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		s.cmd.Process.Kill()
		<-done
	}
}

// cpu is the server's CPU time so far (user + system).
func (s *server) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	check(err)
	// Fields after the command (which may hold spaces) start at ") ".
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / hz
}

func (s *server) exec(run string) time.Duration {
	body, _ := json.Marshal(map[string]any{"code": "1+1"})
	req, _ := http.NewRequest(http.MethodPost, s.url+"/sandbox/exec", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", run)
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	check(err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"ok":true`)) {
		panic(fmt.Sprintf("exec: %d %s\n%s", resp.StatusCode, b, s.logs))
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func check(err error) {
	if err != nil {
		panic(err)
	}
}
