// Command burst measures a burst of new runs on the Docker backend against the CPU floor of their kernel starts, and the host cost of an idle kernel.
//
// Usage (a Docker engine and the sandbox image are needed; see
// scripts/docker.sh; run from the module root, as root, so it can read
// the engine's processes and the containers' cgroups):
//
//	go run ./bench/burst [-runs 50] [-cells 10] [-starts 6] [-warm 2] [-idle=true]
//	    [-compare '--kernel-starts 0 --kernel-start-cpu-shares 128']
//
// It builds cmd/triad and starts `triad serve --sandbox docker` on a
// loopback port with a fresh data directory and the default pool (-warm),
// with the per-tenant quotas off (the burst is one tenant's 50 runs). Then,
// in one run of the program:
//
//  1. Start cost. -starts new runs one after another, each waiting for
//     the pool to refill, so each costs exactly one kernel start. The CPU
//     seconds of a start are the sum of what the server (with its
//     children: mkfs, mount), dockerd, the engine's containerd, the new
//     kernel's containerd-shim (with runc, its children) and the new
//     container's cgroup spent. The floor of the burst is runs × that /
//     cores: no scheduler can start the burst's kernels faster on this
//     machine.
//  2. Quiet warm cells: a run's `1+1`, -cells×3 times, nothing else
//     running: the baseline of the warm p50.
//  3. The burst: -runs new runs at once, each running -cells `1+1` cells
//     one after another. It reports when the last first exec arrived (from
//     the burst's start) as a ratio to the floor, the first execs' p50 and
//     p99, the p50 and p99 of the warm cells (each run's cells after its
//     first) that ran while the burst lasted (until the last first exec),
//     and errors.
//  4. Idle cost: with every burst run's kernel idle, the memory of one
//     idle kernel: its container's cgroup (anonymous memory, page cache,
//     kernel memory), its containerd-shim (RSS and PSS), and the server's
//     own share (its live Go heap after a GC, from GODEBUG=gctrace=1, and
//     its RSS, each as the growth from before the burst divided by the
//     kernels added), and how many idle kernels fit in 24 GiB.
//  5. The same burst on a fresh server started with -compare's flags
//     added, after its own quiet warm cells (once per ';'-separated set).
//     By default that is `--kernel-starts 0 --kernel-start-cpu-shares 128`:
//     every start begins at once at an eighth of the CPU weight, the
//     defaults before start admission was sized to the host, so the two
//     are compared in one run.
//
// -idle=false skips phase 4 (and the wait for a quiet collection before
// the burst that it needs).
//
// The load average is printed with each phase: the machine may be shared.
package main

import (
	"bufio"
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
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/triadhq/triad/bench/internal/benchenv"
	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/wire"
)

