package replay_test

import (
	"bytes"
	"errors"
	"net/http"
	"testing"

	"github.com/triadhq/triad/browser"
	"github.com/triadhq/triad/browser/replay"
	"github.com/triadhq/triad/browser/tavily"
	"github.com/triadhq/triad/browser/tavilytest"
	"github.com/triadhq/triad/internal/fault"
)

// live returns a Tavily client on a fake, and the fake to count requests.
func live(t *testing.T) (*tavily.Client, *tavilytest.Server) {
	t.Helper()
	srv := tavilytest.NewServer(t)
	c, err := tavily.New(tavily.Config{APIKey: srv.Key, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func TestReplayAnswersFromRecords(t *testing.T) {
	t.Parallel()
	c, srv := live(t)
	// The original run: two searches, one of them twice.
	reqA := browser.Request{Query: "Acme Analytics pricing", AllowDomains: []string{"b.example", "acme-analytics.example"}}
	reqB := browser.Request{Query: "Initech Data acquisition", IncludePage: true}
	var stored [][]byte
	for _, r := range []browser.Request{reqA, reqB, reqA} {
		rec, err := c.Search(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := rec.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, b)
	}
	sent := len(srv.Requests())

	// The replay, from the stored bytes only.
	p := replay.New(nil)
	for _, b := range stored {
		if err := p.AddBytes(b); err != nil {
			t.Fatal(err)
		}
	}
	// Same requests in another form: domains reordered and upper-cased,
	// top_k spelled out.
	reqA2 := browser.Request{Query: "Acme Analytics pricing", TopK: 5, AllowDomains: []string{"ACME-ANALYTICS.example", "b.example"}}
	for i, r := range []browser.Request{reqA2, reqB, reqA2, reqA2} {
		rec, err := p.Search(t.Context(), r)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		b, err := rec.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		// Call i replays original call i; calls past the end reuse the
		// last record for the key.
		want := []int{0, 1, 2, 2}[i]
		if !bytes.Equal(b, stored[want]) {
			t.Errorf("call %d: record differs from original call %d", i, want)
		}
	}
	if got := len(srv.Requests()); got != sent {
		t.Errorf("replay sent %d requests upstream, want 0", got-sent)
	}
}

func TestStrictReplayMiss(t *testing.T) {
	t.Parallel()
	p := replay.New(nil)
	_, err := p.Search(t.Context(), browser.Request{Query: "never searched"})
	fe := fault.As(err)
	if fe == nil || fe.Kind != fault.NotFound || fault.Status(fe.Kind) != http.StatusNotFound {
		t.Fatalf("got %v, want a not_found fault", err)
	}
	if !errors.Is(err, replay.ErrNotRecorded) {
		t.Errorf("got %v, want it to wrap ErrNotRecorded", err)
	}
}

func TestReplayFallback(t *testing.T) {
	t.Parallel()
	c, srv := live(t)
	p := replay.New(c)
	rec, err := p.Search(t.Context(), browser.Request{Query: "CRM market share"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Provider != tavily.Name || len(srv.Requests()) != 1 {
		t.Errorf("got provider %q after %d requests, want a live tavily answer", rec.Provider, len(srv.Requests()))
	}
}

func TestReplayValidates(t *testing.T) {
	t.Parallel()
	p := replay.New(nil)
	_, err := p.Search(t.Context(), browser.Request{Query: "q", TopK: 99})
	if fe := fault.As(err); fe == nil || fe.Kind != fault.BadInput {
		t.Errorf("got %v, want bad_input", err)
	}
	if err := p.AddBytes([]byte(`{"format":"other"}`)); err == nil {
		t.Error("AddBytes accepted a record of another format")
	}
}
