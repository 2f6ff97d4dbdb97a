// Command abexec measures a warm, journaled POST /sandbox/exec on this
// checkout's triad against another revision's, both in the same run.
//
// Usage (a Docker engine and the sandbox image are needed; run from the
// module root):
//
//	go run ./bench/abexec [-base 10ada42] [-cells 300] [-warm 1]
//
// It builds cmd/triad from this checkout and from -base (in a temporary
// git worktree), starts `triad serve --sandbox docker` from each on a
// loopback port with a fresh data directory, makes one run on each, and
// then runs `1+1` on the two, alternating which goes first, -cells times.
// Before each timed cell an untimed GET /cel on the same run waits for the
// run's last call to be recorded, so a timed call never waits behind its
// predecessor's recording: what is timed is the call, from request to
// answer, as a caller sees it. It reports each server's p50 and the mean
// of its middle half, and their ratios (this checkout over the base): the
// issue's goal for a journaled exec is a ratio of at most 1.05.
//
// The load average is printed: the machine may be shared, and both
// servers see the same load since their cells alternate.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/triadhq/triad/bench/internal/benchenv"
)

func main() {
	base := flag.String("base", "10ada42", "the git revision to compare against")
	cells := flag.Int("cells", 300, "timed cells on each server")
	warm := flag.Int("warm", 1, "warm kernels in each server's pool")
	flag.Parse()
	if err := run(*base, *cells, *warm); err != nil {
		fmt.Fprintln(os.Stderr, "abexec:", err)
		os.Exit(1)
	}
}

func run(base string, cells, warm int) error {
	dir, err := os.MkdirTemp("", "triad-abexec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	head, err := benchenv.BuildTriad(filepath.Join(dir, "head"))
	if err != nil {
		return err
	}
	old, err := buildRev(dir, base)
	if err != nil {
		return err
	}
	fmt.Printf("load %s\n", benchenv.LoadAvg())
	a, err := start(old, filepath.Join(dir, "a"), warm)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := start(head, filepath.Join(dir, "b"), warm)
	if err != nil {
		return err
	}
	defer b.stop()
	for _, s := range []*server{a, b} {
		if s.run, err = s.newRun(); err != nil {
			return err
		}
		// Warm: the run's kernel is claimed and set up, the evaluator's
		// interpreter started.
		for range 3 {
			if _, err := s.cell(); err != nil {
				return err
			}
		}
	}
	var ta, tb []time.Duration
	for i := range cells {
		order := []*server{a, b}
		if i%2 == 1 {
			order = []*server{b, a}
		}
		for _, s := range order {
			d, err := s.cell()
			if err != nil {
				return err
			}
			if s == a {
				ta = append(ta, d)
			} else {
				tb = append(tb, d)
			}
		}
	}
	fmt.Printf("load %s\n", benchenv.LoadAvg())
	pa, pb := pct(ta, 0.5), pct(tb, 0.5)
	ma, mb := midMean(ta), midMean(tb)
	fmt.Printf("journaled warm exec, %d cells each, alternating\n", cells)
	fmt.Printf("  base %-10s p50 %7.2f ms  mid-half mean %7.2f ms\n", base, ms(pa), ms(ma))
	fmt.Printf("  this checkout    p50 %7.2f ms  mid-half mean %7.2f ms\n", ms(pb), ms(mb))
	fmt.Printf("  ratio (this / base): p50 %.3f, mid-half mean %.3f\n", float64(pb)/float64(pa), float64(mb)/float64(ma))
	return nil
}

// buildRev builds cmd/triad at rev, from a temporary worktree.
func buildRev(dir, rev string) (string, error) {
	wt := filepath.Join(dir, "base-src")
	if out, err := exec.Command("git", "worktree", "add", "--detach", wt, rev).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git worktree add %s: %v\n%s", rev, err, out)
	}
	defer exec.Command("git", "worktree", "remove", "--force", wt).Run()
	bin := filepath.Join(dir, "base", "triad")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/triad")
	cmd.Dir = wt
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", rev, err, out)
	}
	return bin, nil
}

type server struct {
	url string
	cmd *exec.Cmd
	run string
}

func start(bin, dir string, warm int) (*server, error) {
	addr, err := benchenv.FreeAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logs, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--addr", addr, "--data", filepath.Join(dir, "data"), "--sandbox", "docker",
		"--warm", fmt.Sprint(warm), "--quota-kernels", "0", "--quota-runs-per-hour", "0")
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{url: "http://" + addr, cmd: cmd}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		if r, err := http.Get(s.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-ctx.Done():
			s.stop()
			return nil, fmt.Errorf("%s serve did not answer within 5 minutes; see %s", bin, logs.Name())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func (s *server) newRun() (string, error) {
	resp, err := http.Post(s.url+"/runs", "application/json", bytes.NewReader([]byte("{}")))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		RunID string `json:"run_id"`
	}
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("POST /runs: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	return out.RunID, nil
}

// cell waits for the run's last call to be recorded (GET /cel), then times
// one `1+1` cell.
func (s *server) cell() (time.Duration, error) {
	req, _ := http.NewRequest(http.MethodGet, s.url+"/cel", nil)
	req.Header.Set("X-Run-Id", s.run)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		return 0, err
	} else {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	req, _ = http.NewRequest(http.MethodPost, s.url+"/sandbox/exec", bytes.NewReader([]byte(`{"code":"1+1"}`)))
	req.Header.Set("X-Run-Id", s.run)
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	var out struct {
		OK bool `json:"ok"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || !out.OK {
		return 0, fmt.Errorf("POST /sandbox/exec on %s: %s: %s", s.url, resp.Status, b)
	}
	return d, nil
}

func pct(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

// midMean is the mean of the middle half: the p25 to p75 cells.
func midMean(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	mid := s[len(s)/4 : len(s)-len(s)/4]
	var sum time.Duration
	for _, x := range mid {
		sum += x
	}
	return sum / time.Duration(len(mid))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
