package main_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// procMem returns a process's resident and peak resident memory, in bytes.
func procMem(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	rss, hwm, err := procmem.RSS(pid)
	if err != nil {
		t.Fatalf("read the server's memory: %v", err)
	}
	return rss, hwm
}

// execHTTP posts one cell to POST /sandbox/exec for run.
func (s *server) execHTTP(run, code string, timeoutS float64) (int, wire.ExecResponse) {
	s.t.Helper()
	b, _ := json.Marshal(wire.ExecRequest{Code: code, TimeoutS: &timeoutS})
	req, _ := http.NewRequest("POST", s.url+"/sandbox/exec", bytes.NewReader(b))
	req.Header.Set("X-Run-Id", run)
	resp, err := s.do(req)
	if err != nil {
		s.t.Fatalf("POST /sandbox/exec: %v\n%s", err, s.logs)
	}
	defer resp.Body.Close()
	var out wire.ExecResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		s.t.Fatalf("POST /sandbox/exec: %d, undecodable answer: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

// A cell printing 1 GiB runs into the default 64 MiB output limit on the
// real binary with the Docker backend: the call answers output_limit, the
// stdout file kept is no larger than the limit, and the server's resident
// memory, sampled from /proc while the call runs and read from its peak
// (VmHWM) afterwards, grows by less than 200 MiB (issue 12, class 1).
func TestFloodKeepsServerMemory(t *testing.T) {
	dockerClient(t)
	bin := buildTriad(t)
	s := startServer(t, bin, t.TempDir(), "--sandbox", "docker")
	pid := s.cmd.Process.Pid
	const run = "r-flood"
	// The run's kernel starts first, so the flood's cost is the flood's.
	if code, out := s.execHTTP(run, "x = 21", 60); code != 200 || !out.OK {
		t.Fatalf("warm-up: %d %+v\n%s", code, out, s.logs)
	}
	// Reset the peak to what the process holds now.
	if err := os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset the server's peak RSS: %v", err)
	}
	before, _ := procMem(t, pid)

	done := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		var top int64
		for {
			rss, _ := procMem(t, pid)
			top = max(top, rss)
			select {
			case <-done:
				sampled <- top
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	code, out := s.execHTTP(run, "for _ in range(16384):\n    print('x' * 65535)", 600)
	close(done)
	top := <-sampled
	_, peak := procMem(t, pid)
	growth := max(peak, top) - before
	t.Logf("server RSS before %d MiB, highest sample %d MiB, peak %d MiB: growth %d MiB", before>>20, top>>20, peak>>20, growth>>20)

	if code != 200 || out.Error == nil || out.Error.Kind != sandbox.KindOutputLimit {
		t.Fatalf("flood: got %d %+v, want 200 with kind output_limit\n%s", code, out.Error, s.logs)
	}
	if out.StdoutFile == nil {
		t.Fatal("flood: no stdout_file, want the kept text as a run file")
	}
	if out.StdoutFile.Size > sandbox.DefaultOutputBytes || out.StdoutFile.Size < sandbox.DefaultOutputBytes/2 {
		t.Errorf("stdout_file is %d bytes, want at most the %d-byte limit (and most of it)", out.StdoutFile.Size, sandbox.DefaultOutputBytes)
	}
	if growth >= 200<<20 {
		t.Errorf("the server's RSS grew by %d MiB during the flood, want under 200 MiB", growth>>20)
	}
	// The kernel kept its state, unless the flood's answer says it did not.
	if out.Kernel.Restarted {
		return
	}
	code, out = s.execHTTP(run, "x", 60)
	if code != 200 || !out.OK || out.Result == nil {
		t.Fatalf("after the flood: %d %+v", code, out)
	}
	if res, _ := out.Result.Data["text/plain"].(string); res != "21" {
		t.Errorf("after the flood: x = %q, want 21", res)
	}
}
