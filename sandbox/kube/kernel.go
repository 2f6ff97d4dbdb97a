package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/relay"
	"github.com/triadhq/triad/sandbox/jupyter"
	"github.com/triadhq/triad/sandbox/jupyter/zmtp"
)

// bootTimeout bounds a kernel's boot in a running pod: the connection
// file, the port-forward, the first kernel_info reply.
const bootTimeout = 2 * time.Minute

// adoptProbe is how long an adopted kernel gets to answer before it is
// taken to be busy with a cell nobody waits for any more (its replica
// died mid-call), which is then interrupted.
const adoptProbe = 3 * time.Second

// adoptGrace is how long an adopted, interrupted kernel has to answer
// before it is replaced (at least Config.InterruptGrace).
const adoptGrace = 30 * time.Second

// messageHeadroom is what one kernel message may carry beyond a cell's
// output limit (as in sandbox/docker).
const messageHeadroom = 16 << 20

// errBusy means an adopted kernel neither answered nor stopped its cell
// when interrupted.
var errBusy = errors.New("the adopted kernel is busy and ignores interrupts")

// podConn is Triad's side of one pod: its watch, its file agent, its
// port-forward and the Jupyter client over it.
type podConn struct {
	b     *Backend
	name  string
	watch *podWatch

	amu   sync.Mutex
	agent *agent // re-opened when its session ended

	fwd    dialer
	client *jupyter.Client // nil while the kernel is down
	info   jupyter.ConnInfo
	limits sandbox.Limits
}

// gone reports whether the pod's kernel ended for good.
func (pc *podConn) gone() bool {
	select {
	case <-pc.watch.gone:
		return true
	default:
		return false
	}
}

// agentFor returns the pod's file agent, opening a session if the last
// one ended.
func (pc *podConn) agentFor(ctx context.Context) (*agent, error) {
	pc.amu.Lock()
	defer pc.amu.Unlock()
	if pc.agent != nil && pc.agent.alive() {
		return pc.agent, nil
	}
	a, err := pc.b.startAgent(ctx, pc.name)
	if err != nil {
		return nil, err
	}
	pc.agent = a
	return a, nil
}

// dialOptions are the Jupyter client's options: every socket is a stream
// of the pod's port-forward, and every message is bounded by the output
// limit plus headroom.
func (pc *podConn) dialOptions() jupyter.Options {
	return jupyter.Options{
		Logger: pc.b.log.With("pod", pc.name),
		Limits: zmtp.Limits{MaxMessage: pc.limits.OutputBytes + messageHeadroom},
		Dial: func(ctx context.Context, _ string, port int) (net.Conn, error) {
			return pc.fwd.Dial(ctx, port)
		},
	}
}

// dialAttempt bounds the first attempt at connecting the Jupyter client:
// a port-forward whose streams stop being answered is replaced, not waited
// on (the SPDY library would wait 30 s per stream). Each later attempt
// gets twice as long, up to 8×, so that a loaded API server or sentry is
// waited on rather than given up on.
const dialAttempt = 10 * time.Second

// dial connects a new Jupyter client to the pod's kernel, over a fresh
// port-forward connection after each failed attempt, until one answers or
// ctx ends (bootTimeout when ctx has no deadline). A fixed number of
// attempts was a deadline load could miss: the CI of 92635f5 had all three
// of its 10-second attempts time out on a restart under gVisor.
func (pc *podConn) dial(ctx context.Context) (*jupyter.Client, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bootTimeout)
		defer cancel()
	}
	attempt := dialAttempt
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		c, err := jupyter.Dial(actx, pc.info, "", pc.dialOptions())
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if attempt < 8*dialAttempt {
			attempt *= 2
		}
		pc.b.log.InfoContext(ctx, "dial kernel over port-forward; retrying on a new connection", "pod", pc.name, "err", err, "next_attempt", attempt)
		_ = pc.fwd.Close()
	}
}

// close drops Triad's side of the pod; the pod itself stays.
func (pc *podConn) close() {
	if pc.client != nil {
		_ = pc.client.Close()
		pc.client = nil
	}
	if pc.fwd != nil {
		_ = pc.fwd.Close()
	}
	pc.amu.Lock()
	if pc.agent != nil {
		pc.agent.close()
	}
	pc.amu.Unlock()
	pc.b.unwatch(pc.watch)
}

