package orchestrator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/wire"
)

// At its kernel quota, a tenant's new kernel reclaims its least recently
// used idle kernel instead of failing: the reclaimed run's files stay, its
// journal says its kernel state was reclaimed, for which run and why, and
// its next call runs in a fresh kernel that says so (fresh_kernel).
func TestIdleKernelReclaimedAtQuota(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Quotas: orchestrator.Quotas{Kernels: 2}})
	ctx := s.Ctx(t)
	a, b, c := runid.New(), runid.New(), runid.New()
	exec := func(run runid.ID, code string) wire.ExecResponse {
		t.Helper()
		out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: code})
		if err != nil {
			t.Fatalf("exec in %s: %v", run, err)
		}
		return out
	}
	exec(a, "x = 1\nopen('kept.txt', 'w').write('still here')")
	exec(b, "x = 2")
	if out := exec(c, "x = 3"); !out.OK {
		t.Fatalf("the third kernel at a quota of 2: %+v, want it to reclaim an idle one", out)
	}
	live := map[runid.ID]bool{}
	for _, run := range s.Kernels.Runs() {
		live[run] = true
	}
	if len(live) != 2 || live[a] || !live[b] || !live[c] {
		t.Fatalf("live kernels: got %v, want %s and %s (%s, the least recently used, reclaimed)", live, b, c, a)
	}
	kl, err := s.Orch.Kernels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (wire.KernelQuota{Limit: 2, Live: 2}); kl.Quota != want || len(kl.Kernels) != 2 {
		t.Errorf("GET /kernels: got quota %+v and %d kernels, want %+v and 2", kl.Quota, len(kl.Kernels), want)
	}
	for _, k := range kl.Kernels {
		if k.Busy || k.MemoryBytes == nil || *k.MemoryBytes <= 0 || k.CPUSeconds != nil || k.Started.IsZero() || k.LastUsed.Before(k.Started) {
			t.Errorf("kernel %+v: want idle, memory measured, CPU unknown (wasm), started before its last use", k)
		}
	}

	// The reclaimed run: its files are there, its variables are not, and
	// its journal says why before the step that found out.
	out := exec(a, "print(open('kept.txt').read())\nx")
	if out.Stdout != "still here\n" || out.OK || out.Error == nil || !strings.Contains(out.Error.Ename+out.Error.Message, "NameError") {
		t.Errorf("the reclaimed run's next cell: stdout %q, error %+v; want its file read and x gone (NameError)", out.Stdout, out.Error)
	}
	calls := runCalls(t, s, a)
	if len(calls) != 2 || calls[0].FreshKernel == false || !calls[1].FreshKernel {
		t.Errorf("the reclaimed run's calls: %+v, want both in fresh kernels", calls)
	}
	j, err := s.Orch.Journal(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	js := string(j)
	sec := strings.Index(js, "### Kernel state reclaimed")
	if sec < 0 || sec < strings.Index(js, "## Step 1: ") || sec > strings.Index(js, "## Step 2: ") {
		t.Fatalf("journal of the reclaimed run:\n%s\nwant a reclaim section between steps 1 and 2", js)
	}
	for _, want := range []string{"`" + c.String() + "`", "tenant " + s.Principal.Tenant, "kernel quota (2)", "least recently used idle", "files stay"} {
		if !strings.Contains(js[sec:], want) {
			t.Errorf("the reclaim section does not say %q:\n%s", want, js[sec:])
		}
	}
}

