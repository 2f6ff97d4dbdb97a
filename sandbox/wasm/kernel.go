package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/hostdir"
	"github.com/triadhq/triad/sandbox/internal/emit"
)

// bootstrap is the program python.wasm starts with: it reads the driver's
// source as the first stdin frame and runs it. Keeping the driver out of
// argv lets its frames carry a name the traceback filter recognises.
const bootstrap = "import sys;b=sys.stdin.buffer;" +
	"exec(compile(b.read(int.from_bytes(b.read(4),'big')),'<triad-driver>','exec'))"

// stopGrace is how long stopping an instance waits for its goroutine. Guest
// code notices a closed instance at its next loop back-edge or call, and
// every blocking host call (stdin, sleep) is woken, so this is only ever
// reached by a bug; the instance is then leaked rather than freed under
// running code.
const stopGrace = 10 * time.Second

// Kernel is one persistent interpreter in a wasm instance, with its own
// working directory. It implements sandbox.Kernel.
type Kernel struct {
	b        *Backend
	id       string
	owner    string
	workDir  string
	files    *hostdir.Dir
	memLimit uint64
	outLimit int64
	quota    *diskQuota

	mu     sync.Mutex // serialises Execute, Restart and Close
	inst   *instance  // nil after a failed restart; the next Execute retries
	count  int        // execution counter of the current interpreter
	closed bool

	// closing is closed first thing in Close, without mu, so that a cell
	// in progress (which holds mu) stops and lets Close in.
	closing   chan struct{}
	closeOnce sync.Once
	mem       atomic.Pointer[memStats] // the current instance's, read without mu

	// A context (NewContext) is a Kernel with its own interpreter on its
	// parent's working directory; parent is nil for a kernel. cwd is where
	// a context's cells start, as the guest sees it ("" for /work). A
	// kernel keeps its live contexts in contexts, guarded by ctxMu.
	parent   *Kernel
	cwd      string
	ctxMu    sync.Mutex
	contexts map[*Kernel]struct{}
}

// setInstance makes inst the kernel's interpreter, with a fresh counter.
func (k *Kernel) setInstance(inst *instance) {
	k.inst, k.count = inst, 0
	k.mem.Store(inst.mem)
}

var _ sandbox.Kernel = (*Kernel)(nil)

// ID implements sandbox.Kernel.
func (k *Kernel) ID() string { return k.id }

// Files implements sandbox.Kernel: the host directory the guest sees as
// /work, with the kernel's disk quota.
func (k *Kernel) Files() sandbox.WorkDir { return k.files }

// MemoryLimit returns the cap on this kernel's linear memory in bytes.
func (k *Kernel) MemoryLimit() uint64 { return k.memLimit }

// MemoryBytes returns the current size of the interpreter's linear memory,
// which is what the kernel costs while idle (pages it never touched cost no
// RAM). It is 0 while no interpreter runs.
func (k *Kernel) MemoryBytes() uint64 {
	if m := k.mem.Load(); m != nil {
		return m.size.Load()
	}
	return 0
}

