package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// files.watchDir, in the SDK's two forms: the WatchDir stream, and the
// polling CreateWatcher / GetWatcherEvents / RemoveWatcher.
//
// A watcher compares snapshots of the run's working directory
// (Core.WorkingFiles: the store's index, and the live kernel's directory
// as scanned now) taken every Config.WatchInterval, and turns what changed
// into envd's events. So every source of change is seen, whoever made it:
// a cell, a command still running, files.write, Triad's tmp.write or PUT
// /tmp/files. See docs/DECISIONS.md, "E2B surface: watchDir".

// maxWatchers bounds the polling watchers a sandbox keeps; maxPending the
// events one holds between two GetWatcherEvents calls (older are dropped,
// as a bounded queue must).
const (
	maxWatchers = 64
	maxPending  = 10_000
)

// watchSpec is what a watch follows, as the request said it.
type watchSpec struct {
	dir          string // run path of the directory, "" for the root
	recursive    bool
	includeEntry bool
}

// node is one path of a snapshot, relative to the watched directory.
type node struct {
	dir bool
	// tok changes when the file changes: the kernel's stamp while a
	// kernel has the file, else the store's digest. kernel says which.
	tok    string
	kernel bool
	state  orchestrator.FileState
}

type snapshot map[string]node

// snap takes a snapshot of the watched directory.
func (s *Server) snap(ctx context.Context, run runid.ID, w watchSpec) (snapshot, error) {
	files, err := s.c.Core.WorkingFiles(ctx, run, w.dir)
	if err != nil {
		return nil, err
	}
	out := snapshot{}
	for p, st := range files {
		rel := p
		if w.dir != "" {
			if !strings.HasPrefix(p, w.dir+"/") {
				continue
			}
			rel = strings.TrimPrefix(p, w.dir+"/")
		}
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			out[strings.Join(parts[:i], "/")] = node{dir: true}
			if !w.recursive {
				break
			}
		}
		if !w.recursive && len(parts) > 1 || isKeep(p, st.Size) {
			continue
		}
		n := node{state: st}
		if st.Stamp != "" {
			n.tok, n.kernel = "k:"+string(st.Stamp), true
		} else {
			n.tok = "s:" + st.File.SHA256.String()
		}
		out[rel] = n
	}
	return out, nil
}

