package orchestrator

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Update is one change to a run's records as Subscribe delivers it:
// exactly one of Call (a journaled call, published by record once its
// Step Block and trace line are written) and Journal (a note or the
// summary).
type Update struct {
	Call    *wire.CallEvent
	Journal *wire.JournalEvent
}

// feedBuffer is how many updates a subscriber may fall behind by before
// it is dropped.
const feedBuffer = 256

// feed fans a run's updates out to its subscribers.
type feed struct {
	mu   sync.Mutex
	subs map[runid.ID]map[chan Update]struct{}
}

// Subscribe follows a run the caller may read: every call the journal
// records from now on, and every note and summary, in order. The channel
// is closed by cancel, or when the subscriber fell feedBuffer updates
// behind (it then reads what it missed from Calls, and subscribes again).
// Subscribe first and read Calls second, and drop live calls already
// read, and nothing is missed or shown twice.
func (o *Orchestrator) Subscribe(ctx context.Context, run runid.ID) (<-chan Update, func(), error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		return nil, nil, err
	}
	ch := make(chan Update, feedBuffer)
	o.feed.mu.Lock()
	defer o.feed.mu.Unlock()
	if o.feed.subs == nil {
		o.feed.subs = map[runid.ID]map[chan Update]struct{}{}
	}
	if o.feed.subs[run] == nil {
		o.feed.subs[run] = map[chan Update]struct{}{}
	}
	o.feed.subs[run][ch] = struct{}{}
	return ch, func() {
		o.feed.mu.Lock()
		defer o.feed.mu.Unlock()
		if _, ok := o.feed.subs[run][ch]; ok {
			delete(o.feed.subs[run], ch)
			close(ch)
			if len(o.feed.subs[run]) == 0 {
				delete(o.feed.subs, run)
			}
		}
	}, nil
}

// publish hands u to the run's subscribers without waiting for any: one
// that fell behind is dropped (its channel closed), never the call.
func (o *Orchestrator) publish(run runid.ID, u Update) {
	o.feed.mu.Lock()
	defer o.feed.mu.Unlock()
	for ch := range o.feed.subs[run] {
		select {
		case ch <- u:
		default:
			delete(o.feed.subs[run], ch)
			close(ch)
		}
	}
	if len(o.feed.subs[run]) == 0 {
		delete(o.feed.subs, run)
	}
}

// publishJournal tells subscribers the journal changed without a call.
func (o *Orchestrator) publishJournal(run runid.ID, kind string) {
	o.publish(run, Update{Journal: &wire.JournalEvent{Kind: kind, Time: time.Now().UTC()}})
}

// callEvent is a trace record as the run's feed shows it.
func callEvent(tr TraceRecord) wire.CallEvent {
	e := wire.CallEvent{Step: tr.Step, Tool: tr.Tool, Label: tr.Label, Started: tr.Started, DurationMs: tr.ElapsedMs,
		OK: tr.OK, Inputs: tr.Inputs, Outputs: tr.Outputs, Verdict: "FAIL", FreshKernel: tr.FreshKernel}
	if e.Inputs == nil {
		e.Inputs = map[string]any{}
	}
	if e.Outputs == nil {
		e.Outputs = []wire.FileRef{}
	}
	if tr.Error != nil {
		e.Error = tr.Error.Kind + ": " + tr.Error.Message
	}
	if v := tr.Eval; v != nil {
		e.Score, e.Critique = v.Score, v.Critique
		if v.Pass {
			e.Verdict = "PASS"
		}
	}
	return e
}

// Calls returns the run's journaled calls so far, in order, as its feed
// shows them.
func (o *Orchestrator) Calls(ctx context.Context, run runid.ID) ([]wire.CallEvent, error) {
	trace, err := o.Trace(ctx, run)
	if err != nil {
		return nil, err
	}
	out := make([]wire.CallEvent, 0, len(trace))
	for _, tr := range trace {
		out = append(out, callEvent(tr))
	}
	return out, nil
}

// Files lists every file of a run the caller may read, with the call that
// produced each one's current bytes (from the trace's outputs). It is not
// a tool call and is not journaled: it is how a person looks at a run
// (the console), as a share link or a download by hash is.
func (o *Orchestrator) Files(ctx context.Context, run runid.ID) (wire.RunFiles, error) {
	out := wire.RunFiles{Files: []wire.RunFile{}}
	trace, err := o.Trace(ctx, run) // checks access
	if err != nil {
		return out, err
	}
	type producer struct {
		step int
		tool string
	}
	by := map[wire.FileRef]producer{}
	for _, tr := range trace {
		for _, f := range tr.Outputs {
			by[wire.FileRef{Path: f.Path, Size: f.Size, SHA256: f.SHA256}] = producer{tr.Step, tr.Tool}
		}
	}
	files, err := o.store.List(ctx, run, "")
	if err != nil {
		return out, storeErr(err, run, "")
	}
	for _, f := range files {
		rf := wire.RunFile{FileInfo: wire.Info(f)}
		if p, ok := by[rf.FileRef]; ok {
			rf.Step, rf.Tool = p.step, p.tool
		}
		out.Files = append(out.Files, rf)
	}
	sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Path < out.Files[j].Path })
	return out, nil
}

// OpenFile opens a run file the caller may read, for a person to download
// or preview. Like Files, it is not a tool call: nothing is journaled. The
// reader verifies the bytes against their sha256 as they stream.
func (o *Orchestrator) OpenFile(ctx context.Context, run runid.ID, path string) (tmpfs.File, *tmpfs.Reader, error) {
	if _, err := o.access(ctx, run, auth.Read, false); err != nil {
		return tmpfs.File{}, nil, err
	}
	p, err := safepath.Clean(path)
	if err != nil {
		return tmpfs.File{}, nil, err
	}
	f, r, err := o.store.Open(ctx, run, p)
	if err != nil {
		return f, nil, storeErr(err, run, p)
	}
	return f, r, nil
}