func main() {
	runs := flag.Int("runs", 50, "new runs started at once")
	cells := flag.Int("cells", 10, "`1+1` cells per run, one after another")
	starts := flag.Int("starts", 6, "kernel starts measured one at a time for the floor")
	warm := flag.Int("warm", 2, "the server's --warm (the default pool is 2)")
	cores := flag.Int("cores", runtime.NumCPU(), "cores the floor divides by")
	compare := flag.String("compare", "--kernel-starts 0 --kernel-start-cpu-shares 128", "also run the burst on a fresh server with these serve flags added, space-separated; several sets separated by ';' run one after another (empty: skip)")
	idlePhase := flag.Bool("idle", true, "measure an idle kernel's host cost after the burst (phase 4)")
	extra := flag.String("serve-flags", "", "more flags for triad serve, space-separated")
	flag.Parse()

	fmt.Printf("burst: %d runs × %d cells, --warm %d, %d cores, load %s\n", *runs, *cells, *warm, *cores, benchenv.LoadAvg())
	srv := startServer(*warm, strings.Fields(*extra))
	cleanup = srv.stop
	defer srv.stop()
	srv.waitPool(*warm)

	// 1. What one kernel start costs, in CPU seconds.
	var per []startCost
	for i := range *starts {
		before := srv.snapshot()
		d, err := srv.exec(fmt.Sprintf("r-start-%d", i), "1+1")
		if err != nil {
			fail(err)
		}
		srv.waitPool(*warm)
		after := srv.snapshot()
		c := cost(before, after)
		c.firstExec = d
		per = append(per, c)
	}
	sc := median(per)
	fmt.Printf("\n1. one kernel start, CPU seconds (median of %d, each with its run's first exec; dockerd and containerd the least, as other clients share them), load %s:\n", len(per), benchenv.LoadAvg())
	fmt.Printf("   server %.3f (children: mkfs, mount %.3f), dockerd %.3f, containerd %.3f, shim+runc %.3f, container %.3f\n",
		sc.server, sc.children, sc.dockerd, sc.containerd, sc.shim, sc.container)
	fmt.Printf("   total %.3f s; first exec with the pool refilled: p50 %.0f ms\n", sc.total(), ms(medianDur(per)))
	floor := float64(*runs) * sc.total() / float64(*cores)
	fmt.Printf("   floor for %d starts on %d cores: %.2f s\n", *runs, *cores, floor)

	// 2. Quiet warm cells.
	if _, err := srv.exec("r-quiet", "1+1"); err != nil {
		fail(err)
	}
	srv.waitPool(*warm)
	var quiet []time.Duration
	q0 := srv.snapshot()
	for range 3 * *cells {
		d, err := srv.exec("r-quiet", "1+1")
		if err != nil {
			fail(err)
		}
		quiet = append(quiet, d)
	}
	qc := cost(q0, srv.snapshot())
	fmt.Printf("\n2. quiet warm `1+1`: p50 %.1f ms, p99 %.1f ms (n=%d), load %s\n", ms(pct(quiet, 50)), ms(pct(quiet, 99)), len(quiet), benchenv.LoadAvg())
	fmt.Printf("   CPU per warm cell: %.1f ms (server %.1f, engine %.1f, shim %.1f, container %.1f)\n", 1000*qc.total()/float64(len(quiet)),
		1000*(qc.server+qc.children)/float64(len(quiet)), 1000*(qc.dockerd+qc.containerd)/float64(len(quiet)), 1000*qc.shim/float64(len(quiet)), 1000*qc.container/float64(len(quiet)))
	// The server's live heap before the burst: the next collection while
	// nothing runs (the runtime forces one at least every 2 minutes).
	var heapBefore gcLine
	if *idlePhase {
		heapBefore = srv.liveHeapAfter(time.Now())
	}
	rssBefore, kernelsBefore := srv.rss(), len(srv.containers())

	// 3. The burst.
	fmt.Printf("\n3. burst of %d new runs × %d cells, serve flags %q:\n", *runs, *cells, *extra)
	burst(srv, *runs, *cells, floor, quiet)
	if *idlePhase {
		idlePhase4(srv, *warm, heapBefore, rssBefore, kernelsBefore)
	}

	for _, cmp := range strings.Split(*compare, ";") {
		if strings.TrimSpace(cmp) == "" {
			continue
		}
		// The same burst on a fresh server with these flags.
		srv.stop()
		flags := append(strings.Fields(*extra), strings.Fields(cmp)...)
		b := startServer(*warm, flags)
		cleanup = b.stop
		defer b.stop()
		b.waitPool(*warm)
		if _, err := b.exec("r-quiet", "1+1"); err != nil {
			fail(err)
		}
		var q []time.Duration
		for range 3 * *cells {
			d, err := b.exec("r-quiet", "1+1")
			if err != nil {
				fail(err)
			}
			q = append(q, d)
		}
		fmt.Printf("\n5. the same burst on a fresh server with serve flags %q; quiet warm p50 %.1f ms, p99 %.1f ms, load %s:\n", strings.Join(flags, " "), ms(pct(q, 50)), ms(pct(q, 99)), benchenv.LoadAvg())
		burst(b, *runs, *cells, floor, q)
		srv = b
	}
}

