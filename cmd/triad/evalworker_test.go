package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
)

// gradeCSV writes a CSV in run through s and fails t unless the step
// gets the rubric's PASS over that one file: on its Step Block, or, when
// the evaluator could not answer in time on a loaded machine (the step is
// UNGRADED), in the late verdict the background regrade appends. It waits
// for that verdict's event, never for a time; an UNGRADED step is never
// taken for a FAIL.
func gradeCSV(t *testing.T, s *server, run, path string) {
	t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/tmp/write", strings.NewReader(`{"path":"`+path+`","text":"a,b\n1,2\n"}`))
	req.Header.Set("X-Run-Id", run)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.do(req)
	if err != nil {
		t.Error(err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("tmp.write %s: %d %s", path, resp.StatusCode, b)
		return
	}
	// Follow the run before reading its journal, so a late verdict that
	// comes in between is not missed.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", s.url+"/runs/"+run+"/events", nil)
	events, err := s.do(req)
	if err != nil {
		t.Error(err)
		return
	}
	defer events.Body.Close()
	cel := readCEL(t, s, run)
	blocks := strings.Split(cel, "\n## Step ")
	last := blocks[len(blocks)-1]
	if !strings.Contains(last, path) {
		t.Errorf("the last Step Block is not the step writing %s:\n%s", path, last)
		return
	}
	n, _, _ := strings.Cut(last, ":")
	verdict := last
	if strings.Contains(last, "**Evaluation (by Evaluator):** UNGRADED") {
		late := "\n### Late verdict of Step " + n + ":"
		if !strings.Contains(cel, late) {
			waitVerdict(t, events.Body, n)
			cel = readCEL(t, s, run)
		}
		_, verdict, _ = strings.Cut(cel, late)
	}
	if !strings.Contains(verdict, "**Evaluation (by Evaluator):** PASS") || !strings.Contains(verdict, "1 artifact") {
		t.Errorf("the step writing %s has no rubric verdict over it:\n%s", path, verdict)
	}
}

// readCEL reads run's CEL.md through s.
func readCEL(t *testing.T, s *server, run string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/cel", nil)
	req.Header.Set("X-Run-Id", run)
	resp, err := s.do(req)
	if err != nil {
		t.Error(err)
		return ""
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b)
}

// waitVerdict reads a run's event stream until the "verdict" event of
// step n.
func waitVerdict(t *testing.T, r io.Reader, n string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "verdict":
			if strings.Contains(line, `"step":`+n+`,`) {
				return
			}
		}
	}
	t.Errorf("the event stream ended before the late verdict of step %s: %v", n, sc.Err())
}

// TestEvalWorkersShareData: two servers on one --data grade at the same
// time, each in directories of its own, and neither disturbs the other.
func TestEvalWorkersShareData(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	a := startServer(t, bin, data, "--sandbox", "none")
	b := startServer(t, bin, data, "--sandbox", "none")
	var wg sync.WaitGroup
	for i, s := range []*server{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := runid.New().String()
			for j := range 5 {
				gradeCSV(t, s, run, fmt.Sprintf("t%d-%d.csv", i, j))
			}
		}()
	}
	wg.Wait()
}

// TestEvalWorker: the rubric runs in `triad eval-worker` children of the
// server. A step whose rubric reads its file (a CSV) is graded there; a
// worker killed with SIGKILL costs the server nothing, and the next such
// step is graded by a new one; and no worker outlives the server.
func TestEvalWorker(t *testing.T) {
	bin := buildTriad(t)
	s := startServer(t, bin, t.TempDir(), "--sandbox", "none")
	run := runid.New().String()
	graded := func(path string) {
		t.Helper()
		gradeCSV(t, s, run, path)
		if t.Failed() {
			t.Fatalf("server log:\n%s", s.logs)
		}
	}
	graded("a.csv")
	workers := childrenNamed(t, s.cmd.Process.Pid, "eval-worker")
	if len(workers) == 0 {
		t.Fatalf("no eval-worker child of the server after a CSV was graded")
	}
	for _, pid := range workers {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	graded("b.csv")
	after := childrenNamed(t, s.cmd.Process.Pid, "eval-worker")
	if len(after) == 0 {
		t.Fatal("no eval-worker after the first ones were killed and another CSV was graded")
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.cmd.Wait()
	for _, pid := range after {
		for deadline := time.Now().Add(30 * time.Second); alive(pid); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("eval-worker %d outlived the server", pid)
			}
		}
	}
}

// childrenNamed lists the live children of pid whose command line holds
// name.
func childrenNamed(t *testing.T, pid int, name string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) || f[0] == "Z" {
			continue
		}
		if cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); strings.Contains(string(cmdline), name) {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	return len(f) > 0 && f[0] != "Z"
}
