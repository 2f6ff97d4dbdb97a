// Package kernels keeps one sandbox kernel per run: started on the run's first cell, drawn from a warm pool, reaped when idle.
//
// The pool is generic over sandbox.Backend: it holds kernels started with no
// owner, each with its own fresh working directory, and a run that claims
// one has its files materialised into that directory. Reaping a kernel
// loses its interpreter state but never the run's files, which live in the
// store. A session is busy from Acquire to Release (a cell running, its
// files being harvested, a command running) and is never reaped while
// busy; its idle time counts from the last Release.
//
// A run may also have code contexts (sandbox.Contexts): more interpreters
// in its kernel's sandbox. The manager keeps a run's contexts by id beyond
// the life of any one kernel: when the kernel is reaped or replaced, a
// context starts afresh on its next use, and says so.
package kernels

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/workspace"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
)

// Config configures a Manager.
type Config struct {
	Backend sandbox.Backend
	Store   *tmpfs.Store
	// Warm is how many ready kernels the pool keeps (0 disables it). A
	// backend with its own pool (sandbox.Pool) keeps its kernels itself,
	// and the manager none: Warm is then ignored.
	Warm int
	// Starts is how many kernels may be starting at once; runs beyond it
	// wait their turn in arrival order. 0 means no limit: every run's
	// start begins at once. See docs/DECISIONS.md, "Kernel start
	// admission".
	Starts int
	// IdleTTL is how long a run's kernel may sit unused before it is
	// stopped (0 never).
	IdleTTL time.Duration
	// MeterEvery is how often each live kernel is read for its run's
	// accounting (OnUsed), besides after each step and before it stops;
	// 0 reads it only then.
	MeterEvery time.Duration
	// Limits are passed to every kernel.
	Limits sandbox.Limits
	// Protect names run paths a cell may not change (the journal).
	Protect func(path string) bool
	// Omit names run paths never copied into a working directory (the
	// journal's checkpoints).
	Omit func(path string) bool
	// MaxContexts is how many code contexts a run may have besides its
	// kernel (default 4).
	MaxContexts int
	Logger      *slog.Logger
}

// Context is one of a run's code contexts: its own interpreter, with its
// own variables, in the run's sandbox.
type Context struct {
	// ID names the context in exec requests.
	ID string
	// Language is its interpreter's language (sandbox.LanguagePython, R,
	// bash, JavaScript or TypeScript).
	Language string
	// Cwd is where its cells start: a path relative to the run's files,
	// "" for their root.
	Cwd string
	// Created is when the context was made.
	Created time.Time
}

// Errors of the contexts.
var (
	// ErrNoContext means the run has no context by that id: list the
	// run's contexts, or create one.
	ErrNoContext = errors.New("kernels: no such context")
	// ErrNoContexts means the backend's kernels cannot run more than one
	// interpreter (they do not implement sandbox.Contexts).
	ErrNoContexts = errors.New("kernels: the backend has no contexts")
	// ErrNoLanguage means the backend's kernels cannot start an
	// interpreter of the language asked for (they do not implement
	// sandbox.Languages, or do not list it).
	ErrNoLanguage = errors.New("kernels: the backend has no kernel for that language")
	// ErrTooManyContexts means the run has Config.MaxContexts contexts
	// already: remove one first.
	ErrTooManyContexts = errors.New("kernels: too many contexts")
)

// contextState is a run's context: its spec, and whether it ever ran a
// cell (so that its coming back fresh is a loss worth reporting).
type contextState struct {
	Context
	used bool
	// implicit marks a language's default interpreter (its ID is the
	// language): made on first use, not listed, not counted against
	// MaxContexts.
	implicit bool
}

// Session is a run's live kernel and its working directory.
type Session struct {
	Kernel sandbox.Kernel
	Dir    *workspace.Dir
	// Fresh is true on the first Acquire after the kernel started: no
	// cell has run in it yet.
	Fresh bool

	// Started is when the kernel became the run's.
	Started time.Time

	// Guarded by Manager.mu.
	busy     int                       // uses between Acquire and Release
	lastUsed time.Time                 // when it was last released (Started until then)
	contexts map[string]sandbox.Kernel // the run's contexts live in this kernel
	// running are the cells running in it, by token: Interrupt cancels
	// them.
	running map[uint64]context.CancelFunc
	token   uint64

	// meter folds the kernel's readings for the run's accounting.
	meter meter
}

// Claim is what Acquire calls when the run has no live kernel, before it
// starts one: it counts the start against the caller's kernel quota (it
// may make room by reclaiming another run's idle kernel, see
// TakeIdle), or refuses it with an error Acquire returns. release ends
// the claim once the start is over; by then the live kernel counts by
// itself. A nil Claim claims nothing (the operator, tests).
type Claim func(ctx context.Context) (release func(), err error)