// connect reaches the kernel of the running pod name: its file agent, its
// connection file, a port-forward and a Jupyter client that has had an
// answer, bounded by l's output limit. An adopted kernel may be running a cell whose caller is gone;
// it is interrupted, and fails with errBusy if that does not free it.
func (b *Backend) connect(ctx context.Context, name string, adopt bool, l sandbox.Limits) (*podConn, error) {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	pc := &podConn{b: b, name: name, watch: b.watchPod(name), fwd: b.dialerFor(name), limits: l}
	ok := false
	defer func() {
		if !ok {
			pc.close()
		}
	}()
	// The pod's kernel ending while we wait fails the boot at once.
	bctx, bcancel := context.WithCancelCause(ctx)
	defer bcancel(nil)
	go func() {
		select {
		case <-pc.watch.gone:
			bcancel(errors.New("the kernel ended while starting: " + deathReason(pc.watch.last.Load())))
		case <-bctx.Done():
		}
	}()
	a, err := pc.agentFor(bctx)
	if err != nil {
		return nil, bootError(bctx, err)
	}
	raw, err := a.conn(bctx, bootTimeout.Seconds())
	if err != nil {
		return nil, bootError(bctx, err)
	}
	if err := json.Unmarshal(raw, &pc.info); err != nil {
		return nil, fmt.Errorf("the kernel's connection file is not JSON: %w", err)
	}
	if pc.info.Transport != "tcp" || pc.info.IP != "127.0.0.1" {
		return nil, fmt.Errorf("the kernel's connection file names %s://%s, not tcp://127.0.0.1", pc.info.Transport, pc.info.IP)
	}
	c, err := pc.dial(bctx)
	if err != nil {
		return nil, bootError(bctx, fmt.Errorf("dial kernel: %w", err))
	}
	if adopt {
		pctx, pcancel := context.WithTimeout(bctx, adoptProbe)
		err = c.WaitReady(pctx)
		pcancel()
		if err != nil && bctx.Err() == nil {
			b.log.InfoContext(ctx, "adopted kernel is busy; interrupting the cell nobody waits for", "pod", name)
			// Generous: a kernel on a loaded node may just be slow, and
			// giving up here costs the run its state.
			ictx, icancel := context.WithTimeout(bctx, max(b.cfg.InterruptGrace, adoptGrace))
			_ = c.Interrupt(ictx)
			err = c.WaitReady(ictx)
			icancel()
			if err != nil && bctx.Err() == nil {
				c.Close()
				return nil, errBusy
			}
		}
	} else {
		err = c.WaitReady(bctx)
	}
	if err != nil {
		c.Close()
		return nil, bootError(bctx, fmt.Errorf("wait for kernel: %w", err))
	}
	pc.client = c
	ok = true
	return pc, nil
}

// bootError adds why the boot was cut short, when it was.
func bootError(bctx context.Context, err error) error {
	if cause := context.Cause(bctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("%w (%v)", err, cause)
	}
	return err
}

// Kernel is one run's ipykernel in a pod. It implements sandbox.Kernel
// and sandbox.Detacher. Its pod may change (a restart replaces it), its
// working directory's contents move with it.
type Kernel struct {
	b      *Backend
	run    string
	limits sandbox.Limits
	image  string // the pods' image: Config.Image or a template's
	files  *workDir
	how    string // how the first pod was found, for the start log

	// mu serializes Execute, Restart and the teardown in Close.
	mu sync.Mutex
	// pmu guards pc, which WorkDir calls read while a cell runs.
	pmu sync.RWMutex
	pc  *podConn
	// restarted is set when the kernel found at Start had died: the next
	// Result says Restarted, so the caller learns its state is gone.
	restarted bool

	lastTouch time.Time // under mu

	// egress relays the sandbox's connections to the host, over the
	// current pod's port-forward.
	egress *relay.Link

	// umu guards the uses in progress (a cell, a working-directory
	// operation: see use), and the heartbeat that marks the pod used
	// while there are any.
	umu      sync.Mutex
	uses     int
	beatStop chan struct{}
	beatLast time.Time

	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.Kernel   = (*Kernel)(nil)
	_ sandbox.Detacher = (*Kernel)(nil)
	_ sandbox.Egress   = (*Kernel)(nil)
)

func newKernel(b *Backend, run string, l sandbox.Limits, image string) *Kernel {
	if image == "" {
		image = b.cfg.Image
	}
	k := &Kernel{b: b, run: run, limits: l, image: image, closing: make(chan struct{})}
	k.files = &workDir{k: k, aliases: map[sandbox.Stamp]sandbox.Stamp{}}
	k.egress = relay.NewLink(k.dialEgress, b.log.With("run", run))
	return k
}

// EgressReady implements sandbox.Egress: the forwarder in the current pod
// answers on its port.
func (k *Kernel) EgressReady(ctx context.Context) error {
	if k.isClosing() {
		return sandbox.ErrClosed
	}
	return k.egress.Ready(ctx)
}

// AcceptEgress implements sandbox.Egress.
func (k *Kernel) AcceptEgress(ctx context.Context) (net.Conn, error) {
	return k.egress.Accept(ctx)
}