// Execute implements sandbox.Kernel.
//
// The host, not the driver, decides everything about the cell's run (see
// "wasm cells end when the host sees them end" in docs/DECISIONS.md): the
// cell is over when the guest blocks reading its command channel again;
// its output is counted at the file descriptors; its deadline is a host
// timer. WASI has no signals, so a cell cannot be interrupted while it
// runs: a timeout or a hang-up closes the instance and the kernel starts a
// fresh interpreter (Restarted, state lost). A cell over its output limit
// is stopped more gently: its writes fail, which ends most cells with an
// OSError within the grace period, keeping the kernel's state.
func (k *Kernel) Execute(ctx context.Context, cell sandbox.Cell) (*sandbox.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, sandbox.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", k.id, err)
	}
	restarted := false
	if k.inst != nil {
		select {
		case <-k.inst.done: // died between cells (nothing should make it): replace it
			k.stop()
			restarted = true
		default:
		}
	}
	if k.inst == nil {
		inst, err := k.b.launch(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("kernel %s: restart interpreter: %w", k.id, err)
		}
		k.setInstance(inst)
		restarted = true
	}
	timeout := cell.Timeout
	if timeout <= 0 {
		timeout = k.b.cellTimeout
	}
	inst := k.inst
	if !cell.Setup {
		k.count++
	}
	c := &cellRun{k: k, inst: inst, n: k.count, timeout: timeout, restarted: restarted, em: emit.New(k.outLimit, cell.Output)}
	inst.io.begin(c.n, k.outLimit)
	inst.mem.refused.Store(false) // an earlier MemoryError does not explain a death now
	if k.quota != nil {
		k.quota.remeasure() // the host may have placed or removed files since
	}
	c.start = time.Now()
	gen := inst.cmd.send(encodeFrame(fmt.Appendf(nil, "%d\n%s", c.n, cell.Code)))
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var grace <-chan time.Time
	dead := false
	for {
		c.deliver()
		if inst.cmd.idle(gen) {
			c.deliver() // the guest is blocked: nothing more can arrive
			return c.complete(ctx), nil
		}
		over, broken, _, _ := inst.io.state()
		if broken != nil {
			return c.fail(ctx, stopReason{kind: sandbox.KindKernelDied, why: "the interpreter's output stream was corrupted: " + broken.Error()}), nil
		}
		if dead {
			return c.fail(ctx, stopReason{kind: sandbox.KindKernelDied, why: inst.deathReason(k.memLimit)}), nil
		}
		if over && grace == nil {
			t := time.NewTimer(k.b.grace)
			defer t.Stop()
			grace = t.C
		}
		select {
		case <-inst.notify:
		case <-inst.done:
			dead = true // go round once more: output written just before the exit counts
		case <-deadline.C:
			return c.fail(ctx, stopReason{kind: sandbox.KindTimeout, ename: "TimeoutError",
				why: fmt.Sprintf("the cell ran past its %s timeout", timeout)}), nil
		case <-grace:
			return c.fail(ctx, stopReason{kind: sandbox.KindOutputLimit, ename: "OutputLimitExceeded",
				why: fmt.Sprintf("the cell's output passed the %s limit and it did not stop within %s", emit.Bytes(c.em.Limit()), k.b.grace)}), nil
		case <-ctx.Done():
			return c.fail(ctx, stopReason{kind: sandbox.KindInterrupted, ename: "Interrupted",
				why: "the caller stopped waiting (" + context.Cause(ctx).Error() + ")"}), nil
		case <-k.closing:
			k.stop()
			return nil, fmt.Errorf("kernel %s: closed during the cell: %w", k.id, sandbox.ErrClosed)
		}
	}
}

// cellRun is one Execute in progress.
type cellRun struct {
	k         *Kernel
	inst      *instance
	n         int
	em        *emit.Meter
	start     time.Time
	timeout   time.Duration
	restarted bool
}

// stopReason says why a cell is being stopped by closing its instance.
type stopReason struct {
	kind, ename string
	why         string
}

// deliver passes the output decoded so far to the caller.
func (c *cellRun) deliver() {
	for _, e := range c.inst.io.take() {
		c.em.Emit(e)
	}
}

// complete reports a cell whose guest went back to waiting for a command.
func (c *cellRun) complete(ctx context.Context) *sandbox.Result {
	over, _, m, _ := c.inst.io.state()
	res := &sandbox.Result{ExecutionCount: c.n, Restarted: c.restarted}
	if note := c.k.quotaNote(); note != "" {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventStderr, Text: note})
	}
	if !over && m == nil {
		// The driver always answers with a result frame before it reads
		// again; without one, the cell itself read fd 0 and now sits
		// where the next command would go.
		return c.fail(ctx, stopReason{kind: sandbox.KindExecution, ename: "CommandChannelRead",
			why: "the cell read the kernel's command channel (stdin)"})
	}
	if m != nil && m.Value != nil && !over {
		over = !c.em.Emit(sandbox.Event{Kind: sandbox.EventResult, Bundle: m.Value})
	}
	res.Duration = time.Since(c.start)
	if over || c.em.Over() {
		res.Error = &sandbox.ExecError{Kind: sandbox.KindOutputLimit, Ename: "OutputLimitExceeded", Traceback: []string{},
			Evalue: fmt.Sprintf("the cell's output passed the %s limit and was stopped; the kernel kept its state", emit.Bytes(c.em.Limit()))}
		return res
	}
	res.OK = m.OK
	if !m.OK {
		res.Error = &sandbox.ExecError{Kind: sandbox.KindExecution}
		if m.Error != nil {
			res.Error.Ename, res.Error.Evalue = m.Error.Ename, m.Error.Evalue
			res.Error.Traceback = m.Error.Traceback
		}
		if res.Error.Traceback == nil {
			res.Error.Traceback = []string{}
		}
	}
	return res
}