// diff turns two snapshots into envd's events, in path order: a new path
// is CREATE (a file with bytes also WRITE, as writing a new file is in
// envd), a changed file WRITE, a vanished path REMOVE, and a file that
// vanished while one with the same bytes appeared is RENAME of the old
// name beside CREATE of the new (files.rename, or mv in a command). A
// file's token that changed source (its kernel started or stopped) is not
// a change. A mode change shows as WRITE: Triad keeps no file modes, and
// the kernel's stamp does not say which of a file's times moved.
func diff(old, cur snapshot) []diffEvent {
	var out []diffEvent
	created := map[tmpfs.Digest]string{}
	for p, n := range cur {
		o, had := old[p]
		switch {
		case !had:
			if !n.dir && !n.state.File.SHA256.IsZero() {
				created[n.state.File.SHA256] = p
			}
		case o.dir != n.dir:
		case !n.dir && o.tok != n.tok && o.kernel == n.kernel:
			out = append(out, diffEvent{p, fspb.EventType_EVENT_TYPE_WRITE})
		}
	}
	for p, o := range old {
		n, has := cur[p]
		if has && n.dir == o.dir {
			continue
		}
		typ := fspb.EventType_EVENT_TYPE_REMOVE
		if d := o.state.File.SHA256; !has && !o.dir && !d.IsZero() && created[d] != "" {
			typ = fspb.EventType_EVENT_TYPE_RENAME
			delete(created, d)
		}
		out = append(out, diffEvent{p, typ})
	}
	for p, n := range cur {
		if o, had := old[p]; had && o.dir == n.dir {
			continue
		}
		out = append(out, diffEvent{p, fspb.EventType_EVENT_TYPE_CREATE})
		if !n.dir && n.state.Size > 0 {
			out = append(out, diffEvent{p, fspb.EventType_EVENT_TYPE_WRITE})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

type diffEvent struct {
	name string
	typ  fspb.EventType
}

// events is diff as the wire's FilesystemEvents, with the entry of each
// path that still exists when the watch asked for it.
func (w watchSpec) events(old, cur snapshot) []*fspb.FilesystemEvent {
	var out []*fspb.FilesystemEvent
	for _, d := range diff(old, cur) {
		e := &fspb.FilesystemEvent{Name: d.name, Type: d.typ}
		if n, ok := cur[d.name]; ok && w.includeEntry {
			e.Entry = w.entry(d.name, n)
		}
		out = append(out, e)
	}
	return out
}

// entry is the EntryInfo of a snapshot's path, as files.getInfo shows it.
func (w watchSpec) entry(rel string, n node) *fspb.EntryInfo {
	p := joinRun(w.dir, rel)
	if n.dir {
		return dirEntry(p, nowUTC())
	}
	f := n.state.File
	info := wire.FileInfo{FileRef: wire.FileRef{Path: p, Size: n.state.Size, SHA256: f.SHA256}, ModifiedAt: f.ModifiedAt}
	if n.kernel || f.ModifiedAt.IsZero() {
		// Seen in the kernel's directory, perhaps before its harvest:
		// the store's time is not this version's.
		info.ModifiedAt = nowUTC()
	}
	return fileEntry(info, nil)
}

// openWatch resolves a watch request: the directory must exist and be a
// directory. The check is one tmp.list, the watch's journaled call (a
// watch's polls are reads, not calls).
func (s *Server) openWatch(ctx context.Context, sb Sandbox, path string, recursive, includeEntry bool) (watchSpec, error) {
	p, err := runPath(path)
	if err != nil {
		return watchSpec{}, err
	}
	t, err := s.listTree(ctx, sb.ID, p)
	if err != nil {
		return watchSpec{}, err
	}
	file, dir := t.kind()
	switch {
	case file != nil:
		return watchSpec{}, fault.New(fault.BadInput, fmt.Sprintf("path %q is a file, not a directory", path), "files.watchDir watches a directory: name the directory the file is in")
	case !dir:
		return watchSpec{}, noPath(path)
	}
	return watchSpec{dir: p, recursive: recursive, includeEntry: includeEntry}, nil
}

// beginWatch opens a watch of path (openWatch), takes its first snapshot
// and starts its watcher: the stream's form (streamed: events go to the
// watcher's channel) or the polling form (they wait in pending).
func (s *Server) beginWatch(ctx context.Context, sb Sandbox, path string, recursive, includeEntry, streamed bool) (*watcher, error) {
	spec, err := s.openWatch(ctx, sb, path, recursive, includeEntry)
	if err != nil {
		return nil, err
	}
	base, err := s.snap(ctx, sb.ID, spec)
	if err != nil {
		return nil, err
	}
	w := &watcher{id: newWatcherID(), run: sb.ID, spec: spec, stop: make(chan struct{}), done: make(chan struct{})}
	if streamed {
		w.events = make(chan []*fspb.FilesystemEvent)
	}
	if err := s.startWatcher(ctx, w, base); err != nil {
		return nil, err
	}
	return w, nil
}

// watcher follows one watch until it is stopped: the stream's, or a
// polling watcher's. Its loop is owned by the server's watchers table,
// which stops it when the sandbox is killed or paused, or the server
// closes.
type watcher struct {
	id   string
	run  runid.ID
	spec watchSpec
	// events receives each poll's events (the stream's form); nil keeps
	// them in pending (the polling form).
	events chan []*fspb.FilesystemEvent

	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	pending []*fspb.FilesystemEvent
	err     error // why the watch ended, once it has
}

// loop polls the directory from snapshot base until stopped.
func (s *Server) loop(ctx context.Context, w *watcher, base snapshot) {
	defer close(w.done)
	t := time.NewTicker(s.c.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		cur, err := s.snap(ctx, w.run, w.spec)
		if err != nil {
			// A store that failed once is tried again at the next tick;
			// a run that is gone (or no longer the caller's) ends the
			// watch.
			if fe := fault.As(err); fe != nil && fe.Kind == fault.NotFound {
				w.end(connect.NewError(connect.CodeNotFound, errors.New(sdkMessage(fe))))
				return
			}
			s.log.WarnContext(ctx, "watch the sandbox's files", "sandbox", w.run, "err", err)
			continue
		}
		ev := w.spec.events(base, cur)
		base = cur
		if len(ev) == 0 {
			continue
		}
		if w.events != nil {
			select {
			case w.events <- ev:
			case <-w.stop:
				return
			}
			continue
		}
		w.mu.Lock()
		w.pending = append(w.pending, ev...)
		if n := len(w.pending); n > maxPending {
			w.pending = w.pending[n-maxPending:]
		}
		w.mu.Unlock()
	}
}

// end stops the watcher with the reason it ended; the first reason stands.
func (w *watcher) end(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.once.Do(func() { close(w.stop) })
}

func (w *watcher) reason() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// watchers is the table of a server's live watchers, by sandbox.
type watchers struct {
	mu sync.Mutex
	m  map[runid.ID]map[string]*watcher
	wg sync.WaitGroup
}

func newWatchers() *watchers { return &watchers{m: map[runid.ID]map[string]*watcher{}} }

// startWatcher makes w live and runs its loop from base; it fails when the
// sandbox has too many polling watchers already.
func (s *Server) startWatcher(ctx context.Context, w *watcher, base snapshot) error {
	t := s.watch
	t.mu.Lock()
	if w.events == nil && len(t.m[w.run]) >= maxWatchers {
		t.mu.Unlock()
		return fault.New(fault.Quota, fmt.Sprintf("sandbox %s has %d watchers already", w.run, maxWatchers), "remove watchers you no longer poll (RemoveWatcher, or handle.stop())")
	}
	if t.m[w.run] == nil {
		t.m[w.run] = map[string]*watcher{}
	}
	t.m[w.run][w.id] = w
	t.wg.Add(1)
	t.mu.Unlock()
	// The loop outlives the request that made a polling watcher; it acts
	// as that request's caller still (the principal is in ctx).
	go func() {
		defer t.wg.Done()
		s.loop(context.WithoutCancel(ctx), w, base)
	}()
	return nil
}

func (t *watchers) get(run runid.ID, id string) *watcher {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[run][id]
}

// remove stops one watcher and waits for its loop.
func (t *watchers) remove(run runid.ID, id string) *watcher {
	t.mu.Lock()
	w := t.m[run][id]
	delete(t.m[run], id)
	if len(t.m[run]) == 0 {
		delete(t.m, run)
	}
	t.mu.Unlock()
	if w != nil {
		w.end(errWatchStopped)
		<-w.done
	}
	return w
}

// endAll stops every watcher of a sandbox with err: it was killed or
// paused.
func (t *watchers) endAll(run runid.ID, err error) {
	t.mu.Lock()
	ws := t.m[run]
	delete(t.m, run)
	t.mu.Unlock()
	for _, w := range ws {
		w.end(err)
		<-w.done
	}
}

// close stops every watcher and waits for them.
func (t *watchers) close() {
	t.mu.Lock()
	all := t.m
	t.m = map[runid.ID]map[string]*watcher{}
	t.mu.Unlock()
	for _, ws := range all {
		for _, w := range ws {
			w.end(errServerClosing)
		}
	}
	t.wg.Wait()
}

var (
	errWatchStopped  = connect.NewError(connect.CodeCanceled, errors.New("the watcher was removed"))
	errServerClosing = connect.NewError(connect.CodeUnavailable, errors.New("the server is shutting down (connect to the sandbox again once it is back)"))
)

func errSandboxGone(id runid.ID, why string) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s was %s: the watch ended", id, why))
}

func newWatcherID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "w" + hex.EncodeToString(b)
}

// WatchDir is files.watchDir: the start event once the watch has its
// first snapshot (so any change made after the SDK's watchDir returns is
// reported), then the events as they are seen, with keepalives at the
// interval the SDK asks for. The stream ends when the client goes, or
// with an error when the sandbox is killed or paused.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	s, sb := f.s, sandboxOf(ctx)
	w, err := s.beginWatch(ctx, sb, req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), true)
	if err != nil {
		return connectErr(err)
	}
	defer s.watch.remove(sb.ID, w.id)
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keep, stop := pingTicker(req.Header())
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.stop:
			return w.reason()
		case <-keep:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev := <-w.events:
			for _, e := range ev {
				if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
					return err
				}
			}
		}
	}
}

