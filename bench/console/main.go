// Command console measures the web console on a long run: how soon a run page paints its timeline against the runs list, and what a live update costs in bytes and server time.
//
// Usage (chromium at /usr/bin/chromium or $TRIAD_CHROMIUM; run from the
// module root):
//
//	go run ./bench/console [-steps 1000] [-calls 10] [-loads 5] [-bin triad]
//
// It builds cmd/triad (or takes -bin, a triad binary built from another
// tree, such as main's, to compare) and starts `triad serve --sandbox
// none` on a loopback port with a fresh data directory; makes a run of
// -steps tmp.write steps through the API, the cheapest journaled call;
// and signs a headless chromium in (fresh profile, no GPU, no background
// networking). Then, in one run of the program:
//
//  1. First paint. -loads times each, interleaved: the runs list to its
//     first row, and the long run's page to its first timeline entry and
//     to its whole timeline and rendered journal, each measured in the
//     page from navigation start (performance.now() two frames after the
//     element appears). It reports the medians and the run page's first
//     paint as a ratio to the runs list's (goal ≤ 2).
//  2. Live updates: consoletest.LiveBytes, the protocol TestLiveUpdateBytes
//     asserts on: the run page open and settled, -calls more steps, and
//     every byte the page received for them (each request's bytes on the
//     wire as DevTools counts them, and each Server-Sent Event as its
//     text), with the requests' time, which on loopback is the server's.
//     The same on a run of -steps/10 steps, for the ratio.
//
// Figures are ratios within one run where they can be; the machine may be
// shared, so the load average is printed with each phase.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/triadhq/triad/bench/internal/benchenv"
	"github.com/triadhq/triad/console/consoletest"
)

func main() {
	steps := flag.Int("steps", 1000, "steps of the long run")
	calls := flag.Int("calls", 10, "new calls a live update measurement makes")
	loads := flag.Int("loads", 5, "page loads for each first-paint median")
	bin := flag.String("bin", "", "a triad binary to measure (default: build ./cmd/triad)")
	flag.Parse()
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "bench-console-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		if *bin, err = benchenv.BuildTriad(dir); err != nil {
			log.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	s, err := consoletest.Start(ctx, *bin, filepath.Join(dir, "data"), "--sandbox", "none")
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	fmt.Printf("console bench: %s, %d steps, %d calls, load %s\n", *bin, *steps, *calls, benchenv.LoadAvg())

	long, short := mustRun(s, *steps), mustRun(s, *steps/10)

	exe := os.Getenv("TRIAD_CHROMIUM")
	if exe == "" {
		exe = "/usr/bin/chromium"
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(filepath.Join(dir, "chromium")),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 800))
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	if err := consoletest.SignIn(tab, s.URL, s.KeyA); err != nil {
		log.Fatal(err)
	}
	// Each page records when the element a measurement waits for first
	// shows, two frames after it enters the document.
	if _, err := chromedp.Call(tab, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: paintProbe}); err != nil {
		log.Fatal(err)
	}

	fmt.Printf("\n1. first paint, median of %d loads each (ms from navigation start), load %s:\n", *loads, benchenv.LoadAvg())
	var list, first, whole []float64
	for range *loads {
		list = append(list, paint(tab, s.URL+"/", "list", `window.__paint.list !== undefined`))
		first = append(first, paint(tab, s.URL+"/console/runs/"+long, "first", `window.__paint.first !== undefined && window.__paint.whole !== undefined`))
		whole = append(whole, must(chromedp.Run(tab, chromedp.Evaluate[float64](`window.__paint.whole`))))
	}
	fmt.Printf("   runs list, first row: %.0f ms\n", median(list))
	fmt.Printf("   %d-step run page, first timeline entry: %.0f ms; whole timeline and journal: %.0f ms\n", *steps, median(first), median(whole))
	fmt.Printf("   run page first paint / runs list = %.2f (goal ≤ 2); whole / runs list = %.2f\n", median(first)/median(list), median(whole)/median(list))

	fmt.Printf("\n2. live updates: %d new calls, load %s:\n", *calls, benchenv.LoadAvg())
	m := consoletest.NewMeter(tab)
	var got []consoletest.Bytes
	for _, r := range []struct {
		id    string
		steps int
	}{{short, *steps / 10}, {long, *steps}} {
		b, err := consoletest.LiveBytes(tab, s, m, s.KeyA, r.id, r.steps, *calls)
		if err != nil {
			log.Fatal(err)
		}
		got = append(got, b)
		fmt.Printf("   %d-step run: %d bytes (%d fetched in %d requests, %d in %d events); the requests took %.1f ms, %.2f ms per call\n",
			r.steps, b.Total(), b.Fetched, len(b.Requests), b.SSE, b.Events, ms(b.Busy), ms(b.Busy)/float64(*calls))
		for _, q := range b.Requests {
			fmt.Printf("     %s\n", q)
		}
	}
	fmt.Printf("   bytes on the %d-step run / the %d-step run = %.2f (goal: O(new steps), about 1)\n", *steps, *steps/10, float64(got[1].Total())/float64(got[0].Total()))
}

// paintProbe records in window.__paint when the runs list's first row
// (list), a run page's first timeline entry (first) and its whole
// timeline with the journal rendered (whole) first show.
const paintProbe = `window.__paint = {};
(() => {
  const mark = (k) => { if (window.__paint[k] === undefined) { window.__paint[k] = -1; requestAnimationFrame(() => requestAnimationFrame(() => { window.__paint[k] = performance.now(); })); } };
  const check = () => {
    if (document.querySelector('#runs tbody tr')) mark('list');
    if (document.querySelector('#timeline > li')) mark('first');
    const n = document.querySelectorAll('#timeline > li').length;
    if (n && document.getElementById('step-' + n) && document.querySelector('#cel h2')) {
      const last = [...document.querySelectorAll('#cel h2')].pop();
      if (last && last.textContent.startsWith('Step ' + n + ':')) mark('whole');
    }
  };
  new MutationObserver(check).observe(document, { childList: true, subtree: true });
})();`

// paint loads url and returns window.__paint[key] once cond holds.
func paint(tab context.Context, url, key, cond string) float64 {
	must(chromedp.Run(tab, chromedp.Navigate(url)))
	if err := consoletest.WaitJS(tab, cond+` && Object.values(window.__paint).every((v) => v !== -1)`); err != nil {
		log.Fatal(err)
	}
	return must(chromedp.Run(tab, chromedp.Evaluate[float64](`window.__paint.`+key)))
}

func mustRun(s *consoletest.Server, steps int) string {
	run, err := s.NewRun(s.KeyA)
	if err != nil {
		log.Fatal(err)
	}
	t0 := time.Now()
	if err := s.Writes(s.KeyA, run, 1, steps); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("   made %s: %d steps in %.1f s\n", run, steps, time.Since(t0).Seconds())
	return run
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