// fail closes the instance, starts a fresh interpreter and describes what
// happened to the cell.
func (c *cellRun) fail(ctx context.Context, r stopReason) *sandbox.Result {
	k := c.k
	k.stop()
	c.deliver() // what the guest wrote before it was stopped
	if note := k.quotaNote(); note != "" {
		c.em.Emit(sandbox.Event{Kind: sandbox.EventStderr, Text: note})
	}
	res := &sandbox.Result{OK: false, ExecutionCount: c.n, Duration: time.Since(c.start)}
	e := &sandbox.ExecError{Kind: r.kind, Ename: r.ename, Traceback: []string{}}
	switch r.kind {
	case sandbox.KindKernelDied:
		e.Ename, e.Evalue, e.Reason = "KernelDied", "the interpreter died; it was restarted and its state is lost", r.why
	case sandbox.KindTimeout, sandbox.KindInterrupted:
		e.Evalue = r.why + "; running wasm code cannot be interrupted, so the interpreter was restarted and its state is lost"
	default:
		e.Evalue = r.why + "; the interpreter was restarted and its state is lost"
	}
	res.Error = e
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	defer cancel()
	if inst, err := k.b.launch(rctx, k); err != nil {
		k.b.log.ErrorContext(ctx, "wasm kernel restart failed", "kernel", k.id, "err", err)
	} else {
		k.setInstance(inst)
		res.Restarted = true
	}
	k.b.log.LogAttrs(ctx, slog.LevelWarn, "wasm cell stopped", slog.String("kernel", k.id),
		slog.String("kind", r.kind), slog.String("why", r.why), slog.Bool("restarted", res.Restarted))
	return res
}

// quotaNote explains, for the cell's stderr, that a write failed with EIO
// because the working directory is full; the errno alone cannot say so.
func (k *Kernel) quotaNote() string {
	if k.quota == nil || !k.quota.hit.Load() {
		return ""
	}
	return fmt.Sprintf("\n[triad: a write failed because the working directory reached its disk quota of %d MiB]\n", k.quota.limit>>20)
}

// Restart implements sandbox.Kernel.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return sandbox.ErrClosed
	}
	k.stop()
	inst, err := k.b.launch(ctx, k)
	if err != nil {
		return fmt.Errorf("kernel %s: restart: %w", k.id, err)
	}
	k.setInstance(inst)
	return nil
}