// idlePhase4 measures what one idle kernel costs the host, with every
// burst run's kernel idle.
func idlePhase4(srv *server, warm int, heapBefore gcLine, rssBefore int64, kernelsBefore int) {
	srv.waitPool(warm)
	time.Sleep(3 * time.Second) // let the last answers' bookkeeping settle
	idle := srv.idleKernels()
	heapAfter := srv.liveHeapAfter(heapBefore.at)
	rssAfter := srv.rss()
	added := len(idle) - kernelsBefore
	fmt.Printf("\n4. idle kernel (%d idle containers), load %s:\n", len(idle), benchenv.LoadAvg())
	if len(idle) == 0 {
		fail(errors.New("no idle kernel containers found"))
	}
	m := medianMem(idle)
	fmt.Printf("   container cgroup: usage %.1f MiB = anon %.1f + page cache %.1f (shmem %.1f) + kernel %.1f\n",
		mib(m.usage), mib(m.anon), mib(m.cache), mib(m.shmem), mib(m.kmem))
	fmt.Printf("   containerd-shim: RSS %.1f MiB, PSS %.1f MiB\n", mib(m.shimRSS), mib(m.shimPSS))
	var triadPer float64
	if added > 0 && heapAfter.bytes > 0 && heapBefore.bytes > 0 {
		triadPer = max(float64(rssAfter-rssBefore), float64(heapAfter.bytes-heapBefore.bytes)) / float64(added)
		fmt.Printf("   triad server: live heap %.1f → %.1f MiB, RSS %.1f → %.1f MiB for %d more kernels: heap %.0f KiB, RSS %.0f KiB per kernel\n",
			mib(heapBefore.bytes), mib(heapAfter.bytes), mib(rssBefore), mib(rssAfter), added,
			float64(heapAfter.bytes-heapBefore.bytes)/float64(added)/1024, triadPer/1024)
	}
	// Page cache is shared (the image's files are charged to whichever
	// container read them first) and reclaimable; the marginal cost of an
	// idle kernel is what cannot be shared or dropped.
	one := float64(m.anon+m.shmem+m.kmem+m.shimPSS) + max(triadPer, 0)
	fmt.Printf("   per idle kernel (anon + shmem + kernel + shim PSS + the server's share, the larger of heap and RSS): %.1f MiB → %d idle kernels in 24 GiB\n",
		one/(1<<20), int(24*float64(1<<30)/one))
}

