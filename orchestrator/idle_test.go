package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// An idle run's in-memory state goes, and comes back from the store intact
// on its next use: its steps go on numbering from where they were, its
// files and notes are all there.
func TestIdleRunForgottenAndRecovered(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Search: true, RunIdle: 20 * time.Millisecond})
	ctx := s.Ctx(t)
	runs := make([]runid.ID, 20)
	for i := range runs {
		runs[i] = runid.New()
		if _, err := s.Orch.Write(ctx, runs[i], wire.WriteRequest{Path: "a.txt", Text: text(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Orch.Search(ctx, runs[i], wire.SearchRequest{Query: "inflation"}, orchestrator.SearchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := s.Orch.Note(ctx, runs[i], "a note for step 3", "tester"); err != nil {
			t.Fatal(err)
		}
	}
	if c := s.Orch.Caches(); c.Total() == 0 {
		t.Fatalf("got nothing cached right after the calls (%+v); the test would prove nothing", c)
	}
	waitIdle(t, s)
	run := runs[7]
	if _, err := s.Orch.Write(ctx, run, wire.WriteRequest{Path: "b.txt", Text: text("b")}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Orch.Status(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Steps) != 3 || st.Steps[2].Step != 3 {
		t.Fatalf("got steps %+v, want 3 numbered 1..3", st.Steps)
	}
	j, err := s.Orch.Journal(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), "## Step 3: ") || !strings.Contains(string(j), "a note for step 3") {
		t.Errorf("the journal after the run went idle:\n%s\nwant step 3 after the note", j)
	}
	waitIdle(t, s)
}

func waitIdle(t *testing.T, s *orchestratortest.Stack) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.Orch.Caches().Total() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("runs still kept in memory after they went idle: %+v", s.Orch.Caches())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