// Info is one live kernel as the manager sees it.
type Info struct {
	Run    runid.ID
	Kernel sandbox.Kernel
	// Started is when it became the run's; LastUsed when its last use
	// ended (Started before any).
	Started, LastUsed time.Time
	// Busy is true while a use runs in it: a cell, its harvest, a
	// command.
	Busy bool
	// Contexts counts its live code contexts.
	Contexts int
}

// Manager maps runs to kernels.
type Manager struct {
	c    Config
	log  *slog.Logger
	pool chan sandbox.Kernel
	// owned is the backend's own pool (sandbox.Pool), nil when the
	// manager keeps the pool.
	owned sandbox.Pool
	admit *admission

	mu       sync.Mutex
	sessions map[runid.ID]*Session
	contexts map[runid.ID][]*contextState // in creation order
	closed   bool
	used     func(ctx context.Context, run runid.ID, u Used) // OnUsed

	stop chan struct{}
	done sync.WaitGroup
}

// New returns a Manager and starts its pool filler and the loop that
// reaps idle kernels and reads live ones (tend).
func New(c Config) *Manager {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxContexts <= 0 {
		c.MaxContexts = 4
	}
	owned, ok := sandbox.Ability[sandbox.Pool](c.Backend)
	if ok {
		c.Warm = 0
	}
	m := &Manager{owned: owned, c: c, log: c.Logger, sessions: map[runid.ID]*Session{}, contexts: map[runid.ID][]*contextState{},
		stop: make(chan struct{}), pool: make(chan sandbox.Kernel, max(c.Warm, 0)), admit: newAdmission(c.Starts)}
	if c.Warm > 0 {
		m.done.Add(1)
		go m.fill()
	}
	if c.IdleTTL > 0 || c.MeterEvery > 0 {
		m.done.Add(1)
		go m.tend()
	}
	return m
}

// Backend returns the backend's name ("docker" or "wasm").
func (m *Manager) Backend() string { return m.c.Backend.Name() }

// RunsCommands reports whether the backend's kernels run commands
// (sandbox.Commander), for documents that say what this server takes. A
// backend says so by a RunsCommands method (found through wrappers); one
// that does not is assumed to (Docker, Kubernetes).
func (m *Manager) RunsCommands() bool {
	if rc, ok := sandbox.Ability[commandRunner](m.c.Backend); ok {
		return rc.RunsCommands()
	}
	return true
}

// commandRunner is a backend that says whether its kernels run commands.
type commandRunner interface {
	sandbox.Backend
	RunsCommands() bool
}

// Image returns what the backend names its kernels' image (a Docker image
// tag, the python.wasm build), or "" when it names none.
func (m *Manager) Image() string {
	if im, ok := sandbox.Ability[sandbox.Imager](m.c.Backend); ok {
		return im.Image()
	}
	return ""
}

// Runtime returns the container runtime the backend's kernels run under
// ("runc", "runsc"), or "" when it names none (wasm).
func (m *Manager) Runtime() string {
	if r, ok := sandbox.Ability[sandbox.Runtimer](m.c.Backend); ok {
		return r.Runtime()
	}
	return ""
}

// Acquire returns the run's session, starting a kernel from spec (the
// run's template: its image and limits over Config.Limits; from the pool
// when spec asks for nothing beyond the defaults and a kernel is ready)
// and materialising the run's files on first use. The session is busy,
// and never reaped, until Release; each Acquire needs its own Release (a
// command that outlives its call holds one). Callers serialize Acquire per
// run.
//
// A kernel is started only after claim (if not nil) allowed it, and the
// claim is released once the session is in the map: a kernel the run is
// starting counts against its tenant's quota through the claim, a live
// one through the map, never neither.
func (m *Manager) Acquire(ctx context.Context, run runid.ID, spec sandbox.Spec, claim Claim) (*Session, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	if s, ok := m.sessions[run]; ok {
		s.busy++
		s.Fresh = false
		m.mu.Unlock()
		return s, nil
	}
	m.mu.Unlock()

	if claim != nil {
		release, err := claim(ctx)
		if err != nil {
			return nil, err
		}
		defer release() // after the session is in the map (below)
	}
	k, err := m.kernel(ctx, run, spec)
	if err != nil {
		return nil, err
	}
	dir := workspace.Open(m.c.Store, run, k.Files(), m.log)
	dir.Protect, dir.Omit = m.c.Protect, m.c.Omit
	if err := dir.Materialize(ctx); err != nil {
		k.Close()
		return nil, fmt.Errorf("materialise run %s into its kernel: %w", run, err)
	}
	now := time.Now()
	s := &Session{Kernel: k, Dir: dir, Fresh: true, busy: 1, Started: now, lastUsed: now}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		k.Close()
		return nil, sandbox.ErrClosed
	}
	m.sessions[run] = s
	return s, nil
}

