package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
)

// errNotExist marks a missing path, as the WorkDir contract asks.
var errNotExist = fs.ErrNotExist

// workDir is a kernel's /work as a sandbox.WorkDir, through the file agent
// of whichever pod the kernel has now.
//
// Stamps are the agent's (size, device, inode, times), except after a
// restart: the files copied into the new pod have new inodes and times
// but are the files the caller last saw, so their stamps are aliased back
// to the old ones until they change (see copyFrom).
type workDir struct {
	k *Kernel

	mu      sync.Mutex
	aliases map[sandbox.Stamp]sandbox.Stamp // new pod's stamp -> the stamp the caller knows

	losses atomic.Uint64
}

var (
	_ sandbox.WorkDir = (*workDir)(nil)
	_ sandbox.Losable = (*workDir)(nil)
)

// Losses implements sandbox.Losable.
func (w *workDir) Losses() uint64 { return w.losses.Load() }

// lost records that the directory's contents are gone.
func (w *workDir) lost() {
	w.losses.Add(1)
	w.mu.Lock()
	clear(w.aliases)
	w.mu.Unlock()
}

// agent returns the current pod's file agent, or sandbox.ErrClosed.
func (w *workDir) agent(ctx context.Context) (*agent, error) {
	if w.k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	pc := w.k.current()
	if pc == nil {
		return nil, sandbox.ErrClosed
	}
	return pc.agentFor(ctx)
}

// stampOf turns the agent's stamp fields into a Stamp, aliased when the
// file was copied by a restart and has not changed since.
func (w *workDir) stampOf(raw []int64) (int64, sandbox.Stamp, error) {
	if len(raw) != 5 || raw[0] < 0 {
		return 0, "", fmt.Errorf("pod file agent sent a malformed stamp %v", raw)
	}
	s := sandbox.Stamp(fmt.Sprintf("%x:%x:%x:%x:%x", raw[1], raw[2], raw[0], raw[3], raw[4]))
	w.mu.Lock()
	defer w.mu.Unlock()
	if a, ok := w.aliases[s]; ok {
		s = a
	}
	return raw[0], s, nil
}

// closed turns an error that happened because the kernel was closed into
// sandbox.ErrClosed.
func (w *workDir) closed(err error) error {
	if err != nil && w.k.isClosing() && !errors.Is(err, sandbox.ErrClosed) {
		return fmt.Errorf("%w (%v)", sandbox.ErrClosed, err)
	}
	return err
}

// Put implements sandbox.WorkDir.
func (w *workDir) Put(ctx context.Context, p string, r io.Reader) (sandbox.Entry, error) {
	defer w.k.use()()
	p, err := safepath.Clean(p)
	if err != nil {
		return sandbox.Entry{}, err
	}
	var e sandbox.Entry
	err = w.withAgent(ctx, func(a *agent, again bool) error {
		if again {
			// Only a body that can start over is sent again.
			rs, ok := r.(io.Seeker)
			if !ok {
				return errNoRetry
			}
			if _, err := rs.Seek(0, io.SeekStart); err != nil {
				return errNoRetry
			}
		}
		var err error
		e, err = w.put(ctx, a, p, r)
		return err
	})
	return e, w.closed(err)
}

// errNoRetry stops withAgent from trying again.
var errNoRetry = errors.New("not retried")

// withAgent runs op with the pod's file agent. A session that a cell ended
// since its last use (killing the agent's process) is only found out when
// a request fails on it; op then runs once more (again true) on a new
// session, which startAgent opens wherever the working directory can
// still be reached. Every request is safe to repeat: a put commits only
// when it was read whole.
func (w *workDir) withAgent(ctx context.Context, op func(a *agent, again bool) error) error {
	a, err := w.agent(ctx)
	if err != nil {
		return err
	}
	err = op(a, false)
	if !errors.Is(err, errSession) || ctx.Err() != nil || w.k.isClosing() {
		return err
	}
	select {
	case <-a.done: // the session ended: not the request's fault
	case <-time.After(2 * time.Second):
		return err
	}
	a2, err2 := w.agent(ctx)
	if err2 != nil || a2 == a {
		if err2 != nil {
			err = fmt.Errorf("%w; a new session failed too: %w", err, err2)
		}
		return err
	}
	w.k.b.log.InfoContext(ctx, "the pod's file agent session had ended; retried on a new one", "kernel", w.k.ID(), "err", err)
	if rerr := op(a2, true); !errors.Is(rerr, errNoRetry) {
		return rerr
	}
	return err
}

