package console_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/triadhq/triad/console/consoletest"
)

// startTriad starts triad serve built from this tree with args, stopped
// when the test ends.
func startTriad(t *testing.T, args ...string) *consoletest.Server {
	t.Helper()
	dir := t.TempDir()
	bin, err := consoletest.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := consoletest.Start(t.Context(), bin, filepath.Join(dir, "data"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("triad serve's log:\n%s", tail(s.Logs(), 60))
		}
	})
	return s
}

// signedInTab is a tab in a browser context of its own, signed in with key.
func signedInTab(t *testing.T, b *browserProc, s *consoletest.Server, key string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := consoletest.SignIn(ctx, s.URL, key); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// Live updates cost O(new steps), not O(journal): the bytes a run page
// receives for 10 new calls (every request it makes, and the events on
// its stream; consoletest.LiveBytes, which bench/console measures too)
// are about the same on a run of 1,000 steps as on one of 100.
func TestLiveUpdateBytes(t *testing.T) {
	exe := chromium(t)
	s := startTriad(t, "--sandbox", "none")
	b := newBrowser(t, exe)
	ctx := signedInTab(t, b, s, s.KeyA)
	m := consoletest.NewMeter(ctx)
	const calls = 10
	got := map[int]consoletest.Bytes{}
	for _, steps := range []int{100, 1000} {
		run, err := s.NewRun(s.KeyA)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Writes(s.KeyA, run, 1, steps); err != nil {
			t.Fatal(err)
		}
		by, err := consoletest.LiveBytes(ctx, s, m, s.KeyA, run, steps, calls)
		if err != nil {
			t.Fatalf("%d steps: %v (counted %+v)", steps, err, by)
		}
		t.Logf("%d-step run, %d new calls: %d bytes (%d fetched in %d requests, %d in %d events)", steps, calls, by.Total(), by.Fetched, len(by.Requests), by.SSE, by.Events)
		for _, r := range by.Requests {
			t.Logf("  %s", r)
		}
		got[steps] = by
		// What the page shows after its appends is the journal as a
		// fresh page renders it.
		same, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`fetch(location.pathname + '/cel', { credentials: 'same-origin' })
			.then((r) => r.text()).then((h) => { const d = document.createElement('div'); d.innerHTML = h; return d.innerHTML === document.getElementById('cel').innerHTML.replace(/ target="_blank" rel="noopener noreferrer"/g, '') })`, chromedp.EvalAwaitPromise))
		if err != nil || !same {
			t.Errorf("%d steps: the journal the page built from its appends differs from the whole journal rendered afresh (%v)", steps, err)
		}
	}
	small, large := got[100].Total(), got[1000].Total()
	if small == 0 || float64(large) >= 1.5*float64(small) {
		t.Errorf("10 new calls cost %d bytes on a 1,000-step run and %d on a 100-step run: %.2f×, want under 1.5×", large, small, float64(large)/float64(small))
	}
	if large > 200<<10 {
		t.Errorf("10 new calls cost %d bytes on a 1,000-step run; the whole journal was 1.6 MB for 10 calls before", large)
	}
}