// Only busy kernels count against the quota: with every kernel running a
// cell, a new one is refused with quota and a suggestion the caller can
// act on; once one is interrupted (GET /kernels' action), it is idle and
// the new kernel reclaims it.
func TestOnlyBusyKernelsCount(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Quotas: orchestrator.Quotas{Kernels: 1}})
	ctx := s.Ctx(t)
	a, b := runid.New(), runid.New()
	done := make(chan wire.ExecResponse, 1)
	running := make(chan struct{})
	var once sync.Once
	go func() {
		out, err := s.Orch.ExecStream(ctx, a, wire.ExecRequest{Code: "print('running', flush=True)\nimport time\ntime.sleep(3600)", TimeoutS: ptr(7200.0)},
			func(orchestrator.ExecEvent) { once.Do(func() { close(running) }) })
		if err != nil {
			t.Errorf("the long cell: %v", err)
		}
		done <- out
	}()
	<-running
	if kl, err := s.Orch.Kernels(ctx); err != nil || kl.Quota.Busy != 1 || len(kl.Kernels) != 1 || !kl.Kernels[0].Busy {
		t.Fatalf("GET /kernels while a cell runs: %+v, %v; want one busy kernel", kl, err)
	}
	_, err := s.Orch.Exec(ctx, b, wire.ExecRequest{Code: "1"})
	fe := fault.As(err)
	if fe == nil || fe.Kind != fault.Quota || !strings.Contains(fe.Message, "in use") || !strings.Contains(fe.Suggestion, "/kernels") {
		t.Fatalf("a new kernel while the only one is busy: got %v, want quota naming the kernels in use and how to free one", err)
	}
	act, err := s.Orch.KernelAction(ctx, a, orchestrator.KernelInterrupt)
	if err != nil || !act.OK || act.Interrupted != 1 {
		t.Fatalf("interrupt: got %+v, %v; want one cell interrupted", act, err)
	}
	if out := <-done; out.Error == nil || out.Error.Kind != sandbox.KindInterrupted {
		t.Errorf("the interrupted cell: got error %+v, want kind %s", out.Error, sandbox.KindInterrupted)
	}
	if out, err := s.Orch.Exec(ctx, b, wire.ExecRequest{Code: "6 * 7"}); err != nil || !out.OK {
		t.Fatalf("a new kernel once the other is idle: %+v, %v", out, err)
	}
	if runs := s.Kernels.Runs(); len(runs) != 1 || runs[0] != b {
		t.Errorf("live kernels: got %v, want only %s's", runs, b)
	}
	// Actions on a kernel that is not live, or not the caller's, are not
	// found; an unknown action is bad input.
	if _, err := s.Orch.KernelAction(ctx, a, orchestrator.KernelStop); fault.As(err) == nil || fault.As(err).Kind != fault.NotFound {
		t.Errorf("stop a reclaimed kernel: got %v, want not_found", err)
	}
	if _, err := s.Orch.KernelAction(ctx, b, "pause"); fault.As(err) == nil || fault.As(err).Kind != fault.BadInput {
		t.Errorf("an unknown action: got %v, want bad_input", err)
	}
	if act, err := s.Orch.KernelAction(ctx, b, orchestrator.KernelStop); err != nil || !act.OK || s.Kernels.Peek(b) != nil {
		t.Errorf("stop: got %+v, %v; want the kernel gone", act, err)
	}
}

// Runs of one tenant starting kernels at once at the quota never go past
// it, never reclaim one kernel twice, and never reclaim a kernel in use:
// every kernel stopped was reclaimed exactly once, and its run's journal
// says so once.
func TestKernelReclaimRace(t *testing.T) {
	const limit = 2
	probe := &countingBackend{}
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Quotas: orchestrator.Quotas{Kernels: limit},
		WrapBackend: func(b sandbox.Backend) sandbox.Backend { probe.Backend = b; return probe }})
	ctx := s.Ctx(t)
	var runs []runid.ID
	for range limit {
		run := runid.New()
		runs = append(runs, run)
		if _, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "x = 1"}); err != nil {
			t.Fatal(err)
		}
	}
	const racers = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, refused int
	for range racers {
		run := runid.New()
		runs = append(runs, run)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "1 + 1"})
			mu.Lock()
			defer mu.Unlock()
			switch fe := fault.As(err); {
			case err == nil && out.OK:
				ok++
			case fe != nil && fe.Kind == fault.Quota:
				refused++
			default:
				t.Errorf("a racing run: %+v, %v", out, err)
			}
		}()
	}
	wg.Wait()
	started, live, most := probe.counts()
	if most > limit {
		t.Errorf("at most %d kernels were live at once, over the quota of %d", most, limit)
	}
	if ok == 0 || ok+refused != racers {
		t.Errorf("racing runs: %d ran, %d refused; want every one to run or be refused, and some to run", ok, refused)
	}
	// Take every run's lock once, so each reclaim section is written.
	sections := 0
	for _, run := range runs {
		if err := s.Orch.Finalize(ctx, run, ""); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		j, err := s.Orch.Journal(ctx, run)
		if err != nil {
			continue // a refused run has no journal
		}
		n := strings.Count(string(j), "### Kernel state reclaimed")
		if n > 1 {
			t.Errorf("run %s's one kernel was reclaimed %d times", run, n)
		}
		sections += n
	}
	t.Logf("%d racing runs: %d ran, %d refused; %d kernels started, at most %d live at once, %d reclaimed", racers, ok, refused, started, most, sections)
	if stopped := started - live; sections != stopped {
		t.Errorf("%d kernels started, %d live, so %d stopped by reclaims, but the journals record %d", started, live, stopped, sections)
	}
}

// countingBackend counts the kernels its backend starts and how many are
// live at once.
type countingBackend struct {
	sandbox.Backend
	mu                  sync.Mutex
	started, live, most int
}

func (c *countingBackend) Unwrap() sandbox.Backend { return c.Backend }

func (c *countingBackend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Kernel, error) {
	k, err := c.Backend.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.started++
	c.live++
	c.most = max(c.most, c.live)
	c.mu.Unlock()
	return &countedKernel{Kernel: k, c: c}, nil
}

func (c *countingBackend) counts() (started, live, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, c.live, c.most
}

type countedKernel struct {
	sandbox.Kernel
	c    *countingBackend
	once sync.Once
}

func (k *countedKernel) Close() error {
	k.once.Do(func() {
		k.c.mu.Lock()
		k.c.live--
		k.c.mu.Unlock()
	})
	return k.Kernel.Close()
}