// dialEgress connects to the forwarder of the kernel's current pod.
func (k *Kernel) dialEgress(ctx context.Context) (net.Conn, error) {
	pc := k.current()
	if pc == nil {
		return nil, errors.New("the kernel has no pod")
	}
	return pc.fwd.Dial(ctx, egressPort)
}

// ID implements sandbox.Kernel: the name of the kernel's current pod.
func (k *Kernel) ID() string {
	k.pmu.RLock()
	defer k.pmu.RUnlock()
	if k.pc == nil {
		return "(no pod)"
	}
	return k.pc.name
}

// Files implements sandbox.Kernel: the pod's /work, reached through its
// file agent. It also implements sandbox.Losable.
func (k *Kernel) Files() sandbox.WorkDir { return k.files }

// current returns the kernel's pod.
func (k *Kernel) current() *podConn {
	k.pmu.RLock()
	defer k.pmu.RUnlock()
	return k.pc
}

func (k *Kernel) setCurrent(pc *podConn) {
	k.pmu.Lock()
	k.pc = pc
	k.pmu.Unlock()
}

func (k *Kernel) isClosing() bool {
	select {
	case <-k.closing:
		return true
	default:
		return false
	}
}

// place finds the kernel's first pod: the run's live pod when adopt is set
// and there is one, else a fresh one. A run pod whose kernel died but
// whose agent still answers gives its files to the fresh pod.
func (k *Kernel) place(ctx context.Context, adopt bool) error {
	b := k.b
	var found bool
	if adopt {
		pods, err := b.runPods(ctx, k.run)
		if err != nil {
			return err
		}
		found = len(pods) > 0
		var from *podConn // a dead kernel's pod whose files are wanted
		for _, p := range pods {
			usable := k.pc == nil && from == nil && p.DeletionTimestamp == nil
			if usable && running(&p, kernelContainer) && running(&p, agentContainer) {
				pc, err := b.connect(ctx, p.Name, true, k.limits)
				if err == nil {
					k.pc, k.how = pc, "adopted"
					continue
				}
				b.log.WarnContext(ctx, "could not adopt the run's pod; its files move to a fresh one", "pod", p.Name, "run", k.run, "err", err)
			}
			if usable && running(&p, agentContainer) {
				from = &podConn{b: b, name: p.Name, watch: b.watchPod(p.Name), limits: k.limits}
				continue
			}
			b.log.InfoContext(ctx, "deleting a stale pod of the run", "pod", p.Name, "run", k.run)
			b.deletePod(p.Name, "")
		}
		if k.pc != nil {
			go b.touch(k.pc.name)
			return nil
		}
		if from != nil {
			k.how, k.restarted = "recovered", true
			err := k.replace(ctx, from)
			from.close()
			return err
		}
	}
	pc, err := b.freshPod(ctx, k.limits, k.image, k.run)
	if err != nil {
		return err
	}
	k.pc, k.how, k.restarted = pc, "fresh", found
	if found {
		k.files.lost() // the run had a pod, which went with its files
	}
	return nil
}

// replace moves the kernel to a fresh pod: the old pod's kernel is
// stopped, its files are copied over through both agents, and it is
// deleted. If the old pod's files cannot be read (it was evicted or
// deleted), the working directory is lost, which Losses reports.
func (k *Kernel) replace(ctx context.Context, old *podConn) error {
	b := k.b
	if old != nil {
		if old.client != nil {
			_ = old.client.Close()
			old.client = nil
		}
		if last := old.watch.last.Load(); !old.gone() || (last != nil && running(last, agentContainer)) {
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if a, err := old.agentFor(kctx); err == nil {
				_ = a.kill(kctx)
			}
			cancel()
		}
	}
	pc, err := b.freshPod(ctx, k.limits, k.image, k.run)
	if err != nil {
		return err
	}
	if old != nil {
		if err := k.files.copyFrom(ctx, old, pc); err != nil {
			b.log.WarnContext(ctx, "the old pod's files could not be copied; the working directory starts empty", "from", old.name, "to", pc.name, "err", err)
			k.files.lost()
		}
	}
	k.setCurrent(pc)
	if old != nil {
		old.close()
		b.deletePod(old.name, "")
	}
	return nil
}

// Restart implements sandbox.Kernel: the kernel moves to a fresh pod with
// the working directory's files.
func (k *Kernel) Restart(ctx context.Context) error {
	defer k.use()()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.isClosing() {
		return sandbox.ErrClosed
	}
	return k.restartLocked(ctx)
}

