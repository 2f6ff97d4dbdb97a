package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/triadhq/triad/console/consoletest"
	"github.com/triadhq/triad/internal/testenv"
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

// noOverflow is true when the page scrolls no wider than the viewport.
const noOverflow = `document.documentElement.scrollWidth <= window.innerWidth && document.body.scrollWidth <= window.innerWidth`

// overflowers names the elements that reach past the viewport's right
// edge, for a failure message.
const overflowers = `[...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5 && e.getClientRects().length && !e.closest('.sr-only'))
	.slice(0, 8).map((e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '') + ' right=' + Math.round(e.getBoundingClientRect().right))`

// Screenshots of the console's main pages at 1280×800 and 390×844, light
// and dark, written to $TRIAD_SCREENSHOTS (a directory) or a temporary
// one, and the layout each must have: on the phone no page scrolls
// sideways and every control is a 44×44 px touch target; in both schemes
// every text is at least 4.5:1 against its background (3:1 when large)
// and every control has a name. The runs are real: a manual run with
// cells, a file and a failing cell's traceback, a scratch run whose
// cells were typed in the page, both on the embedded wasm kernel.
func TestScreenshots(t *testing.T) {
	exe := chromium(t)
	dir := os.Getenv("TRIAD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cs := startTriad(t, "--sandbox", "wasm", "--warm", "0")
	s := &server{url: cs.URL, logs: &testenv.Buffer{}, keyA: cs.KeyA, keyAdmin: cs.KeyAdmin}
	run, err := cs.NewRun(cs.KeyA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Call(cs.KeyA, "PATCH", "/runs/"+run, "", map[string]any{"name": "Quarterly channel figures", "tags": []string{"q3", "eu"}}, nil); err != nil {
		t.Fatal(err)
	}
	cells := []string{
		"rows = [('search', 120, 4.2), ('social', 80, 3.1), ('email', 45, 6.8)]\nfor name, spend, roas in rows:\n    print(f'{name:8} {spend:5} {roas:4.1f}')",
		"import json, os\nos.makedirs('artifacts', exist_ok=True)\nwith open('artifacts/summary.json', 'w') as f:\n    json.dump({'channels': len(rows), 'best': max(rows, key=lambda r: r[2])[0]}, f)\nmax(rows, key=lambda r: r[2])",
		"def share(spend, total):\n    return spend / total\n\ntotal = 0\nshare(rows[0][1], total)",
		"total = sum(r[1] for r in rows)\n{r[0]: round(share(r[1], total), 3) for r in rows}",
	}
	for i, code := range cells {
		var out struct {
			OK    bool            `json:"ok"`
			Error json.RawMessage `json:"error"`
		}
		if _, err := cs.Call(cs.KeyA, "POST", "/sandbox/exec", run, map[string]any{"code": code}, &out); err != nil {
			t.Fatalf("cell %d: %v", i+1, err)
		}
		if want := i != 2; out.OK != want {
			t.Fatalf("cell %d: ok %v, want %v (error %s)", i+1, out.OK, want, out.Error)
		}
	}
	if err := cs.Writes(cs.KeyA, run, 1, 1); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, exe)
	a := b.tab(t, s)
	a.signIn(cs.KeyA)
	// A scratch run, its cells typed in the page.
	a.submit("#new-scratch")
	a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
	scratch := eval[string](a, `document.body.dataset.run`)
	a.cell(1, "import math\nradius = 3\nmath.pi * radius ** 2")
	a.cell(2, "for i in range(3):\nprint('line', i)") // the editor indents after the colon
	a.cell(3, "values = [1, 2, 3]\nvalues[5]")
	if out := a.cellOut(3); !strings.Contains(out, "IndexError") {
		t.Fatalf("the failing scratch cell shows %q, want its IndexError", out)
	}
	admin := b.tab(t, s)
	admin.signIn(cs.KeyAdmin)

	type page struct {
		name, path, ready string
		tb                *tab
		scroll            string // an element to scroll into view before the shot
	}
	pages := []page{
		{"runs", "/", `document.querySelectorAll('#runs tbody tr').length >= 2`, a, ""},
		{"run", "/console/runs/" + run, `document.querySelectorAll('#timeline > li').length === 5 && !!document.querySelector('#cel h2') && !!document.querySelector('#tree li.file')`, a, ""},
		{"run-failure", "/console/runs/" + run, `document.querySelectorAll('#timeline > li').length === 5 && !!document.querySelector('#step-3.v-fail')`, a, "#step-3"},
		{"journal", "/console/runs/" + run, `[...document.querySelectorAll('#cel h2')].some((h) => h.textContent.startsWith('Step 5:'))`, a, "#step-3-sandboxexec"},
		{"scratch", "/console/runs/" + scratch + "/scratch", `document.querySelectorAll('.cell').length >= 3 && document.querySelector('.cell[data-n="3"] .traceback') !== null`, a, `.cell[data-n="2"]`},
		{"kernels", "/console/kernels", `document.querySelectorAll('#kernels tbody tr').length >= 2`, a, ""},
		{"keys", "/console/keys", `document.querySelectorAll('#keys tbody tr').length >= 2`, admin, ""},
	}
	for _, vp := range []struct {
		name   string
		w, h   int64
		mobile bool
	}{{"1280x800", 1280, 800, false}, {"390x844", 390, 844, true}} {
		for _, scheme := range []string{"light", "dark"} {
			for _, p := range pages {
				what := fmt.Sprintf("%s at %s, %s", p.name, vp.name, scheme)
				p.tb.emulate(vp.w, vp.h, vp.mobile, scheme)
				p.tb.open(p.path)
				p.tb.until(time.Minute, p.ready, what)
				if p.scroll != "" {
					p.tb.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).scrollIntoView({block: 'start'})`, p.scroll)))
				}
				// Fonts and the last layout before the shot.
				eval[bool](p.tb, `document.fonts.ready.then(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true)))))`)
				png, err := chromedp.Run(p.tb.ctx, chromedp.CaptureScreenshot())
				if err != nil {
					t.Fatalf("%s: screenshot: %v", what, err)
				}
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%s.png", p.name, vp.name, scheme)), png, 0o644); err != nil {
					t.Fatal(err)
				}
				if scheme == "dark" && !eval[bool](p.tb, `matchMedia('(prefers-color-scheme: dark)').matches && getComputedStyle(document.body).backgroundColor !== 'rgb(255, 255, 255)'`) {
					t.Errorf("%s: the page is not dark", what)
				}
				p.tb.audit(what)
				if vp.mobile {
					if !eval[bool](p.tb, noOverflow) {
						t.Errorf("%s: the page scrolls sideways (scrollWidth %d > %d): %q", what, eval[int](p.tb, `document.documentElement.scrollWidth`), vp.w, eval[[]string](p.tb, overflowers))
					}
					for _, x := range eval[[]string](p.tb, touchAudit) {
						t.Errorf("%s: a touch target under 44 px: %s", what, x)
					}
				}
			}
		}
	}
	t.Logf("screenshots in %s", dir)
	for _, tb := range []*tab{a, admin} {
		if ex := tb.exceptions(); len(ex) > 0 {
			t.Errorf("script errors: %q", ex)
		}
	}
}