// Release ends a use of the run's session that Acquire began: it is idle
// from now, and the reaper may stop it once IdleTTL has passed. Releasing a
// session that was dropped meanwhile does nothing.
func (m *Manager) Release(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.busy > 0 {
		s.busy--
	}
	s.lastUsed = time.Now()
}

// kernel claims a pooled kernel or starts one once its turn comes (a
// kernel reaching the pool while the run waits serves it at once).
func (m *Manager) kernel(ctx context.Context, run runid.ID, spec sandbox.Spec) (sandbox.Kernel, error) {
	// The pool's kernels run the backend's image with the default limits:
	// a template's kernel starts afresh.
	pool := m.pool
	if spec.Image != "" || spec.Limits.Or(m.c.Limits) != m.c.Limits {
		pool = nil
	}
	select {
	case k := <-pool:
		m.log.DebugContext(ctx, "claimed a warm kernel", "run", run, "kernel", k.ID())
		return k, nil
	default:
	}
	k, err := m.admit.acquire(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("start kernel for run %s: waiting for a start slot: %w", run, err)
	}
	if k != nil {
		m.log.DebugContext(ctx, "claimed a warm kernel after waiting", "run", run, "kernel", k.ID())
		return k, nil
	}
	k, err = m.c.Backend.Start(ctx, sandbox.Spec{Owner: run.String(), Limits: spec.Limits.Or(m.c.Limits), Image: spec.Image})
	m.admit.releaseRun()
	if err != nil {
		return nil, fmt.Errorf("start kernel for run %s: %w", run, err)
	}
	return k, nil
}

// Peek returns the run's session if a kernel is live, without starting one.
func (m *Manager) Peek(run runid.ID) *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[run]
}

// Forget lets go of the run's kernel without stopping it, when its
// backend can hand it to another process (sandbox.Detacher): another
// replica may have used it since this one did, so what this session knows
// (the working directory's last sync) is stale. The next Acquire adopts the
// kernel afresh, its interpreter state intact, and materialises the run's
// files again. A kernel that cannot be detached is stopped. Either way
// its last reading is taken first: whoever adopts it reads it afresh.
func (m *Manager) Forget(run runid.ID) {
	m.mu.Lock()
	s := m.sessions[run]
	delete(m.sessions, run)
	m.mu.Unlock()
	if s != nil {
		m.meter(context.Background(), run, s, true)
		release(s.Kernel)
	}
}

// release detaches k when its backend can hand it to another process,
// and closes it otherwise.
func release(k sandbox.Kernel) error {
	if d, ok := k.(sandbox.Detacher); ok {
		return d.Detach()
	}
	return k.Close()
}

// Drop stops the run's kernel, if any, after its last reading. Its files
// stay in the store.
func (m *Manager) Drop(run runid.ID) {
	m.mu.Lock()
	s := m.sessions[run]
	delete(m.sessions, run)
	m.mu.Unlock()
	if s != nil {
		m.Retire(run, s)
	}
}

// Retire takes the last reading of a session's kernel that is out of the
// manager (TakeIdle's), and stops it.
func (m *Manager) Retire(run runid.ID, s *Session) {
	m.meter(context.Background(), run, s, true)
	s.Kernel.Close()
}

// TakeIdle takes the run's kernel out of the manager if it is idle (no
// Acquire without its Release), in one step under the manager's lock, so
// a kernel that became busy since the caller chose it is never taken. The
// caller stops it (Retire); its files stay in the store. It returns nil
// when the run has no kernel or it is busy.
func (m *Manager) TakeIdle(run runid.ID) *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[run]
	if s == nil || s.busy > 0 {
		return nil
	}
	delete(m.sessions, run)
	return s
}

// List returns the live kernels.
func (m *Manager) List() []Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Info, 0, len(m.sessions))
	for run, s := range m.sessions {
		out = append(out, Info{Run: run, Kernel: s.Kernel, Started: s.Started, LastUsed: s.lastUsed, Busy: s.busy > 0, Contexts: len(s.contexts)})
	}
	return out
}

// Running marks a cell running in s until done is called: Interrupt
// cancels it with cancel (the cell's context, so the kernel interrupts
// it as on a hang-up and keeps its state if it stops in time).
func (m *Manager) Running(s *Session, cancel context.CancelFunc) (done func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.running == nil {
		s.running = map[uint64]context.CancelFunc{}
	}
	s.token++
	t := s.token
	s.running[t] = cancel
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(s.running, t)
	}
}

