package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
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
	memLimit uint64
	quota    *diskQuota // nil: no disk quota

	mu     sync.Mutex // serialises Execute, Restart and Close
	inst   *instance  // nil after a failed restart; the next Execute retries
	count  int        // execution counter of the current interpreter
	closed bool

	// closing is closed first thing in Close, without mu, so that a cell
	// in progress (which holds mu) stops and lets Close in.
	closing   chan struct{}
	closeOnce sync.Once
	mem       atomic.Pointer[memStats] // the current instance's, read without mu
}

// setInstance makes inst the kernel's interpreter, with a fresh counter.
func (k *Kernel) setInstance(inst *instance) {
	k.inst, k.count = inst, 0
	k.mem.Store(inst.mem)
}

var _ sandbox.Kernel = (*Kernel)(nil)

// ID implements sandbox.Kernel.
func (k *Kernel) ID() string { return k.id }

// WorkDir implements sandbox.Kernel. The guest sees it as /work.
func (k *Kernel) WorkDir() string { return k.workDir }

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

// Execute implements sandbox.Kernel. A timeout or a dead interpreter comes
// back as a Result with Restarted set: the kernel has already started a
// fresh interpreter (same working directory, empty namespace) by the time
// Execute returns. If the caller's ctx ends first, the cell is stopped the
// same way and reported as a timeout.
func (k *Kernel) Execute(ctx context.Context, code string, timeout time.Duration) (*sandbox.Result, error) {
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
	inst := k.inst
	k.count++
	n := k.count
	req := fmt.Appendf(nil, "%d\n%s", n, code)
	inst.out.takeRaw() // bytes from before this cell are nobody's output
	inst.errw.takeRaw()
	inst.mem.refused.Store(false) // an earlier MemoryError does not explain a death now
	if k.quota != nil {
		k.quota.remeasure() // the host may have placed or removed files since
	}

	start := time.Now()
	inst.send(encodeFrame(req))
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var stdout, stderr strings.Builder
	dead := false
	for {
		msgs, ferr := inst.out.take()
		for _, m := range msgs {
			switch m.T {
			case "stream":
				if m.Name == "stderr" {
					stderr.WriteString(m.Text)
				} else {
					stdout.WriteString(m.Text)
				}
			case "result":
				if m.N != n {
					continue // a stale or forged frame; the real one follows
				}
				res := &sandbox.Result{
					OK:             m.OK,
					ExecutionCount: n,
					Duration:       time.Since(start),
					Restarted:      restarted,
				}
				res.Stdout = stdout.String() + string(inst.out.takeRaw())
				res.Stderr = stderr.String() + string(inst.errw.takeRaw()) + k.quotaNote()
				if m.Value != nil {
					res.Value = &sandbox.Bundle{Data: m.Value.Data, Metadata: m.Value.Metadata}
				}
				for _, d := range m.Display {
					res.Display = append(res.Display, sandbox.Bundle{Data: d.Data, Metadata: d.Metadata})
				}
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
				return res, nil
			}
		}
		if ferr != nil {
			return k.fail(ctx, n, start, &stdout, &stderr, sandbox.KindKernelDied,
				"the interpreter's output stream was corrupted: "+ferr.Error()), nil
		}
		if dead {
			return k.fail(ctx, n, start, &stdout, &stderr, sandbox.KindKernelDied, inst.deathReason(k.memLimit)), nil
		}
		select {
		case <-inst.out.notify:
		case <-inst.done:
			// Go round once more: frames written just before the exit count.
			dead = true
		case <-timer:
			return k.fail(ctx, n, start, &stdout, &stderr, sandbox.KindTimeout,
				fmt.Sprintf("the cell ran longer than its %s timeout", timeout)), nil
		case <-ctx.Done():
			return k.fail(ctx, n, start, &stdout, &stderr, sandbox.KindTimeout,
				"the caller stopped waiting: "+context.Cause(ctx).Error()), nil
		case <-k.closing:
			k.stop()
			return nil, fmt.Errorf("kernel %s: closed during the cell: %w", k.id, sandbox.ErrClosed)
		}
	}
}