func (w *workDir) put(ctx context.Context, a *agent, p string, r io.Reader) (sandbox.Entry, error) {
	release, err := a.begin(ctx)
	if err != nil {
		return sandbox.Entry{}, err
	}
	defer release()
	if err := a.request(map[string]string{"op": "put", "path": p}); err != nil {
		return sandbox.Entry{}, a.failure(ctx, err)
	}
	buf := make([]byte, 256<<10)
	var rerr error
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := a.writeFrame(buf[:n]); werr != nil {
				return sandbox.Entry{}, a.failure(ctx, werr)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = err
			break
		}
	}
	if err := a.writeFrame(nil); err != nil {
		return sandbox.Entry{}, a.failure(ctx, err)
	}
	commit, _ := json.Marshal(map[string]bool{"commit": rerr == nil})
	if err := a.writeFrame(commit); err != nil {
		return sandbox.Entry{}, a.failure(ctx, err)
	}
	var rep agentReply
	if err := a.readJSON(&rep); err != nil {
		return sandbox.Entry{}, a.failure(ctx, err)
	}
	if rerr != nil {
		return sandbox.Entry{}, fmt.Errorf("put %s: read the source: %w", p, rerr)
	}
	if !rep.OK {
		return sandbox.Entry{}, rep.error("put", p)
	}
	size, st, err := w.stampOf(rep.Stamp)
	if err != nil {
		return sandbox.Entry{}, err
	}
	return sandbox.Entry{Path: p, Size: size, Stamp: st}, nil
}

// Remove implements sandbox.WorkDir.
func (w *workDir) Remove(ctx context.Context, p string) error {
	defer w.k.use()()
	p, err := safepath.Clean(p)
	if err != nil {
		return err
	}
	var rep agentReply
	err = w.withAgent(ctx, func(a *agent, _ bool) error {
		var err error
		rep, err = a.call(ctx, map[string]string{"op": "remove", "path": p})
		return err
	})
	if err != nil {
		return w.closed(err)
	}
	if !rep.OK {
		return rep.error("remove", p)
	}
	return nil
}

// Scan implements sandbox.WorkDir.
func (w *workDir) Scan(ctx context.Context) (sandbox.Listing, error) {
	defer w.k.use()()
	l := sandbox.Listing{Quota: w.k.limits.DiskBytes}
	err := w.withAgent(ctx, func(a *agent, _ bool) error {
		var err error
		l, err = w.scan(ctx, a)
		return err
	})
	return l, w.closed(err)
}

// scanFrame is one batch of a scan's reply.
type scanFrame struct {
	Files   [][]json.RawMessage `json:"files"`
	Skipped []string            `json:"skipped"`
	End     bool                `json:"end"`
}

func (w *workDir) scan(ctx context.Context, a *agent) (sandbox.Listing, error) {
	l := sandbox.Listing{Quota: w.k.limits.DiskBytes}
	release, err := a.begin(ctx)
	if err != nil {
		return l, err
	}
	defer release()
	if err := a.request(map[string]string{"op": "scan"}); err != nil {
		return l, a.failure(ctx, err)
	}
	var head agentReply
	if err := a.readJSON(&head); err != nil {
		return l, a.failure(ctx, err)
	}
	if !head.OK {
		return l, fmt.Errorf("scan the working directory: %s", head.Msg)
	}
	seen := map[string]bool{}
	for i := 0; ; i++ {
		if i == maxScanFrames {
			a.close()
			return l, fmt.Errorf("scan the working directory: over %d frames", maxScanFrames)
		}
		var f scanFrame
		if err := a.readJSON(&f); err != nil {
			return l, a.failure(ctx, err)
		}
		if f.End {
			break
		}
		l.Skipped = append(l.Skipped, f.Skipped...)
		for _, raw := range f.Files {
			e, ok := w.entry(raw)
			switch {
			case !ok:
				var p string
				if len(raw) > 0 {
					_ = json.Unmarshal(raw[0], &p)
				}
				l.Skipped = append(l.Skipped, p)
			case seen[e.Path]:
				// The agent lists each path once; a second listing is
				// something else writing into its stream.
				a.close()
				return l, fmt.Errorf("scan the working directory: %s listed twice", e.Path)
			default:
				seen[e.Path] = true
				l.Files = append(l.Files, e)
			}
		}
	}
	sort.Slice(l.Files, func(i, j int) bool { return l.Files[i].Path < l.Files[j].Path })
	sort.Strings(l.Skipped)
	return l, nil
}