// Interrupt cancels the cells running in the run's kernel and returns
// how many there were.
func (m *Manager) Interrupt(run runid.ID) int {
	m.mu.Lock()
	s := m.sessions[run]
	var cancels []context.CancelFunc
	if s != nil {
		for _, c := range s.running {
			cancels = append(cancels, c)
		}
	}
	m.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	return len(cancels)
}

// Live returns the number of runs with a live kernel.
func (m *Manager) Live() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// Runs returns the runs that have a live kernel.
func (m *Manager) Runs() []runid.ID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]runid.ID, 0, len(m.sessions))
	for run := range m.sessions {
		out = append(out, run)
	}
	return out
}

// Waiting returns the number of runs waiting for a kernel start slot
// (Config.Starts).
func (m *Manager) Waiting() int { return m.admit.waiting() }

// Pooled returns the number of ready kernels in the pool: the manager's,
// or the backend's own (sandbox.Pool).
func (m *Manager) Pooled() int {
	if m.owned != nil {
		return m.owned.Pooled()
	}
	return len(m.pool)
}

// fill keeps the pool topped up.
func (m *Manager) fill() {
	defer m.done.Done()
	backoff := time.Second
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		// Runs come first: the filler takes a slot only when no run is
		// waiting for a start or starting.
		if len(m.pool) >= m.c.Warm || !m.admit.tryAcquire() {
			select {
			case <-m.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		k, err := m.c.Backend.Start(ctx, sandbox.Spec{Limits: m.c.Limits})
		cancel()
		if err != nil {
			m.admit.release()
			m.log.Warn("warm pool: start kernel", "err", err, "retry_in", backoff)
			select {
			case <-m.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = time.Second
		// The kernel reaches the pool before the slot is handed on, so a
		// run waiting for a slot takes this kernel rather than starting
		// another. The pool has room: this loop is its only sender.
		select {
		case m.pool <- k:
			m.admit.release()
		case <-m.stop:
			m.admit.release()
			k.Close()
			return
		}
	}
}

// tend stops kernels idle past the TTL (a busy session is not idle) and
// reads every live kernel each MeterEvery, until Close.
func (m *Manager) tend() {
	defer m.done.Done()
	every := 30 * time.Second
	if m.c.IdleTTL > 0 {
		every = min(m.c.IdleTTL/4, every)
	}
	if m.c.MeterEvery > 0 {
		every = min(m.c.MeterEvery, every)
	}
	every = max(every, 100*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	metered := time.Now()
	for {
		var now time.Time
		select {
		case <-m.stop:
			return
		case now = <-tick.C:
		}
		// By the ticks' times, with half a tick's slack: a tick a little
		// early must not put the reading off by a whole period.
		if m.c.MeterEvery > 0 && now.Sub(metered) >= m.c.MeterEvery-every/2 {
			metered = now
			m.MeterAll(context.Background())
		}
		if m.c.IdleTTL <= 0 {
			continue
		}
		var idle []runid.ID
		m.mu.Lock()
		for run, s := range m.sessions {
			if s.busy == 0 && time.Since(s.lastUsed) > m.c.IdleTTL {
				idle = append(idle, run)
			}
		}
		m.mu.Unlock()
		for _, run := range idle {
			m.dropIdle(run)
		}
	}
}

// dropIdle stops the run's kernel if it is still idle past the TTL: it may
// have been acquired since the reaper looked.
func (m *Manager) dropIdle(run runid.ID) {
	m.mu.Lock()
	s := m.sessions[run]
	if s == nil || s.busy > 0 || time.Since(s.lastUsed) <= m.c.IdleTTL {
		m.mu.Unlock()
		return
	}
	delete(m.sessions, run)
	m.mu.Unlock()
	m.log.Info("stopping idle kernel; the run's files stay", "run", run)
	m.meter(context.Background(), run, s, true)
	// A kernel another process can adopt is only let go of here: its
	// backend decides when nobody uses it (sandbox/kube sweeps pods idle
	// across all replicas).
	release(s.Kernel)
}

// Close stops every kernel, pooled or live; a live kernel another process
// can adopt is detached instead, and its backend's Close decides its fate.
// It takes no last readings: the orchestrator, closed first, read every
// live kernel (MeterAll) while it could still record them. It is safe to
// call twice.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	sessions := m.sessions
	m.sessions = map[runid.ID]*Session{}
	m.mu.Unlock()
	close(m.stop)
	m.done.Wait()
	var errs []error
	for _, s := range sessions {
		errs = append(errs, release(s.Kernel))
	}
	for {
		select {
		case k := <-m.pool:
			errs = append(errs, k.Close())
		default:
			return errors.Join(errs...)
		}
	}
}