// burst starts runs new runs at once, each running cells `1+1` cells one
// after another, and prints what the goal 7 measures.
func burst(srv *server, runs, cells int, floor float64, quiet []time.Duration) {
	type cell struct {
		at    time.Duration // since the burst began, when the answer arrived
		took  time.Duration
		first bool
	}
	var (
		mu     sync.Mutex
		all    []cell
		errs   []string
		wg     sync.WaitGroup
		maxLd  float64
		stopLd = make(chan struct{})
	)
	go func() {
		for {
			maxLd = max(maxLd, benchenv.Load1())
			select {
			case <-stopLd:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	cpu0 := srv.snapshot()
	t0 := time.Now()
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := fmt.Sprintf("r-burst-%d", i)
			for j := range cells {
				d, err := srv.exec(run, "1+1")
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s cell %d: %v", run, j, err))
				} else {
					all = append(all, cell{at: time.Since(t0), took: d, first: j == 0})
				}
				mu.Unlock()
				if err != nil && j == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	total := time.Since(t0)
	close(stopLd)
	cpu1 := srv.snapshot()
	var firsts, warmDuring, warmAll []time.Duration
	var last time.Duration
	for _, c := range all {
		if c.first {
			firsts = append(firsts, c.took)
			last = max(last, c.at)
		}
	}
	for _, c := range all {
		if !c.first {
			warmAll = append(warmAll, c.took)
			if c.at <= last {
				warmDuring = append(warmDuring, c.took)
			}
		}
	}
	fmt.Printf("   %d errors, load now %s, highest 1-min load during it %.2f\n", len(errs), benchenv.LoadAvg(), maxLd)
	for _, e := range errs[:min(len(errs), 5)] {
		fmt.Printf("   error: %s\n", e)
	}
	if len(firsts) > 0 {
		fmt.Printf("   first exec: p50 %.2f s, p99 %.2f s; the last arrived at %.2f s\n", sec(pct(firsts, 50)), sec(pct(firsts, 99)), last.Seconds())
		fmt.Printf("   last first exec / floor = %.2f / %.2f = %.2f (goal ≤ 1.5)\n", last.Seconds(), floor, last.Seconds()/floor)
	}
	if len(warmDuring) > 0 {
		fmt.Printf("   warm cells while the burst lasted: p50 %.1f ms, p99 %.1f ms (n=%d; goal p50 ≤ 100 ms; quiet p50 %.1f ms, ratio %.2f)\n",
			ms(pct(warmDuring, 50)), ms(pct(warmDuring, 99)), len(warmDuring), ms(pct(quiet, 50)), float64(pct(warmDuring, 50))/float64(pct(quiet, 50)))
	} else {
		fmt.Printf("   no warm cell ran before the last first exec\n")
	}
	if len(warmAll) > 0 {
		fmt.Printf("   all warm cells of the burst: p50 %.1f ms, p99 %.1f ms (n=%d); whole burst %.2f s\n", ms(pct(warmAll, 50)), ms(pct(warmAll, 99)), len(warmAll), total.Seconds())
	}
	bc := cost(cpu0, cpu1)
	fmt.Printf("   CPU spent during the burst: %.1f s (server %.1f, engine %.1f, shims %.1f, containers %.1f) = %.2f s per run\n",
		bc.total(), bc.server+bc.children, bc.dockerd+bc.containerd, bc.shim, bc.container, bc.total()/float64(runs))

}

// server is the triad serve this program started.
type server struct {
	url, dir string
	cmd      *exec.Cmd
	client   *http.Client

	prefix string // of its containers' names

	gcMu sync.Mutex
	gcs  []gcLine // from GODEBUG=gctrace=1
	once sync.Once
}

type gcLine struct {
	at    time.Time
	bytes int64 // live heap marked by the collection
}

// startServer builds cmd/triad and serves it on a loopback port with the
// Docker backend.
func startServer(warm int, extra []string) *server {
	dir, err := os.MkdirTemp("", "triad-bench-burst-")
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
	args := append([]string{"serve", "--addr", addr, "--data", filepath.Join(dir, "data"), "--sandbox", "docker",
		"--warm", strconv.Itoa(warm), "--quota-kernels", "0", "--quota-runs-per-hour", "0"}, extra...)
	cmd := exec.Command(bin, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = logs, io.MultiWriter(logs, pw)
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=", "GODEBUG=gctrace=1")
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	s := &server{url: "http://" + addr, dir: dir, cmd: cmd,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	go s.readGC(pr)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		if r, err := http.Get(s.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		select {
		case <-ctx.Done():
			cleanup = s.stop
			fail(fmt.Errorf("triad serve did not answer within 3 minutes; see %s", logs.Name()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *server) stop() {
	s.once.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			_ = s.cmd.Process.Kill()
			<-done
		}
		if os.Getenv("BURST_KEEP") == "" {
			os.RemoveAll(s.dir)
		} else {
			fmt.Printf("kept %s\n", s.dir)
		}
	})
}

// gcRe matches a gctrace line's heap sizes: start->end->live MB.
var gcRe = regexp.MustCompile(`, ([0-9]+)->([0-9]+)->([0-9]+) MB,`)

func (s *server) readGC(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := gcRe.FindStringSubmatch(sc.Text()); m != nil {
			live, _ := strconv.ParseInt(m[3], 10, 64)
			s.gcMu.Lock()
			s.gcs = append(s.gcs, gcLine{at: time.Now(), bytes: live << 20})
			s.gcMu.Unlock()
		}
	}
}

// liveHeap is the live heap the last collection marked.
func (s *server) liveHeap() gcLine {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	if len(s.gcs) == 0 {
		return gcLine{at: time.Now()}
	}
	return s.gcs[len(s.gcs)-1]
}

// liveHeapAfter waits (up to 150 s: the runtime forces a collection every
// 2 minutes) for a collection after since, with nothing else running.
func (s *server) liveHeapAfter(since time.Time) gcLine {
	deadline := time.Now().Add(150 * time.Second)
	for time.Now().Before(deadline) {
		if g := s.liveHeap(); g.at.After(since.Add(time.Second)) && time.Since(g.at) < 2*time.Second {
			return g
		}
		time.Sleep(500 * time.Millisecond)
	}
	return s.liveHeap()
}

func (s *server) rss() int64 {
	v, _, _ := procmem.RSS(s.cmd.Process.Pid)
	return v
}

// exec runs one cell of run through POST /sandbox/exec.
func (s *server) exec(run, code string) (time.Duration, error) {
	body, _ := json.Marshal(wire.ExecRequest{Code: code})
	req, _ := http.NewRequest(http.MethodPost, s.url+"/sandbox/exec", bytes.NewReader(body))
	req.Header.Set("X-Run-Id", run)
	t0 := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	var out wire.ExecResponse
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || !out.OK || !bytes.Contains(b, []byte(`"text/plain":"2"`)) {
		return d, fmt.Errorf("exec: %d %.300s", resp.StatusCode, b)
	}
	return d, nil
}

// waitPool waits until the server's warm pool holds n kernels.
func (s *server) waitPool(n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if s.metric("triad_warm_pool_size") >= float64(n) {
			return
		}
		// Each scrape costs the server CPU that the start cost counts.
		time.Sleep(250 * time.Millisecond)
	}
	fail(fmt.Errorf("the warm pool did not reach %d kernels in 5 minutes", n))
}

// metric reads one unlabelled-or-first sample of a metric from /metrics.
func (s *server) metric(name string) float64 {
	r, err := s.client.Get(s.url + "/metrics")
	if err != nil {
		return -1
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	return -1
}

// snap is the CPU time, in seconds, each party had spent at one moment;
// containers and shims by container id.
type snap struct {
	server, children, dockerd, containerd float64
	containers, shims                     map[string]float64
}

// startCost is CPU seconds by party.
type startCost struct {
	server, children, dockerd, containerd, shim, container float64
	firstExec                                              time.Duration
}

func (c startCost) total() float64 {
	return c.server + c.children + c.dockerd + c.containerd + c.shim + c.container
}

// cost is what was spent between two snapshots. A container or shim that
// is new in b counts whole; one already in a counts its growth.
func cost(a, b snap) startCost {
	c := startCost{server: b.server - a.server, children: b.children - a.children,
		dockerd: b.dockerd - a.dockerd, containerd: b.containerd - a.containerd}
	for id, v := range b.containers {
		c.container += v - a.containers[id]
	}
	for id, v := range b.shims {
		c.shim += v - a.shims[id]
	}
	return c
}

func (s *server) snapshot() snap {
	self, kids := procCPU(s.cmd.Process.Pid)
	x := snap{server: self, children: kids, containers: map[string]float64{}, shims: map[string]float64{}}
	if pid := pidFile("/var/run/docker.pid"); pid > 0 {
		a, b := procCPU(pid)
		x.dockerd = a + b
	}
	if pid := pidFile("/var/run/docker/containerd/containerd.pid"); pid > 0 {
		a, b := procCPU(pid)
		x.containerd = a + b
	}
	for _, id := range s.containers() {
		x.containers[id] = containerCPU(id)
		if pid := shimPid(id); pid > 0 {
			a, b := procCPU(pid)
			x.shims[id] = a + b
		}
	}
	return x
}

// containers lists the full ids of this server's running kernel
// containers: those whose name starts with its prefix, learnt from the
// first one found with a mount under this server's directory (the machine
// may run other servers' kernels).
func (s *server) containers() []string {
	out, _ := exec.Command("docker", "ps", "--no-trunc", "--filter", "label=dev.triad.managed=1", "--format", "{{.ID}} {{.Names}}").Output()
	var mine []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		id, name := f[0], strings.TrimPrefix(f[1], "/")
		if s.prefix == "" {
			src, _ := exec.Command("docker", "inspect", "-f", "{{range .Mounts}}{{.Source}} {{end}}", id).Output()
			if strings.Contains(string(src), s.dir) {
				s.prefix = name[:strings.LastIndexByte(name, '-')+1]
			}
		}
		if s.prefix != "" && strings.HasPrefix(name, s.prefix) {
			mine = append(mine, id)
		}
	}
	return mine
}

// procCPU is a process's own CPU seconds and its waited-for children's.
func procCPU(pid int) (self, children float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// Fields after the command (which may hold spaces) start at state.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i-3], 64); return x / 100 } // USER_HZ
	return v(14) + v(15), v(16) + v(17)
}

func pidFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// shimPid finds the containerd-shim serving a container.
func shimPid(id string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "-id" && i+1 < len(args) && args[i+1] == id {
				return pid
			}
		}
	}
	return 0
}

// cgroup finds a container's cgroup directory for a controller, v1
// (cgroupfs or systemd driver) or v2.
func cgroup(controller, id string) string {
	for _, d := range []string{
		"/sys/fs/cgroup/" + controller + "/docker/" + id,
		"/sys/fs/cgroup/" + controller + "/system.slice/docker-" + id + ".scope",
		"/sys/fs/cgroup/docker/" + id,
		"/sys/fs/cgroup/system.slice/docker-" + id + ".scope",
	} {
		if _, err := os.Stat(d); err == nil {
			return d
		}
	}
	return ""
}

// containerCPU is a container's CPU seconds so far.
func containerCPU(id string) float64 {
	if d := cgroup("cpuacct", id); d != "" {
		if b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage")); err == nil {
			ns, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			return ns / 1e9
		}
		if st := keyed(filepath.Join(d, "cpu.stat")); st != nil {
			return float64(st["usage_usec"]) / 1e6
		}
	}
	return 0
}

// keyed reads a "key value" file (memory.stat, cpu.stat).
func keyed(path string) map[string]int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			m[f[0]], _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return m
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// mem is one idle kernel's memory, in bytes.
type mem struct {
	usage, anon, cache, shmem, kmem int64
	shimRSS, shimPSS                int64
}

// idleKernels reads the memory of every kernel container of the server.
func (s *server) idleKernels() []mem {
	var out []mem
	for _, id := range s.containers() {
		var m mem
		d := cgroup("memory", id)
		if d == "" {
			continue
		}
		if st := keyed(filepath.Join(d, "memory.stat")); st != nil {
			if _, v1 := st["total_rss"]; v1 {
				m.usage = readInt(filepath.Join(d, "memory.usage_in_bytes"))
				m.anon, m.cache, m.shmem = st["total_rss"], st["total_cache"]-st["total_shmem"], st["total_shmem"]
				m.kmem = readInt(filepath.Join(d, "memory.kmem.usage_in_bytes"))
			} else {
				m.usage = readInt(filepath.Join(d, "memory.current"))
				m.anon, m.cache, m.shmem = st["anon"], st["file"]-st["shmem"], st["shmem"]
				m.kmem = st["kernel"]
			}
		}
		if pid := shimPid(id); pid > 0 {
			m.shimRSS, m.shimPSS = smaps(pid)
		}
		out = append(out, m)
	}
	return out
}

// smaps is a process's RSS and PSS in bytes.
func smaps(pid int) (rss, pss int64) {
	f, _ := procmem.Rollup(pid)
	return f["Rss"], f["Pss"]
}

func medianMem(ms []mem) mem {
	pick := func(f func(mem) int64) int64 {
		v := make([]int64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[len(v)/2]
	}
	return mem{
		usage: pick(func(m mem) int64 { return m.usage }), anon: pick(func(m mem) int64 { return m.anon }),
		cache: pick(func(m mem) int64 { return m.cache }), shmem: pick(func(m mem) int64 { return m.shmem }),
		kmem: pick(func(m mem) int64 { return m.kmem }), shimRSS: pick(func(m mem) int64 { return m.shimRSS }),
		shimPSS: pick(func(m mem) int64 { return m.shimPSS }),
	}
}

// median takes each party's median over the measured starts.
func median(cs []startCost) startCost {
	pick := func(f func(startCost) float64) float64 {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = f(c)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return startCost{
		server: pick(func(c startCost) float64 { return c.server }), children: pick(func(c startCost) float64 { return c.children }),
		// The engine serves every client on the machine, so its growth
		// over one start also counts other people's containers: the least
		// of the starts is the closest to this start's own share.
		dockerd: least(cs, func(c startCost) float64 { return c.dockerd }), containerd: least(cs, func(c startCost) float64 { return c.containerd }),
		shim: pick(func(c startCost) float64 { return c.shim }), container: pick(func(c startCost) float64 { return c.container }),
	}
}

func least(cs []startCost, f func(startCost) float64) float64 {
	v := f(cs[0])
	for _, c := range cs[1:] {
		v = min(v, f(c))
	}
	return v
}

func medianDur(cs []startCost) time.Duration {
	var d []time.Duration
	for _, c := range cs {
		d = append(d, c.firstExec)
	}
	return pct(d, 50)
}

func pct(ts []time.Duration, q int) time.Duration {
	s := append([]time.Duration(nil), ts...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*q/100]
}

func ms(d time.Duration) float64  { return float64(d.Microseconds()) / 1000 }
func sec(d time.Duration) float64 { return d.Seconds() }
func mib(b int64) float64         { return float64(b) / (1 << 20) }

// cleanup stops the server this program started, if any.
var cleanup = func() {}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "burst:", err)
	cleanup()
	os.Exit(1)
}
