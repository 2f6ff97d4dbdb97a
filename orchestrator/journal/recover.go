package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Progress is the call-in-progress record a call writes before it answers:
// what an interrupted Step Block needs if the process dies before the
// real one is written. It lives in the store's records outside runs
// (tmpfs.Meta), so no tool or cell can see or change it, and every
// replica sharing the store finds it.
type Progress struct {
	Step    int             `json:"step"`
	Tool    string          `json:"tool"`
	Started time.Time       `json:"started"`
	Inputs  []ProgressInput `json:"inputs"`
	Label   string          `json:"label,omitempty"`
	KeyID   string          `json:"key_id,omitempty"`
	Tenant  string          `json:"tenant"`
	// Holder names the process that made the call (a replica), when it
	// has a name.
	Holder string `json:"holder,omitempty"`
}

// ProgressInput is one of a call's salient inputs, as Input.
type ProgressInput struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// progressKey is where a run's call-in-progress record lives.
func progressKey(run runid.ID) string { return "journal/" + run.String() + "/started" }

// Begin starts writing the call-in-progress record of step n of s, made
// by who with info, and returns a wait for it. The write overlaps the
// tool call; the call waits for it before answering, so every call that
// answered is either recorded or recoverable. A record that cannot be
// written is logged: the call itself goes on.
func (j *Journal) Begin(ctx context.Context, s *Step, n int, who auth.Principal, info Info) (wait func()) {
	p := Progress{Step: n, Tool: s.Outcome.Tool(), Started: s.Started, Label: info.Label, KeyID: who.KeyID, Tenant: who.Tenant, Holder: j.holder}
	for _, in := range s.Outcome.Inputs() {
		p.Inputs = append(p.Inputs, ProgressInput(in))
	}
	b, err := json.Marshal(p)
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := j.store.Meta().PutMeta(ctx, progressKey(s.Run), b, tmpfs.Cond{}); err != nil {
			j.log.WarnContext(ctx, "write the call-in-progress record", "run", s.Run, "step", n, "err", err)
		}
	}()
	return func() { <-done }
}

// Interrupted is a call a crash interrupted: the step to record for it,
// and who made it.
type Interrupted struct {
	Step *Step
	N    int
	Who  auth.Principal
	Info Info
}

// Interrupted looks, with the run locked, for a call that began and was
// never recorded: a call-in-progress record for the step the journal
// would number next is a call whose process died, here or on a replica,
// after it began and before its Step Block was written (perhaps after it
// answered). ok is false when there is none; an error means the store
// could not say, and the caller looks again next time.
func (j *Journal) Interrupted(ctx context.Context, run runid.ID) (Interrupted, bool, error) {
	b, _, err := j.store.Meta().GetMeta(ctx, progressKey(run))
	if errors.Is(err, tmpfs.ErrNotFound) {
		return Interrupted{}, false, nil
	}
	var p Progress
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil {
		return Interrupted{}, false, fmt.Errorf("read the call-in-progress record of run %s: %w", run, err)
	}
	n, _, err := j.cel.Next(ctx, run)
	if err != nil {
		return Interrupted{}, false, fmt.Errorf("read the journal of run %s: %w", run, err)
	}
	if p.Step != n {
		return Interrupted{}, false, nil // the call was recorded
	}
	who := "the server"
	if p.Holder != "" {
		who = fmt.Sprintf("the Triad replica serving it (%s)", p.Holder)
	}
	j.log.WarnContext(ctx, "recording a call that a crash interrupted", "run", run, "step", n, "tool", p.Tool, "holder", p.Holder)
	s := &Step{Run: run, Outcome: &InterruptedOutcome{Marked: p.Tool, Input: p.Inputs}, Started: p.Started,
		Err: fault.New(fault.Unavailable, fmt.Sprintf("the call was interrupted: %s stopped before it was recorded", who),
			"list the run's files (tmp.list) to see what the call left, and make the call again if its effect is missing")}
	return Interrupted{Step: s, N: n, Who: auth.Principal{KeyID: p.KeyID, Tenant: p.Tenant}, Info: Info{Label: p.Label}}, true, nil
}

// InterruptedOutcome is the part of a step that a crash interrupted: all
// that is known of it is what its call-in-progress record kept.
type InterruptedOutcome struct {
	// Marked is the tool that was called.
	Marked string
	Input  []ProgressInput
}

// Tool implements Outcome.
func (i *InterruptedOutcome) Tool() string { return i.Marked }

// Inputs implements Outcome.
func (i *InterruptedOutcome) Inputs() []Input {
	out := make([]Input, 0, len(i.Input))
	for _, in := range i.Input {
		out = append(out, Input(in))
	}
	return out
}

// Grade implements Outcome: the call's outcome is unknown.
func (i *InterruptedOutcome) Grade(req *evaluator.Request) { req.OK = false }

// Describe implements Outcome.
func (i *InterruptedOutcome) Describe(*Step) (did, next []string, failed bool) {
	return []string{fmt.Sprintf("Interrupted: %s was called and never finished; whether it took effect is not known", i.Marked)}, nil, true
}