// entry reads one scanned file: [path, size, dev, ino, mtime, ctime]. A
// path the validator refuses is not an entry.
func (w *workDir) entry(raw []json.RawMessage) (sandbox.Entry, bool) {
	if len(raw) != 6 {
		return sandbox.Entry{}, false
	}
	var p string
	if json.Unmarshal(raw[0], &p) != nil {
		return sandbox.Entry{}, false
	}
	if c, err := safepath.Clean(p); err != nil || c != p {
		return sandbox.Entry{}, false
	}
	st := make([]int64, 5)
	for i := range st {
		if json.Unmarshal(raw[i+1], &st[i]) != nil {
			return sandbox.Entry{}, false
		}
	}
	size, s, err := w.stampOf(st)
	if err != nil {
		return sandbox.Entry{}, false
	}
	return sandbox.Entry{Path: p, Size: size, Stamp: s}, true
}

// Open implements sandbox.WorkDir. The returned reader holds the pod's
// agent session until it is closed.
func (w *workDir) Open(ctx context.Context, p string) (io.ReadCloser, sandbox.Entry, error) {
	defer w.k.use()()
	p, err := safepath.Clean(p)
	if err != nil {
		return nil, sandbox.Entry{}, err
	}
	var r io.ReadCloser
	var e sandbox.Entry
	err = w.withAgent(ctx, func(a *agent, _ bool) error {
		var err error
		r, e, err = w.open(ctx, a, p)
		return err
	})
	return r, e, w.closed(err)
}

func (w *workDir) open(ctx context.Context, a *agent, p string) (io.ReadCloser, sandbox.Entry, error) {
	release, err := a.begin(ctx)
	if err != nil {
		return nil, sandbox.Entry{}, err
	}
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	if err := a.request(map[string]string{"op": "open", "path": p}); err != nil {
		return nil, sandbox.Entry{}, a.failure(ctx, err)
	}
	var head agentReply
	if err := a.readJSON(&head); err != nil {
		return nil, sandbox.Entry{}, a.failure(ctx, err)
	}
	if !head.OK {
		return nil, sandbox.Entry{}, head.error("open", p)
	}
	size, st, err := w.stampOf(head.Stamp)
	if err != nil {
		a.close()
		return nil, sandbox.Entry{}, err
	}
	ok = true
	return &agentFile{a: a, ctx: ctx, release: release, left: size}, sandbox.Entry{Path: p, Size: size, Stamp: st}, nil
}

// agentFile reads an open's data frames. It never yields more than the
// size the open reported.
type agentFile struct {
	a       *agent
	ctx     context.Context
	release func()
	buf     []byte
	cur     []byte
	left    int64
	done    bool
	err     error
	closed  bool
}

func (f *agentFile) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		if f.done {
			return 0, f.err
		}
		f.next()
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// next reads one frame: data, or the end of the data and the trailer.
func (f *agentFile) next() {
	b, err := f.a.readFrame(f.buf)
	if err != nil {
		f.done, f.err = true, f.a.failure(f.ctx, err)
		return
	}
	f.buf = b[:cap(b)]
	if len(b) == 0 {
		var tr agentReply
		f.done = true
		if err := f.a.readJSON(&tr); err != nil {
			f.err = f.a.failure(f.ctx, err)
		} else if !tr.OK {
			f.err = fmt.Errorf("read from the pod: %s", tr.Msg)
		} else {
			f.err = io.EOF
		}
		return
	}
	if int64(len(b)) > f.left {
		f.a.close()
		f.done, f.err = true, errors.New("pod file agent sent more than the file's size")
		return
	}
	f.left -= int64(len(b))
	f.cur = b
}

// Close reads what is left of the file (at most its opened size), so that
// the session is ready for the next request, and releases it.
func (f *agentFile) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	for !f.done {
		f.cur = nil
		f.next()
	}
	f.release()
	return nil
}

// copyFrom copies every regular file of old's /work into pc's, for a
// restart, and aliases the new files' stamps to those the caller knew.
func (w *workDir) copyFrom(ctx context.Context, old, pc *podConn) error {
	from, err := old.agentFor(ctx)
	if err != nil {
		return err
	}
	to, err := pc.agentFor(ctx)
	if err != nil {
		return err
	}
	l, err := w.scan(ctx, from)
	if err != nil {
		return err
	}
	aliases := map[sandbox.Stamp]sandbox.Stamp{}
	for _, e := range l.Files {
		r, opened, err := w.open(ctx, from, e.Path)
		if errors.Is(err, errNotExist) || errors.Is(err, sandbox.ErrNotRegular) {
			continue
		}
		if err != nil {
			return err
		}
		ne, err := w.put(ctx, to, e.Path, io.LimitReader(r, opened.Size))
		r.Close()
		if err != nil && !errors.Is(err, sandbox.ErrNotRegular) {
			return fmt.Errorf("copy %s to the new pod: %w", e.Path, err)
		}
		if err == nil {
			aliases[ne.Stamp] = opened.Stamp
		}
	}
	w.mu.Lock()
	w.aliases = aliases
	w.mu.Unlock()
	return nil
}