func (k *Kernel) restartLocked(ctx context.Context) error {
	if k.isClosing() {
		return sandbox.ErrClosed
	}
	// Close ends a restart in progress (it waits for the lock Execute
	// holds): making a pod can take minutes.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-k.closing:
			cancel(sandbox.ErrClosed)
		case <-ctx.Done():
		}
	}()
	t := time.Now()
	old := k.current()
	if err := k.replace(ctx, old); err != nil {
		if k.isClosing() {
			return sandbox.ErrClosed
		}
		return err
	}
	k.b.log.InfoContext(ctx, "sandbox kernel restarted", "kernel", k.ID(), "run", k.run, "duration", time.Since(t).Round(time.Millisecond))
	return nil
}

// deathReason says why the kernel in pc ended: a protocol violation the
// client saw, else the pod's status.
func (k *Kernel) deathReason(ctx context.Context, pc *podConn) string {
	var v *zmtp.ViolationError
	if pc.client != nil && errors.As(pc.client.Err(), &v) {
		return v.Error()
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := k.b.cs.CoreV1().Pods(k.b.cfg.Namespace).Get(gctx, pc.name, metav1.GetOptions{})
	if err != nil {
		if last := pc.watch.last.Load(); last != nil {
			return deathReason(last)
		}
		return deathReason(nil)
	}
	return deathReason(p)
}

// violated is closed when the client gave up on the kernel for a protocol
// violation; nil (never ready) otherwise.
func (k *Kernel) violated(pc *podConn) <-chan struct{} {
	var v *zmtp.ViolationError
	if pc.client == nil || !errors.As(pc.client.Err(), &v) {
		return nil
	}
	c := make(chan struct{})
	close(c)
	return c
}

// use marks the kernel in use until the returned func is called: this
// replica's sweep leaves its pod alone, and while the use lasts the pod is
// marked used every quarter of the idle TTL, so that no replica's sweep
// takes it for idle however long a cell or a harvest runs past the TTL.
// Its end marks the pod used too, so idleness counts from the end of the
// last use, not its start.
func (k *Kernel) use() (done func()) {
	ttl := k.b.cfg.IdleTTL
	k.umu.Lock()
	k.uses++
	if k.uses == 1 && ttl > 0 {
		stop := make(chan struct{})
		k.beatStop = stop
		go k.beat(stop, max(ttl/4, 250*time.Millisecond))
	}
	k.umu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.umu.Lock()
			defer k.umu.Unlock()
			if k.uses--; k.uses > 0 || ttl <= 0 {
				return
			}
			close(k.beatStop)
			if time.Since(k.beatLast) > ttl/10 {
				k.beatLast = time.Now()
				if pc := k.current(); pc != nil {
					go k.b.touch(pc.name)
				}
			}
		})
	}
}

// busy reports whether a use is in progress.
func (k *Kernel) busy() bool {
	k.umu.Lock()
	defer k.umu.Unlock()
	return k.uses > 0
}

// beat marks the pod used every period until stop closes.
func (k *Kernel) beat(stop chan struct{}, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		k.umu.Lock()
		k.beatLast = time.Now()
		k.umu.Unlock()
		if pc := k.current(); pc != nil {
			k.b.touch(pc.name)
		}
	}
}

// touch marks the pod used, at most every tenth of the idle TTL.
func (k *Kernel) touch(pc *podConn) {
	ttl := k.b.cfg.IdleTTL
	if ttl <= 0 || time.Since(k.lastTouch) < ttl/10 {
		return
	}
	k.lastTouch = time.Now()
	go k.b.touch(pc.name)
}

// Close implements sandbox.Kernel: it deletes the kernel's pod. A cell
// running at the time ends with sandbox.ErrClosed. It is safe to call
// twice.
func (k *Kernel) Close() error { return k.release(true) }

// Detach implements sandbox.Detacher: this replica lets go of the kernel
// and its pod keeps running, with its interpreter state, for whichever
// replica next starts a kernel for the run.
func (k *Kernel) Detach() error { return k.release(false) }

func (k *Kernel) release(deletePod bool) error {
	k.closeOnce.Do(func() {
		close(k.closing)
		_ = k.egress.Close()
		k.mu.Lock()
		defer k.mu.Unlock()
		k.pmu.Lock()
		pc := k.pc
		k.pc = nil
		k.pmu.Unlock()
		if pc != nil {
			pc.close()
			if deletePod {
				k.closeErr = k.b.deletePod(pc.name, "")
			}
		}
		k.b.forget(k)
	})
	return k.closeErr
}

func newID() string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

var _ sandbox.Ports = (*Kernel)(nil)

// DialPort implements sandbox.Ports: a port-forward through the API
// server to the port on the pod's loopback, as the host reaches the
// egress forwarder; the pod's network stays closed. A port nothing listens
// on fails when first read or written (the kubelet reports it on the
// forward's error stream).
func (k *Kernel) DialPort(ctx context.Context, port int) (net.Conn, error) {
	pc := k.current()
	if pc == nil {
		return nil, sandbox.ErrClosed
	}
	return pc.fwd.Dial(ctx, port)
}
