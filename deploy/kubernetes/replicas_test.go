package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/sandbox/kube"
	"github.com/triadhq/triad/wire"
)

var (
	triadOnce sync.Once
	triadBin  string
	triadErr  error
)

// triadBinary builds cmd/triad once per test binary.
func triadBinary(t testing.TB) string {
	t.Helper()
	triadOnce.Do(func() {
		dir, err := os.MkdirTemp("", "triad-bin-")
		if err != nil {
			triadErr = err
			return
		}
		triadBin = filepath.Join(dir, "triad")
		out, err := exec.Command("go", "build", "-o", triadBin, "github.com/triadhq/triad/cmd/triad").CombinedOutput()
		if err != nil {
			triadErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if triadErr != nil {
		t.Fatal(triadErr)
	}
	return triadBin
}

// deployment is a Triad deployment under test: one MinIO bucket, one
// owner name on the cluster, and `triad serve` replicas as host processes.
type deployment struct {
	t     testing.TB
	c     *cluster
	bin   string
	s3    *miniotest.Server
	owner string
}

func newDeployment(t testing.TB) *deployment {
	c := needCluster(t)
	d := &deployment{t: t, c: c, bin: triadBinary(t), s3: miniotest.New(t),
		owner: fmt.Sprintf("e2e-%d-%d", os.Getpid()%10000, time.Now().UnixNano()%1e6)}
	// Whatever a test leaves, the deployment's pods and Leases go with it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sel := kube.LabelOwner + "=" + d.owner
		zero := int64(0)
		pods, _ := c.triadClient.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		for _, p := range pods.Items {
			_ = c.triadClient.CoreV1().Pods(c.namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		leases, _ := c.triadClient.CoordinationV1().Leases(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		for _, l := range leases.Items {
			_ = c.triadClient.CoordinationV1().Leases(c.namespace).Delete(ctx, l.Name, metav1.DeleteOptions{})
		}
	})
	return d
}

// replica is one `triad serve` process.
type replica struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	url  string
	logs *testenv.Buffer
	done chan struct{}
}

// start runs a replica; it is stopped (SIGTERM) when the test ends.
func (d *deployment) start(name string, extra ...string) *replica {
	t := d.t
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := append([]string{"serve", "--addr", addr, "--data", t.TempDir(), "--warm", "1",
		"--kube-lease-duration", "5s", "--kube-owner", d.owner}, extra...)
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=", "TRIAD_SANDBOX=kube", "TRIAD_STORE=s3",
		"TRIAD_S3_ENDPOINT="+d.s3.Endpoint, "TRIAD_S3_BUCKET="+d.s3.Bucket,
		"TRIAD_S3_ACCESS_KEY="+d.s3.AccessKey, "TRIAD_S3_SECRET_KEY="+d.s3.SecretKey)
	r := &replica{t: t, name: name, cmd: cmd, url: "http://" + addr, logs: &testenv.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("replica %s logs:\n%s", name, r.logs)
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-r.done:
			t.Fatalf("replica %s exited:\n%s", name, r.logs)
		default:
		}
		if resp, err := http.Get(r.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return r
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("replica %s did not answer:\n%s", name, r.logs)
	return nil
}

// stop ends the replica as an orchestrator would (SIGTERM) and waits.
func (r *replica) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		r.t.Errorf("replica %s ignored SIGTERM for a minute", r.name)
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// kill ends the replica with SIGKILL: no cleanup of any kind.
func (r *replica) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// call makes one request for run and decodes the answer into out; it
// returns the status.
func (r *replica) call(method, path, run string, body, out any) int {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.url+path, rd)
	req.Header.Set("X-Run-Id", run)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s on %s: %v", method, path, r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			r.t.Fatalf("%s %s on %s: %d %s", method, path, r.name, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

// exec runs a cell that must succeed and returns its text/plain result
// ("" for none).
func (r *replica) exec(run, code string) string {
	r.t.Helper()
	var out wire.ExecResponse
	if st := r.call("POST", "/sandbox/exec", run, wire.ExecRequest{Code: code}, &out); st != 200 || !out.OK {
		r.t.Fatalf("exec %q on %s: %d %+v", code, r.name, st, out)
	}
	if out.Result == nil {
		return ""
	}
	s, _ := out.Result.Data["text/plain"].(string)
	return s
}

func (r *replica) list(run string) []wire.FileInfo {
	r.t.Helper()
	var out wire.ListResponse
	if st := r.call("GET", "/tmp/list", run, nil, &out); st != 200 {
		r.t.Fatalf("tmp.list on %s: %d", r.name, st)
	}
	return out.Files
}

func (r *replica) journal(run string) string {
	r.t.Helper()
	req, _ := http.NewRequest("GET", r.url+"/cel", nil)
	req.Header.Set("X-Run-Id", run)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		r.t.Fatalf("GET /cel on %s: %d %s", r.name, resp.StatusCode, b)
	}
	return string(b)
}

var stepHeader = regexp.MustCompile(`(?m)^## Step (\d+): (\S+)`)

// steps returns the Step Blocks' numbers and tools in journal order.
func steps(cel string) (nums []int, tools []string) {
	for _, m := range stepHeader.FindAllStringSubmatch(cel, -1) {
		n, _ := strconv.Atoi(m[1])
		nums = append(nums, n)
		tools = append(tools, m[2])
	}
	return nums, tools
}

// checkSteps fails unless the journal's steps are 1..want in order.
func checkSteps(t *testing.T, cel string, want int) {
	t.Helper()
	nums, _ := steps(cel)
	if len(nums) != want {
		t.Fatalf("got %d Step Blocks %v, want %d", len(nums), nums, want)
	}
	for i, n := range nums {
		if n != i+1 {
			t.Fatalf("Step Blocks %v: want 1..%d, no gaps, in order", nums, want)
		}
	}
}

// callerFiles are the run's files that are not Triad's records (which
// every tmp.list call itself changes).
func callerFiles(files []wire.FileInfo) []wire.FileInfo {
	var out []wire.FileInfo
	for _, f := range files {
		if !runfiles.IsKept(f.Path) {
			out = append(out, f)
		}
	}
	return out
}

// podsGone waits until the deployment has no pods left.
func (d *deployment) podsGone() {
	d.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := d.c.triadClient.CoreV1().Pods(d.c.namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelOwner + "=" + d.owner})
		if err != nil {
			d.t.Fatal(err)
		}
		if len(list.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var names []string
			for _, p := range list.Items {
				names = append(names, p.Name)
			}
			d.t.Fatalf("pods left after every replica stopped: %v", names)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestReplicasAlternate: two replicas on one MinIO and one cluster serve
// one run call by call. The kernel's state carries over (x = 21 on A, x*2
// on B), files written on one are listed alike on the other, and CEL.md has
// steps 1..n with no gaps. Both stopped, no pod is left.
func TestReplicasAlternate(t *testing.T) {
	d := newDeployment(t)
	a, b := d.start("a"), d.start("b")
	run := "alternate-" + d.owner
	a.exec(run, "x = 21")
	if got := b.exec(run, "x * 2"); got != "42" {
		t.Errorf("x * 2 on B: got %s, want 42", got)
	}
	var w wire.FileRef
	text := "a,b\n1,2\n"
	if st := a.call("POST", "/tmp/write", run, wire.WriteRequest{Path: "data.csv", Text: &text}, &w); st != 200 {
		t.Fatalf("tmp.write on A: %d", st)
	}
	if got := b.exec(run, "import pandas as pd\ndf = pd.read_csv('data.csv')\ndf.to_csv('out.csv', index=False)\nint(df.b.sum() + x)"); got != "23" {
		t.Errorf("B reads A's file: got %s, want 23", got)
	}
	if got := a.exec(run, "open('out.csv').read()"); got != `'a,b\n1,2\n'` {
		t.Errorf("A reads B's file: got %s", got)
	}
	la, lb := callerFiles(a.list(run)), callerFiles(b.list(run))
	if len(la) != 2 || !slices.Equal(la, lb) {
		t.Errorf("tmp.list: A has %+v, B has %+v; want the same two files", la, lb)
	}
	// A deletion on one replica holds in the kernel the other one serves.
	var ok wire.OK
	if st := a.call("POST", "/tmp/delete", run, wire.PathRequest{Path: "out.csv"}, &ok); st != 200 {
		t.Fatalf("tmp.delete on A: %d", st)
	}
	if got := b.exec(run, "import os\nos.path.exists('out.csv'), x"); got != "(False, 21)" {
		t.Errorf("B after A deleted out.csv: got %s, want (False, 21)", got)
	}
	// A restart asked of one replica restarts the kernel the other serves.
	if st := a.call("POST", "/sandbox/restart", run, nil, nil); st != 200 && st != 204 {
		t.Fatalf("restart on A: %d", st)
	}
	if got := b.exec(run, "'x' in globals(), open('data.csv').read()"); got != `(False, 'a,b\n1,2\n')` {
		t.Errorf("B after A restarted the kernel: got %s, want (False, 'a,b\n1,2\n')", got)
	}
	checkSteps(t, b.journal(run), 10)
	checkSteps(t, a.journal(run), 10)
	a.stop()
	b.stop()
	d.podsGone()
}

// TestReplicasConcurrent: twenty calls on one run, at once, spread over
// two replicas, are serialized across both: the journal has steps 1..20
// and the kernel counted all twenty cells.
func TestReplicasConcurrent(t *testing.T) {
	d := newDeployment(t)
	a, b := d.start("a"), d.start("b")
	run := "concurrent-" + d.owner
	var wg sync.WaitGroup
	results := make([]string, 20)
	for i := range 20 {
		r := a
		if i%2 == 1 {
			r = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = r.exec(run, "n = globals().get('n', 0) + 1\nn")
		}()
	}
	wg.Wait()
	checkSteps(t, a.journal(run), 20)
	seen := map[string]bool{}
	for _, r := range results {
		seen[r] = true
	}
	for i := 1; i <= 20; i++ {
		if !seen[strconv.Itoa(i)] {
			t.Errorf("results %v: want each of 1..20 once", results)
			break
		}
	}
	a.stop()
	b.stop()
	d.podsGone()
}

// TestReplicaKilledMidCell: a replica killed with SIGKILL while a cell
// runs; the other serves the run's next call once the dead replica's Lease
// expires, with the interpreter state intact (the orphaned cell is
// interrupted), and the interrupted call has its Step Block, marked so.
func TestReplicaKilledMidCell(t *testing.T) {
	d := newDeployment(t)
	a, b := d.start("a"), d.start("b")
	run := "killed-" + d.owner
	a.exec(run, "x = 21")
	started := make(chan struct{})
	go func() {
		// Its answer never comes: A dies. The cell says when it runs,
		// through the streamed form of the call.
		req, _ := json.Marshal(wire.ExecRequest{Code: "import time\ny = 5\nprint('started', flush=True)\ntime.sleep(600)"})
		hr, _ := http.NewRequest("POST", a.url+"/sandbox/exec", bytes.NewReader(req))
		hr.Header.Set("X-Run-Id", run)
		hr.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "started") {
				close(started)
				break
			}
		}
		io.Copy(io.Discard, resp.Body)
	}()
	select {
	case <-started:
	case <-time.After(2 * time.Minute):
		t.Fatal("the cell never started")
	}
	time.Sleep(2 * time.Second)
	a.kill()
	if got := b.exec(run, "x * 2, y"); got != "(42, 5)" {
		t.Errorf("on B after A died mid-cell: got %s, want (42, 5)", got)
	}
	cel := b.journal(run)
	checkSteps(t, cel, 3)
	_, tools := steps(cel)
	blocks := stepHeader.FindAllStringIndex(cel, -1)
	second := cel[blocks[1][0]:blocks[2][0]]
	if tools[1] != "sandbox.exec" || !regexp.MustCompile(`Interrupted:`).MatchString(second) || !regexp.MustCompile(`time.sleep|import time`).MatchString(second) {
		t.Errorf("step 2 should be the interrupted cell:\n%s", second)
	}
	b.stop()
	d.podsGone()
}

// TestRestartAdoption: the only replica is killed with SIGKILL between
// calls and started again; the run's variables are still there, in the
// same pod.
func TestRestartAdoption(t *testing.T) {
	d := newDeployment(t)
	a := d.start("a")
	run := "restart-" + d.owner
	a.exec(run, "x = 21")
	a.kill()
	a2 := d.start("a-restarted")
	if got := a2.exec(run, "x * 2"); got != "42" {
		t.Errorf("after the restart: got %s, want 42", got)
	}
	a2.stop()
	d.podsGone()
}

// BenchmarkReplicaSwitch: a 1+1 call on the replica that served the run's
// last call, against one on the other replica, which must re-read the run
// (journal, index), adopt the run's pod and materialise its files first.
// Both are timed through HTTP, interleaved. Reported: each median in ms
// and the ratio switch/same.
func BenchmarkReplicaSwitch(b *testing.B) {
	d := newDeployment(b)
	ra, rb := d.start("a"), d.start("b")
	run := "switch-" + d.owner
	ra.exec(run, "x = 1")
	one := func(r *replica) time.Duration {
		t0 := time.Now()
		r.exec(run, "1+1")
		return time.Since(t0)
	}
	var same, sw []time.Duration
	cur, other := ra, rb
	for b.Loop() {
		same = append(same, one(cur))
		sw = append(sw, one(other))
		cur, other = other, cur
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ms, mw := med(same), med(sw)
	b.ReportMetric(float64(ms.Microseconds())/1000, "same-ms")
	b.ReportMetric(float64(mw.Microseconds())/1000, "switch-ms")
	b.ReportMetric(float64(mw)/float64(ms), "switch/same")
}