// Close implements sandbox.Kernel: it stops the interpreter and removes the
// working directory. It is safe to call twice.
func (k *Kernel) Close() error {
	if k.parent != nil {
		return k.closeContext()
	}
	k.closeOnce.Do(func() {
		close(k.closing)
		// A harvest in progress fails loudly from here on.
		_ = k.files.Close()
	})
	k.ctxMu.Lock()
	ctxs := make([]*Kernel, 0, len(k.contexts))
	for c := range k.contexts {
		ctxs = append(ctxs, c)
	}
	k.ctxMu.Unlock()
	for _, c := range ctxs {
		_ = c.closeContext()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	k.stop()
	k.b.forget(k)
	if err := os.RemoveAll(k.workDir); err != nil {
		return fmt.Errorf("kernel %s: remove working directory: %w", k.id, err)
	}
	return nil
}

// stop ends the current instance, if any, and waits for its goroutine.
func (k *Kernel) stop() {
	if k.inst == nil {
		return
	}
	if !k.inst.stop() {
		k.b.log.Error("wasm instance did not stop; leaking it", "kernel", k.id)
		k.b.markLeaked()
	}
	k.inst = nil
	k.mem.Store(nil)
}

// instance is one running python.wasm and the host's ends of its stdio.
type instance struct {
	mod    api.Module
	cmd    *cmdChannel
	io     *guestIO
	notify chan struct{} // poked by cmd and io
	mem    *memStats
	cancel context.CancelFunc // closes the instance (WithCloseOnContextDone)
	killed chan struct{}      // closed by stop; wakes sleeping guests
	done   chan struct{}      // closed when _start has returned
	err    error              // what _start returned; read after done

	stopOnce sync.Once
}

// bootOutput bounds what an interpreter may write while it starts (the
// driver's ready frame, warnings).
const bootOutput = 1 << 20

// launch starts an interpreter for k and waits until its driver answers
// and waits for its first command.
func (b *Backend) launch(ctx context.Context, k *Kernel) (*instance, error) {
	nonce := randomHex(16)
	notify := make(chan struct{}, 1)
	inst := &instance{
		cmd:    newCmdChannel(notify),
		io:     newGuestIO(nonce, notify),
		notify: notify,
		mem:    &memStats{},
		killed: make(chan struct{}),
		done:   make(chan struct{}),
	}
	inst.io.begin(0, bootOutput)

	fsc := wazero.NewFSConfig().(sysfs.FSConfig).
		WithSysFSMount(&sysfs.AdaptFS{FS: rootFS{mounts: []string{"lib", "work"}}}, "/").(sysfs.FSConfig).
		WithSysFSMount(workFS{FS: sysfs.DirFS(k.workDir), quota: k.quota}, "/work").(sysfs.FSConfig).
		WithSysFSMount(&sysfs.ReadFS{FS: &sysfs.AdaptFS{FS: b.libFS}}, "/lib")
	mc := wazero.NewModuleConfig().
		WithName(k.id+"-"+randomHex(4)).
		WithStartFunctions(). // _start is called below, with a context we can cancel
		WithArgs("python", "-S", "-B", "-c", bootstrap).
		WithEnv("PYTHONHOME", "/").
		WithEnv("PYTHONUTF8", "1").
		WithEnv("HOME", "/work").
		WithEnv("LANG", "C.UTF-8").
		WithEnv("PYTHONHASHSEED", "0"). // fixed for every kernel; the run's seed is set when a run claims it
		WithStdin(inst.cmd).
		WithStdout(inst.io.stdout()).
		WithStderr(inst.io.stderr()).
		WithFSConfig(fsc).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(inst.sleep).
		WithRandSource(rand.Reader)

	if k.cwd != "" {
		// A context's directory; the driver takes it out of os.environ.
		mc = mc.WithEnv("TRIAD_CWD", k.cwd)
	}
	ictx := experimental.WithMemoryAllocator(ctx, newAllocator(k.memLimit, inst.mem))
	mod, err := b.rt.InstantiateModule(ictx, b.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("instantiate python.wasm: %w", err)
	}
	inst.mod = mod
	runCtx, cancel := context.WithCancel(context.Background())
	inst.cancel = cancel
	start := mod.ExportedFunction("_start")
	go func() {
		_, err := start.Call(runCtx)
		inst.err = err
		inst.cmd.close()
		// Free the memory here, on the goroutine that ran the guest, so it is
		// never freed under running code.
		_ = mod.Close(context.Background())
		close(inst.done)
	}()

	gen := inst.cmd.send(append(encodeFrame([]byte(driverSource)), encodeFrame([]byte(nonce))...))
	for {
		_, broken, _, ready := inst.io.state()
		if ready && inst.cmd.idle(gen) {
			return inst, nil
		}
		if broken != nil {
			inst.stop()
			return nil, fmt.Errorf("interpreter start: %w", broken)
		}
		select {
		case <-inst.notify:
		case <-inst.done:
			reason := inst.deathReason(k.memLimit)
			return nil, fmt.Errorf("interpreter exited during start: %s", reason)
		case <-ctx.Done():
			inst.stop()
			return nil, fmt.Errorf("interpreter start: %w", context.Cause(ctx))
		}
	}
}

// sleep is the guest's nanosleep (time.sleep, select timeouts): real time,
// cut short when the instance is stopped so a sleeping cell cannot outlive
// its timeout.
func (i *instance) sleep(ns int64) {
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-i.killed:
	}
}

// stop closes the instance and waits for its goroutine; it reports false if
// the goroutine did not finish within stopGrace.
func (i *instance) stop() bool {
	i.stopOnce.Do(func() {
		close(i.killed)
		i.cancel()
		i.cmd.close()
	})
	select {
	case <-i.done:
		return true
	case <-time.After(stopGrace):
		return false
	}
}

// deathReason explains why _start returned on its own.
func (i *instance) deathReason(limit uint64) string {
	var why string
	var exit *sys.ExitError
	switch {
	case errors.As(i.err, &exit):
		why = fmt.Sprintf("the interpreter exited with code %d", exit.ExitCode())
	case i.err != nil:
		why = "the interpreter crashed: " + firstLine(i.err.Error())
	default:
		why = "the interpreter returned"
	}
	if i.mem.refused.Load() {
		why = fmt.Sprintf("OOM: memory limit of %d MiB reached; %s", limit>>20, why)
	}
	if tail := strings.TrimSpace(i.io.lastStderr()); tail != "" {
		why += "; stderr: " + lastLines(tail, 5)
	}
	return why
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var _ sandbox.Meter = (*Kernel)(nil)

// Usage implements sandbox.Meter: the interpreter's linear memory. The
// interpreter runs on the host's goroutines, whose CPU time Go does not
// attribute, so CPUTime is unknown (-1).
func (k *Kernel) Usage(context.Context) (sandbox.Usage, error) {
	return sandbox.Usage{At: time.Now(), CPUTime: -1, CPUs: 1, MemoryBytes: int64(k.MemoryBytes())}, nil
}

// Sample implements sandbox.Meter: Usage, which waits for nothing.
func (k *Kernel) Sample(ctx context.Context) (sandbox.Usage, error) {
	u, err := k.Usage(ctx)
	u.CPUPercent = -1
	return u, err
}