// CreateWatcher is the polling form of files.watchDir: the watcher keeps
// the events until GetWatcherEvents takes them.
func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	w, err := f.s.beginWatch(ctx, sandboxOf(ctx), req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), false)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: w.id}), nil
}

// GetWatcherEvents hands over the events the watcher kept since the last
// call, and forgets them.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	sb := sandboxOf(ctx)
	w := f.s.watch.get(sb.ID, req.Msg.GetWatcherId())
	if w == nil || w.events != nil {
		return nil, connectErr(noWatcher(req.Msg.GetWatcherId()))
	}
	if err := w.reason(); err != nil {
		return nil, err
	}
	w.mu.Lock()
	ev := w.pending
	w.pending = nil
	w.mu.Unlock()
	if ev == nil {
		ev = []*fspb.FilesystemEvent{}
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: ev}), nil
}

// RemoveWatcher stops a polling watcher.
func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	sb := sandboxOf(ctx)
	if w := f.s.watch.get(sb.ID, req.Msg.GetWatcherId()); w == nil || w.events != nil {
		return nil, connectErr(noWatcher(req.Msg.GetWatcherId()))
	}
	f.s.watch.remove(sb.ID, req.Msg.GetWatcherId())
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}

func noWatcher(id string) error {
	return fault.New(fault.NotFound, fmt.Sprintf("watcher %q not found in this sandbox", id), "CreateWatcher returns a watcher id; a removed watcher, or one of a paused sandbox, is gone")
}