// fail stops the current interpreter, starts a fresh one and describes what
// happened to cell n.
func (k *Kernel) fail(ctx context.Context, n int, start time.Time, stdout, stderr *strings.Builder, kind, why string) *sandbox.Result {
	inst := k.inst
	k.stop()
	res := &sandbox.Result{
		OK:             false,
		ExecutionCount: n,
		Duration:       time.Since(start),
		Stdout:         stdout.String() + string(inst.out.takeRaw()),
		Stderr:         stderr.String() + string(inst.errw.takeRaw()) + k.quotaNote(),
	}
	e := &sandbox.ExecError{Kind: kind, Traceback: []string{}}
	switch kind {
	case sandbox.KindTimeout:
		e.Ename, e.Evalue = "TimeoutError", why+"; the interpreter was restarted and its state is lost"
	default:
		e.Ename, e.Evalue, e.Reason = "KernelDied", "the interpreter died; it was restarted and its state is lost", why
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
		slog.String("kind", kind), slog.String("why", why), slog.Bool("restarted", res.Restarted))
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
	k.closeOnce.Do(func() { close(k.closing) })
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

// instance is one running python.wasm and the pipes to its driver.
type instance struct {
	mod    api.Module
	stdin  *io.PipeWriter
	out    *frameWriter
	errw   *stderrWriter
	mem    *memStats
	cancel context.CancelFunc // closes the instance (WithCloseOnContextDone)
	killed chan struct{}      // closed by stop; wakes sleeping guests
	done   chan struct{}      // closed when _start has returned
	err    error              // what _start returned; read after done

	sendq    chan []byte
	stopOnce sync.Once
}

// launch starts an interpreter for k and waits until its driver answers.
func (b *Backend) launch(ctx context.Context, k *Kernel) (*instance, error) {
	nonce := randomHex(16)
	inst := &instance{
		out:    newFrameWriter(nonce, b.maxOut),
		errw:   &stderrWriter{raw: limitedBuffer{limit: b.maxOut}},
		mem:    &memStats{},
		killed: make(chan struct{}),
		done:   make(chan struct{}),
		sendq:  make(chan []byte, 8),
	}
	stdinR, stdinW := io.Pipe()
	inst.stdin = stdinW

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
		WithStdin(stdinR).
		WithStdout(inst.out).
		WithStderr(inst.errw).
		WithFSConfig(fsc).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(inst.sleep).
		WithRandSource(rand.Reader)

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
		// Unblock a send to a driver that will never read again.
		_ = stdinR.CloseWithError(io.ErrClosedPipe)
		// Free the memory here, on the goroutine that ran the guest, so it is
		// never freed under running code.
		_ = mod.Close(context.Background())
		close(inst.done)
	}()
	go inst.feed()

	inst.send(encodeFrame([]byte(driverSource)))
	inst.send(encodeFrame(fmt.Appendf(nil, "%s %d", nonce, b.maxOut)))
	for {
		msgs, ferr := inst.out.take()
		for _, m := range msgs {
			if m.T == "ready" {
				return inst, nil
			}
		}
		if ferr != nil {
			inst.stop()
			return nil, fmt.Errorf("interpreter start: %w", ferr)
		}
		select {
		case <-inst.out.notify:
		case <-inst.done:
			reason := inst.deathReason(k.memLimit)
			return nil, fmt.Errorf("interpreter exited during start: %s", reason)
		case <-ctx.Done():
			inst.stop()
			return nil, fmt.Errorf("interpreter start: %w", context.Cause(ctx))
		}
	}
}

// send queues a frame for the driver. One writer goroutine per instance
// feeds stdin in order, so the caller never blocks on a driver that is busy
// (or a cell that reads fd 0 itself) and can watch its timeout meanwhile.
func (i *instance) send(frame []byte) {
	select {
	case i.sendq <- frame:
	case <-i.done:
	}
}

func (i *instance) feed() {
	for {
		select {
		case f := <-i.sendq:
			if _, err := i.stdin.Write(f); err != nil {
				return
			}
		case <-i.done:
			return
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
		_ = i.stdin.Close()
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
	if tail := strings.TrimSpace(i.errw.lastBytes()); tail != "" {
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
