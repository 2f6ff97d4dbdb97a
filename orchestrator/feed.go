package orchestrator

import (
	"context"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// Update is one change to a run's records as Subscribe delivers it:
// exactly one of Call (a journaled call, published by record once its
// Step Block and trace line are written), Verdict (the late verdict of a
// call that was ungraded: the call again, with its verdict now) and
// Journal (a note or the summary).
type Update struct {
	Call    *wire.CallEvent
	Verdict *wire.CallEvent
	Journal *wire.JournalEvent
}

// feedBuffer is how many updates a subscriber may fall behind by before
// it is dropped.
const feedBuffer = 256

// Subscribe follows a run the caller may read: every call the journal
// records from now on, and every note and summary, in order. The channel
// is closed by cancel, or when the subscriber fell feedBuffer updates
// behind (it then reads what it missed from Calls, and subscribes again).
// Subscribe first and read Calls second, and drop live calls already
// read, and nothing is missed or shown twice. A run with a subscriber
// stays in the run table.
func (o *Orchestrator) Subscribe(ctx context.Context, id runid.ID) (<-chan Update, func(), error) {
	r, done := o.runs.use(id)
	defer done()
	if _, err := o.access(ctx, r, auth.Read, false); err != nil {
		return nil, nil, err
	}
	ch := make(chan Update, feedBuffer)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = map[chan Update]struct{}{}
	}
	r.subs[ch] = struct{}{}
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.subs[ch]; ok {
			delete(r.subs, ch)
			close(ch)
		}
	}, nil
}

// publish hands u to the run's subscribers without waiting for any: one
// that fell behind is dropped (its channel closed), never the call.
func (r *run) publish(u Update) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- u:
		default:
			delete(r.subs, ch)
			close(ch)
		}
	}
}

// publishJournal tells subscribers the journal changed without a call.
func (r *run) publishJournal(kind string) {
	r.publish(Update{Journal: &wire.JournalEvent{Kind: kind, Time: time.Now().UTC()}})
}
