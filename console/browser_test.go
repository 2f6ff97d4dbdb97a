package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/wire"
)

// The console is tested in a real browser (Debian's chromium, driven
// over the DevTools protocol by chromedp) against a real triad serve: the
// binary built from this tree, the Docker sandbox, API keys of two
// tenants. Each "Must show" of issue 17 is a subtest of TestConsole; they
// share one server and run in order, since later ones look at what
// earlier ones made (the recipe run).

// chromium finds the browser; under CI a missing one fails the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("TRIAD_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testenv.Missing(t, "Debian's chromium (/usr/bin/chromium; scripts/host-deps.sh installs it)")
	return ""
}

// dockerUp checks that a Docker engine answers.
func dockerUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, "docker", "info").Run(); err != nil {
		testenv.Missing(t, "a Docker engine (scripts/docker.sh starts one)")
	}
}

// server is a triad serve process with a key for each of two tenants.
type server struct {
	url  string
	logs *testenv.Buffer
	// bin is the triad binary, data its data directory.
	bin, data string
	// keyA (tenant acme, runs) and keyB (tenant globex, runs); keyR
	// (tenant acme, read only); keyAdmin (admin).
	keyA, keyB, keyR, keyAdmin string
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startServer(t *testing.T) *server {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "triad")
	build := exec.Command("go", "build", "-o", bin, "github.com/triadhq/triad/cmd/triad")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	data := filepath.Join(dir, "data")
	key := func(name, tenant, scope string) string {
		out, err := exec.Command(bin, "keys", "create", "--data", data, "--name", name, "--tenant", tenant, "--scope", scope).Output()
		if err != nil {
			t.Fatalf("triad keys create: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	s := &server{keyA: key("alice", "acme", "runs"), keyB: key("bob", "globex", "runs"), keyR: key("carol", "acme", "read"),
		keyAdmin: key("root", "ops", "admin"), logs: &testenv.Buffer{}, bin: bin, data: data}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "serve", "--addr", addr, "--data", data, "--sandbox", "docker", "--warm", "1", "--quota-kernels", "4")
	cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("triad serve's log:\n%s", s.logs)
		}
	})
	s.url = "http://" + addr
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if r, err := http.Get(s.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s
			}
		}
		select {
		case <-done:
			t.Fatalf("triad serve exited:\n%s", s.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("triad serve did not answer:\n%s", s.logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// api calls the server's JSON API with a key, as a program would.
func (s *server) api(t *testing.T, key, method, path, run string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if run != "" {
		req.Header.Set("X-Run-Id", run)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

// browser is one chromium with a fresh profile.
type browserProc struct {
	root context.Context
}

func newBrowser(t *testing.T, exe string) *browserProc {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	root, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(root); err != nil { // start the browser
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return &browserProc{root: root}
}

// tab is a page in a browser context of its own (its own cookies), that
// records every JavaScript dialog (and dismisses it) and every console
// message.
type tab struct {
	t   *testing.T
	ctx context.Context
	s   *server

	mu      sync.Mutex
	dialogs []string
	console []chromedp.ConsoleMessage
}

func (b *browserProc) tab(t *testing.T, s *server) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	tb := &tab{t: t, ctx: ctx, s: s}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	console := chromedp.Console(ctx)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.dialogs = append(tb.dialogs, string(ev.Type)+": "+ev.Message)
			tb.mu.Unlock()
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.console = append(tb.console, m)
			tb.mu.Unlock()
		}
	}()
	return tb
}

// do runs actions, failing the test on an error.
func (tb *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 2*time.Minute)
	defer cancel()
	// Input goes to the tab in front: several tabs (tenants, a fresh
	// context) take turns.
	if _, err := chromedp.Call(ctx, page.BringToFront, cdp.Empty{}); err != nil {
		tb.t.Fatalf("browser: bring the tab to front: %v", err)
	}
	for _, a := range actions {
		// The browser can renumber the DOM between finding a node and
		// acting on it ("Could not find node with given id"): the action
		// failed before it touched the page, so it is run again on the
		// node found afresh. Any other error fails the test.
		err := chromedp.Do(ctx, a)
		for try := 0; err != nil && staleNode(err) && try < 5; try++ {
			err = chromedp.Do(ctx, a)
		}
		if err != nil {
			shot := tb.shot("failed-" + strings.NewReplacer(" ", "-", "/", "-").Replace(tb.t.Name()))
			tb.t.Fatalf("browser: %v; the page is in %s", err, shot)
		}
	}
}

// staleNode reports whether err is the browser's answer for a node ID that
// a document update invalidated after the query found it.
func staleNode(err error) bool {
	var e *cdproto.Error
	return errors.As(err, &e) && strings.Contains(e.Message, "Could not find node with given id")
}

// open navigates and returns the document's HTTP status.
func (tb *tab) open(path string) int64 {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 2*time.Minute)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(tb.s.url+path))
	if err != nil {
		tb.t.Fatalf("open %s: %v", path, err)
	}
	return resp.Status
}

// body opens url and returns the bytes the browser received for it.
func (tb *tab) body(url string) []byte {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	responses := chromedp.Events(ctx, network.ResponseReceived)
	if _, err := chromedp.Run(ctx, chromedp.NavigateResponse(url)); err != nil {
		tb.t.Fatalf("open %s: %v", url, err)
	}
	for ev, err := range responses {
		if err != nil {
			tb.t.Fatalf("no response for %s: %v", url, err)
		}
		if ev.Response.URL != url {
			continue
		}
		r, err := chromedp.Call(ctx, network.GetResponseBody, network.GetResponseBodyParams{RequestID: ev.RequestID})
		if err != nil {
			tb.t.Fatalf("the body of %s: %v", url, err)
		}
		return r.Body
	}
	return nil
}

// eval evaluates a JavaScript expression (awaiting a promise).
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// until polls a JavaScript condition until it is true.
// d is how long the condition takes on a quiet machine; the wait itself is
// bounded by the test binary's deadline (go test -timeout), less a minute to
// report, never by d: a loaded machine (CI beside other builds, kernels
// under gVisor) takes many times longer, and a deadline load can miss is a
// bug, not a guard.
func (tb *tab) until(d time.Duration, cond, what string) {
	tb.t.Helper()
	deadline := time.Now().Add(30 * time.Minute)
	if dl, ok := tb.t.Deadline(); ok {
		deadline = dl.Add(-time.Minute)
	}
	if quiet := time.Now().Add(d); deadline.Before(quiet) {
		deadline = quiet
	}
	start := time.Now()
	var err error
	for time.Now().Before(deadline) {
		// A page that navigates meanwhile fails an evaluation: try again.
		ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
		var ok bool
		ok, err = chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		cancel()
		if err == nil && ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	shot := tb.shot("failed-" + strings.NewReplacer(" ", "-", "/", "-").Replace(tb.t.Name()))
	tb.t.Fatalf("waited %s for %s (%s; last error %v); the page is in %s\n%s", time.Since(start).Round(time.Second), what, cond, err, shot, tail(tb.s.logs.String(), 30))
}

func (tb *tab) path() string { return eval[string](tb, `location.pathname + location.search`) }

// clear empties a form field.
func (tb *tab) clear(id string) {
	tb.t.Helper()
	eval[bool](tb, fmt.Sprintf(`(() => { const e = document.getElementById(%q); e.value = ''; e.dispatchEvent(new Event('input')); return true })()`, id))
}

// submit clicks a button that navigates, and waits for the new page.
func (tb *tab) submit(sel string) {
	tb.t.Helper()
	eval[bool](tb, `(window.__before = true)`)
	tb.do(chromedp.Click(chromedp.CSS(sel)))
	tb.until(time.Minute, `window.__before === undefined && document.readyState !== 'loading'`, "the page after "+sel)
}

// signIn signs the tab in with key through the sign-in form.
func (tb *tab) signIn(key string) {
	tb.t.Helper()
	tb.open("/")
	tb.until(30*time.Second, `document.body.dataset.page === 'signin'`, "the sign-in page")
	tb.do(chromedp.SendKeys(chromedp.ID("key"), key))
	tb.submit(`form button[type=submit]`)
	tb.until(30*time.Second, `document.body.dataset.page === 'runs'`, "the runs page after signing in")
}

// shotsDir is where screenshots go: $TRIAD_ARTIFACTS/console, the
// directory CI keeps (scripts/test.sh sets it), or else
// $TRIAD_CACHE/ci-artifacts/console.
func shotsDir(t *testing.T) string {
	root := os.Getenv("TRIAD_ARTIFACTS")
	if root == "" {
		cache := os.Getenv("TRIAD_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "triad")
		}
		root = filepath.Join(cache, "ci-artifacts")
	}
	dir := filepath.Join(root, "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shot saves a screenshot of the viewport and returns its path.
func (tb *tab) shot(name string) string {
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	p := filepath.Join(shotsDir(tb.t), name+".png")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	return p
}

// emulate sets the viewport and the colour scheme the page sees.
func (tb *tab) emulate(w, h int64, mobile bool, scheme string) {
	tb.t.Helper()
	tb.do(chromedp.EmulateViewport(w, h, func(p1 *emulation.SetDeviceMetricsOverrideParams, p2 *emulation.SetTouchEmulationEnabledParams) {
		p1.Mobile = mobile
	}), chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	}))
}

// audit runs the audit script on the page and reports what it finds.
func (tb *tab) audit(what string) {
	tb.t.Helper()
	for _, p := range eval[[]string](tb, audit) {
		tb.t.Errorf("%s: %s", what, p)
	}
}

func (tb *tab) dialogsSeen() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return slices.Clone(tb.dialogs)
}

func (tb *tab) consoleSeen() []chromedp.ConsoleMessage {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return slices.Clone(tb.console)
}

// exceptions are the uncaught errors of the console's own scripts.
func (tb *tab) exceptions() []string {
	var out []string
	for _, m := range tb.consoleSeen() {
		if m.IsException() {
			out = append(out, m.String())
		}
	}
	return out
}

// cell types code into the scratch page's cell i (1-based) and runs it
// with Shift+Enter, as a person would; it waits for the cell to finish.
func (tb *tab) cell(i int, code string) {
	tb.t.Helper()
	tb.typeCell(i, code)
	tb.press("Enter", 13, modShift)
	tb.until(3*time.Minute, fmt.Sprintf(`(() => { const c = document.querySelector('.cell[data-n="%d"]');
		return !c.classList.contains('running') && /^\[(\d+|!)\]$/.test(c.querySelector('.cell-count').textContent) })()`, i),
		fmt.Sprintf("cell %d to finish", i))
}

// Key modifiers of press (CDP's bits).
const (
	modCtrl  = 2
	modShift = 8
)

// press presses a key the page handles itself (Enter, Tab) as a person
// does: a raw key-down, which the editor takes, and no character the
// browser would insert on its own as well (which a key-down with text
// makes when a script has already handled the key).
func (tb *tab) press(key string, vk int64, mods int64) {
	tb.t.Helper()
	tb.do(chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
			if _, err := chromedp.Call(ctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: typ, Key: key, Code: key,
				WindowsVirtualKeyCode: vk, NativeVirtualKeyCode: vk, Modifiers: mods}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// editorValue is the text of cell i's editor as the editor holds it.
func (tb *tab) editorValue(i int) string {
	return eval[string](tb, fmt.Sprintf(`document.querySelector('.cell[data-n="%d"] .cell-editor').editor.value`, i))
}

// typeCell types code into cell i's editor, line by line, each line as
// text input and each line break as the Enter key (so the editor indents
// as it does for a person), waiting for the editor to take each in.
func (tb *tab) typeCell(i int, code string) {
	tb.t.Helper()
	sel := fmt.Sprintf(`.cell[data-n="%d"] .cm-content`, i)
	tb.until(30*time.Second, fmt.Sprintf(`!!document.querySelector('%s')`, sel), fmt.Sprintf("cell %d", i))
	tb.do(chromedp.Focus(chromedp.CSS(sel)))
	ed := fmt.Sprintf(`document.querySelector('.cell[data-n="%d"] .cell-editor').editor`, i)
	for n, line := range strings.Split(code, "\n") {
		if n > 0 {
			before := len(tb.editorValue(i))
			tb.press("Enter", 13, 0)
			tb.until(10*time.Second, fmt.Sprintf(`%s.value.length > %d`, ed, before), "the editor to take a line break")
		}
		if line == "" {
			continue
		}
		tb.do(chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: line})
			return err
		}))
		tb.until(10*time.Second, fmt.Sprintf(`%s.value.endsWith(%q)`, ed, line), "the editor to take a line")
	}
}

// openRecord previews one of Triad's records on the run page: it opens
// their folder and clicks the file (again, if a refresh of the tree
// redrew it meanwhile), until the preview opens.
func (tb *tab) openRecord(path string) {
	tb.t.Helper()
	tb.until(30*time.Second, fmt.Sprintf(`(() => {
		if (document.querySelector('#preview').open) return true;
		const d = document.querySelector('#tree details[data-dir="(records)"]');
		if (!d) return false;
		d.open = true;
		const b = document.querySelector('#tree li.file[data-path=%q] .file-name');
		if (b && b.offsetParent) b.click();
		return false })()`, path), "the preview of "+path)
}

func (tb *tab) cellOut(i int) string {
	return eval[string](tb, fmt.Sprintf(`document.querySelector('.cell[data-n="%d"] .cell-out').innerText`, i))
}

// download clicks a link and returns the bytes the browser saved.
func (tb *tab) download(sel string) []byte {
	tb.t.Helper()
	dir := tb.t.TempDir()
	progress := chromedp.BrowserEvents(tb.ctx, browser.DownloadProgress)
	bc := chromedp.FromContext(tb.ctx).BrowserContextID
	if _, err := chromedp.CallBrowser(tb.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, BrowserContextID: bc, DownloadPath: dir, EventsEnabled: ptr(true)}); err != nil {
		tb.t.Fatal(err)
	}
	tb.do(chromedp.Click(chromedp.CSS(sel)))
	deadline := time.After(time.Minute)
	for ev, err := range progress {
		if err != nil {
			tb.t.Fatalf("download: %v", err)
		}
		select {
		case <-deadline:
			tb.t.Fatal("the download did not finish within a minute")
		default:
		}
		switch ev.State {
		case browser.DownloadProgressStateCompleted:
			b, err := os.ReadFile(filepath.Join(dir, ev.GUID))
			if err != nil {
				tb.t.Fatal(err)
			}
			return b
		case browser.DownloadProgressStateCanceled:
			tb.t.Fatal("the browser canceled the download")
		}
	}
	tb.t.Fatal("no download")
	return nil
}

func ptr[T any](v T) *T { return &v }

// tail is the last n lines of a log.
func tail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// audit is a script that lists what a page gets wrong for people using a
// screen reader or reading it in low contrast: form controls and buttons
// with no accessible name, and visible text whose colour against its
// effective background is below WCAG AA (4.5:1, or 3:1 for large text).
const audit = `(() => {
  const out = [];
  const vis = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const name = (e) => {
    if (e.labels && e.labels.length) return [...e.labels].map((l) => l.textContent).join(' ');
    const by = e.getAttribute('aria-labelledby');
    if (by) return by.split(' ').map((id) => document.getElementById(id)?.textContent || '').join(' ');
    return e.getAttribute('aria-label') || (e.tagName === 'BUTTON' || e.tagName === 'A' ? e.textContent : '') || e.title || '';
  };
  for (const e of document.querySelectorAll('input:not([type=hidden]), select, textarea, button, a[href], [contenteditable=true]')) {
    if (vis(e) && !name(e).trim()) out.push('no accessible name: ' + e.outerHTML.slice(0, 100));
  }
  const rgba = (c) => { const m = c.match(/[\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat(1);
  const bg = (e) => {
    const layers = [];
    for (let n = e; n && n.nodeType === 1; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] === 1) break;
    }
    let acc = rgba(getComputedStyle(document.documentElement).backgroundColor);
    if (acc[3] === 0) acc = matchMedia('(prefers-color-scheme: dark)').matches ? [0, 0, 0, 1] : [255, 255, 255, 1];
    for (const l of layers.reverse()) acc = over(l, acc);
    return acc;
  };
  const seen = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const e = t.parentElement;
    if (!t.data.trim() || seen.has(e) || !vis(e) || e.closest('.cell-out img, iframe, svg, [aria-hidden=true]')) continue;
    seen.add(e);
    const cs = getComputedStyle(e);
    if (Number(cs.opacity) === 0) continue;
    const b = bg(e);
    const f = over(rgba(cs.color), b);
    const [l1, l2] = [lum(f), lum(b)].sort((x, y) => y - x);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    const px = parseFloat(cs.fontSize), bold = Number(cs.fontWeight) >= 700;
    const need = px >= 24 || (bold && px >= 18.66) ? 3 : 4.5;
    if (ratio < need) out.push('contrast ' + ratio.toFixed(2) + ' < ' + need + ': "' + t.data.trim().slice(0, 40) + '" in <' + e.tagName.toLowerCase() + ' class="' + e.className + '"> (' + cs.color + ' on rgb(' + b.slice(0, 3).map(Math.round) + '))');
  }
  return out;
})()`

// touchAudit lists the controls a finger would miss on a phone: any
// button, link, field or folder toggle smaller than 44 by 44 CSS pixels
// (WCAG 2.5.5). Links inside running text (a rendered journal's
// paragraphs and lists) are exempt, as WCAG exempts inline targets.
const touchAudit = `(() => {
  const out = [];
  for (const e of document.querySelectorAll('button, a[href], select, input:not([type=hidden]):not([type=checkbox]):not([type=radio]), summary')) {
    if (!e.getClientRects().length || getComputedStyle(e).visibility === 'hidden' || e.closest('dialog:not([open])')) continue;
    if (e.closest('.skip, .markdown p, .markdown li, .markdown td, .markdown th, .step-critique')) continue;
    const r = e.getBoundingClientRect();
    if (r.width < 44 || r.height < 44) out.push(Math.round(r.width) + 'x' + Math.round(r.height) + ' ' + e.outerHTML.slice(0, 90));
  }
  return out;
})()`

type runView struct {
	Status string `json:"status"`
	Steps  []struct {
		Step  int    `json:"step"`
		Tool  string `json:"tool"`
		Label string `json:"label"`
	} `json:"steps"`
	Artifacts []struct {
		Path   string `json:"path"`
		SHA256 string `json:"sha256"`
	} `json:"artifacts"`
}

type fileList struct {
	Files []struct {
		Path   string `json:"path"`
		SHA256 string `json:"sha256"`
	} `json:"files"`
}

func TestConsole(t *testing.T) {
	exe := chromium(t)
	// Screenshots of an earlier run's failures would mislead.
	old, _ := filepath.Glob(filepath.Join(shotsDir(t), "failed-*.png"))
	for _, p := range old {
		os.Remove(p)
	}
	dockerUp(t)
	s := startServer(t)
	b := newBrowser(t, exe)
	a := b.tab(t, s) // tenant acme, signed in once the sign-in test passes

	t.Run("sign-in", func(t *testing.T) {
		tb := b.tab(t, s)
		tb.open("/")
		if p := tb.path(); !strings.HasPrefix(p, "/console/signin") {
			t.Fatalf("/ without a session: got %s, want the sign-in page", p)
		}
		for _, bad := range []string{"not-a-key", "trd_aaaaaaaaaaaa_" + strings.Repeat("b", 52), s.keyA + "x"} {
			// The refusal is a new page: wait for its form before typing,
			// or the keys go to the old page's node.
			tb.do(chromedp.WaitReady(`#key`))
			tb.clear("key")
			tb.do(chromedp.SendKeys(chromedp.ID("key"), bad))
			tb.submit(`form button[type=submit]`)
			tb.until(30*time.Second, `!!document.querySelector('#signin-error')`, "the refusal of a wrong key")
			if msg := eval[string](tb, `document.querySelector('#signin-error').textContent`); !strings.Contains(msg, "not accepted") {
				t.Errorf("wrong key %q: got %q", bad, msg)
			}
			if p := tb.path(); !strings.HasPrefix(p, "/console/signin") || eval[string](tb, `document.body.dataset.page`) != "signin" {
				t.Errorf("a wrong key got past the sign-in page: %s", p)
			}
		}
		tb.clear("key")
		tb.do(chromedp.SendKeys(chromedp.ID("key"), s.keyA))
		tb.submit(`form button[type=submit]`)
		tb.until(30*time.Second, `document.body.dataset.page === 'runs' && document.body.dataset.signedIn === 'true'`, "the runs page")
		if who := eval[string](tb, `document.querySelector('.who-name').textContent`); !strings.Contains(who, "acme") || !strings.Contains(who, "alice") {
			t.Errorf("the header names %q, want tenant acme and key alice", who)
		}
		// The cookie holds a session id: HttpOnly, SameSite=Strict, and
		// not the key.
		r, err := chromedp.Call(tb.ctx, network.GetCookies, network.GetCookiesParams{})
		if err != nil {
			t.Fatal(err)
		}
		cookies := r.Cookies
		if err != nil {
			t.Fatal(err)
		}
		var sess *network.Cookie
		for _, c := range cookies {
			if c.Name == "triad_session" {
				sess = c
			}
			if strings.Contains(c.Value, s.keyA[4:16]) {
				t.Errorf("cookie %s holds the key's id", c.Name)
			}
		}
		if sess == nil || !sess.HTTPOnly || sess.SameSite != network.CookieSameSiteStrict || strings.Contains(sess.Value, "trd_") {
			t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not the key", sess)
		}
		if got := eval[string](tb, `document.cookie`); strings.Contains(got, "triad_session") {
			t.Errorf("scripts can read the session cookie: %q", got)
		}
		// Sign out: back to the sign-in page, and the session is gone for
		// the API too.
		tb.submit(`form.signout button`)
		tb.until(30*time.Second, `document.body.dataset.page === 'signin'`, "the sign-in page after signing out")
		tb.open("/")
		if p := tb.path(); !strings.HasPrefix(p, "/console/signin") {
			t.Errorf("after signing out, / shows %s", p)
		}
		req, _ := http.NewRequest("GET", s.url+"/runs", nil)
		req.AddCookie(&http.Cookie{Name: "triad_session", Value: sess.Value})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("the signed-out session's cookie on GET /runs: got %d, want 401", resp.StatusCode)
		}
		a.signIn(s.keyA)
	})

	if t.Failed() {
		t.FailNow() // the rest needs a signed-in browser
	}
	var recipeRun string
	t.Run("recipe from the form", func(t *testing.T) {
		a.t = t
		a.open("/console/launch")
		a.until(30*time.Second, `!!document.querySelector('.recipe-opt[data-name="sales-reallocation"]')`, "the recipe list")
		a.do(chromedp.Click(chromedp.CSS(`.recipe-opt[data-name="sales-reallocation"]`)))
		a.until(30*time.Second, `!!document.querySelector('#p-bootstrap')`, "the recipe's form")
		// The form is built from the recipe's params: types, defaults and
		// descriptions.
		if got := eval[string](a, `document.querySelector('#p-bootstrap').type + ' ' + document.querySelector('#p-bootstrap').value + ' ' + document.querySelector('#p-bootstrap-help').textContent`); !strings.HasPrefix(got, "number 400 Bootstrap resamples") {
			t.Errorf("the bootstrap field: %q", got)
		}
		if got := eval[string](a, `document.querySelector('#in-leads').type + ' ' + document.querySelector('#in-leads-help').textContent`); !strings.HasPrefix(got, "file ") || !strings.Contains(got, "leads.csv") {
			t.Errorf("the leads input: %q", got)
		}
		a.clear("p-bootstrap")
		a.clear("p-objective")
		a.do(chromedp.SendKeys(chromedp.ID("p-bootstrap"), "60"),
			chromedp.SendKeys(chromedp.ID("p-objective"), "Console test: win more revenue for the same spend"))
		// An uploaded input file: the bundled leads less their last row.
		sample, err := os.ReadFile(filepath.Join("..", "recipes", "sampledata", "leads.csv"))
		if err != nil {
			t.Fatal(err)
		}
		leads := sample[:bytes.LastIndexByte(bytes.TrimRight(sample, "\n"), '\n')+1]
		upload := filepath.Join(t.TempDir(), "my-leads.csv")
		if err := os.WriteFile(upload, leads, 0o644); err != nil {
			t.Fatal(err)
		}
		a.do(chromedp.SetUploadFiles(chromedp.ID("in-leads"), []string{upload}))
		// A tab watching the running runs, to see this one leave the
		// filter when it ends.
		watch := b.tab(t, s)
		watch.signIn(s.keyA)
		watch.open("/?status=running")
		a.submit("#launch-btn")
		a.until(time.Minute, `document.body.dataset.page === 'run'`, "the run's page after launching")
		recipeRun = eval[string](a, `document.body.dataset.run`)
		eval[bool](a, `(window.__sameDocument = true)`)
		// Each step appears live, without a reload, until the run ends.
		var counts []int
		deadline := time.Now().Add(10 * time.Minute)
		sawRunning := false
		for {
			if !sawRunning {
				sawRunning = eval[bool](watch, fmt.Sprintf(`!!document.querySelector('#runs tr[data-run=%q]')`, recipeRun))
			}
			n := eval[int](a, `document.querySelectorAll('#timeline li').length`)
			if len(counts) == 0 || counts[len(counts)-1] != n {
				counts = append(counts, n)
			}
			status := eval[string](a, `document.querySelector('#run-chips .badge')?.textContent || ''`)
			if status == "succeeded" || status == "failed" {
				if status == "failed" {
					t.Fatalf("the recipe run failed: %s", eval[string](a, `document.querySelector('#run-error').textContent`))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the run did not end in 10 minutes; timeline counts %v", counts)
			}
			time.Sleep(150 * time.Millisecond)
		}
		a.until(30*time.Second, `document.querySelector('#live-text').textContent === 'Run succeeded'`, "the end of the event stream")
		if !eval[bool](a, `window.__sameDocument === true`) {
			t.Error("the run page reloaded")
		}
		// The run's steps as it ended: the listing below is a call of the
		// run too, made after its end, which the ended run's page does not
		// follow.
		var v runView
		s.api(t, s.keyA, "GET", "/runs/"+recipeRun, "", nil, &v)
		// The uploaded file is the run's input.
		var inputs fileList
		s.api(t, s.keyA, "GET", "/tmp/list?prefix=data/", recipeRun, nil, &inputs)
		wantLeads := sha256.Sum256(leads)
		if i := slices.IndexFunc(inputs.Files, func(f struct {
			Path   string `json:"path"`
			SHA256 string `json:"sha256"`
		}) bool {
			return f.Path == "data/leads.csv"
		}); i < 0 || inputs.Files[i].SHA256 != hex.EncodeToString(wantLeads[:]) {
			t.Errorf("the run's data/leads.csv is not the uploaded file: %+v", inputs.Files)
		}
		// The run left the running filter in the watching tab, which says
		// that nothing matches now.
		if !sawRunning {
			t.Error("the tab filtering running runs never showed the run")
		}
		watch.until(time.Minute, fmt.Sprintf(`!document.querySelector('#runs tr[data-run=%q]') && !document.querySelector('#empty-filtered').hidden`, recipeRun),
			"the finished run to leave the running filter")
		if got := eval[string](watch, `document.querySelector('#empty-filtered').textContent`); !strings.Contains(got, "status running") {
			t.Errorf("the empty filtered list says %q", got)
		}
		final := eval[[]int](a, `[...document.querySelectorAll('#timeline li')].map(li => Number(li.dataset.step))`)
		if len(final) != len(v.Steps) || len(final) < 8 {
			shown := eval[[]string](a, `[...document.querySelectorAll('#timeline li')].map(li => li.dataset.step + ' ' + li.querySelector('.step-tool').textContent + ' ' + (li.querySelector('.step-label')?.textContent || ''))`)
			t.Fatalf("the timeline shows steps %q; the run has %d: %+v; uncaught exceptions: %v", shown, len(v.Steps), v.Steps, a.exceptions())
		}
		for i, n := range final {
			if n != i+1 {
				t.Fatalf("the timeline's steps are %v, want 1..%d in order", final, len(final))
			}
		}
		if len(counts) < 4 {
			t.Errorf("the timeline went through counts %v: want steps appearing one after another", counts)
		}
		t.Logf("timeline counts seen while the run progressed: %v", counts)
		// Each step shows its tool, inputs, duration, verdict and critique.
		// A step the evaluator could not grade in time (a loaded machine)
		// shows UNGRADED until its late verdict arrives on the event
		// stream: wait for a verdict, never take UNGRADED for one.
		a.until(30*time.Second, `/PASS|FAIL/.test(document.querySelector('#timeline li:last-child').innerText)`, "the last step's verdict")
		item := eval[string](a, `document.querySelector('#timeline li:last-child').innerText`)
		for _, want := range []string{"sandbox.exec", "code=", "PASS", "Evaluator:"} {
			if !strings.Contains(item, want) {
				t.Errorf("the last step %q lacks %q", item, want)
			}
		}

		// The artifacts panel lists the deliverables.
		a.until(30*time.Second, fmt.Sprintf(`document.querySelectorAll('#tree li.file').length >= %d`, len(v.Artifacts)), "the artifacts")
		listed := eval[[]string](a, `[...document.querySelectorAll('#tree li.file')].map(li => li.dataset.path)`)
		for _, art := range v.Artifacts {
			if !slices.Contains(listed, art.Path) {
				t.Errorf("the artifacts panel lacks %s", art.Path)
			}
		}
		// The usage card: Docker measures CPU time and memory; the bytes
		// the run stores are always known.
		a.until(30*time.Second, `(() => { const u = document.querySelector('#usage').innerText; return /CPU\s+[\d.]+ s/.test(u) && /Stored\s+[\d.]+ (B|KiB|MiB)/.test(u) && !/not measured/.test(u) })()`,
			"the run's usage")
		if got := eval[string](a, `document.querySelector('#tree li.file[data-path="artifacts/channel_kpis.csv"] .file-meta').innerText`); !strings.Contains(got, "step ") {
			t.Errorf("the CSV's row does not name the step that made it: %q", got)
		}
		// The PNG preview renders.
		a.do(chromedp.Click(chromedp.CSS(`#tree li.file[data-path="artifacts/charts/cac_roi.png"] .file-name`)))
		a.until(30*time.Second, `(() => { const i = document.querySelector('#preview-body img'); return !!i && i.complete && i.naturalWidth > 0 })()`, "the PNG preview")
		t.Logf("PNG preview: %d px wide", eval[int](a, `document.querySelector('#preview-body img').naturalWidth`))
		a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
		// The CSV preview is a table with rows, sortable.
		a.do(chromedp.Click(chromedp.CSS(`#tree li.file[data-path="artifacts/channel_kpis.csv"] .file-name`)))
		a.until(30*time.Second, `document.querySelectorAll('#preview-body table.csv tbody tr').length > 0`, "the CSV table")
		rows := eval[int](a, `document.querySelectorAll('#preview-body table.csv tbody tr').length`)
		head := eval[string](a, `document.querySelector('#preview-body table.csv thead').innerText`)
		if rows < 3 || !strings.Contains(head, "channel") || !strings.Contains(head, "roi") {
			t.Errorf("the CSV table: %d rows, header %q", rows, head)
		}
		a.do(chromedp.Click(chromedp.CSS(`#preview-body table.csv thead th:first-child button`)))
		a.do(chromedp.Click(chromedp.CSS(`#preview-body table.csv thead th:first-child button`)))
		firsts := eval[[]string](a, `[...document.querySelectorAll('#preview-body table.csv tbody tr')].map(r => r.cells[0].textContent)`)
		desc := eval[bool](a, `(() => { const v = [...document.querySelectorAll('#preview-body table.csv tbody tr')].map(r => r.cells[0].textContent);
			return v.every((x, i) => i === 0 || v[i - 1].localeCompare(x) >= 0) })()`)
		if eval[string](a, `document.querySelector('#preview-body table.csv thead th').getAttribute('aria-sort')`) != "descending" || !desc {
			t.Errorf("sorted descending by the first column: %v", firsts)
		}
		a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
		// A download by hash returns the bytes tmp.list reports.
		got := a.download(`#tree li.file[data-path="artifacts/channel_kpis.csv"] a.dl`)
		var fl fileList
		s.api(t, s.keyA, "GET", "/tmp/list?prefix=artifacts/", recipeRun, nil, &fl)
		sum := sha256.Sum256(got)
		want := ""
		for _, f := range fl.Files {
			if f.Path == "artifacts/channel_kpis.csv" {
				want = f.SHA256
			}
		}
		if want == "" || hex.EncodeToString(sum[:]) != want {
			t.Errorf("the downloaded CSV (%d bytes) has sha256 %x; tmp.list says %q", len(got), sum, want)
		}

		// The run's notebook previews as a notebook: Markdown cells
		// rendered, code highlighted, outputs shown; not as JSON.
		a.openRecord("run.ipynb")
		// One code cell per cell the run executed (its tmp.write steps are
		// Markdown cells).
		execs := 0
		for _, st := range v.Steps {
			if st.Tool == "sandbox.exec" {
				execs++
			}
		}
		a.until(30*time.Second, fmt.Sprintf(`document.querySelectorAll('#preview-body .notebook .nb-cell').length === %d`, execs), "the notebook's cells")
		if !eval[bool](a, `!!document.querySelector('#preview-body .notebook .nb-md h1, #preview-body .notebook .nb-md h2') &&
			!!document.querySelector('#preview-body .notebook pre.code .tok-keyword') && !!document.querySelector('#preview-body .notebook .cell-out img, #preview-body .notebook .cell-out pre')`) {
			t.Errorf("the notebook preview lacks rendered Markdown, highlighted code or outputs: %.400s", eval[string](a, `document.querySelector('#preview-body').innerText`))
		}
		if eval[bool](a, `document.querySelector('#preview-body').innerText.includes('"cell_type"')`) {
			t.Error("the notebook shows as JSON")
		}
		a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))

		// Named and tagged, the run is found by them, and sorted by name.
		a.do(chromedp.Click(chromedp.ID("labels-btn")))
		a.clear("run-name")
		a.do(chromedp.SendKeys(chromedp.ID("run-name"), "Q3 reallocation"), chromedp.SendKeys(chromedp.ID("run-tags-in"), "q3 console-test"),
			chromedp.Click(chromedp.CSS(`#labels-form button[type=submit]`)))
		a.until(30*time.Second, `document.querySelector('#run-title').textContent === 'Q3 reallocation' && document.querySelectorAll('#run-tags .tag').length === 2`, "the run's new name and tags")
		a.open("/?q=" + "tag:console-test")
		a.until(30*time.Second, `document.querySelectorAll('#runs tbody tr').length > 0`, "the search by tag")
		if ids := eval[[]string](a, `[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)`); len(ids) != 1 || ids[0] != recipeRun {
			t.Errorf("runs tagged console-test: %v, want the recipe run", ids)
		}
		if used := eval[string](a, fmt.Sprintf(`document.querySelector('#runs tr[data-run=%q] .used')?.innerText || ''`, recipeRun)); !regexp.MustCompile(`^[\d.]+ (s|min|h)[^—]* CPU · [\d.]+ [KMG]iB peak · [\d.]+ (B|KiB|MiB) stored$`).MatchString(used) {
			t.Errorf("the runs list shows the run's usage as %q, want CPU, peak memory and stored bytes", used)
		}
		a.clear("f-q")
		a.do(chromedp.SendKeys(chromedp.ID("f-q"), "reallocation q3"))
		a.until(30*time.Second, fmt.Sprintf(`document.querySelectorAll('#runs tbody tr').length === 1 && !!document.querySelector('#runs tr[data-run=%q] .run-name')`, recipeRun), "the search by name")
		a.clear("f-q")
		a.do(chromedp.SendKeys(chromedp.ID("f-q"), "no run is called this"))
		a.until(30*time.Second, `!document.querySelector('#empty-filtered').hidden && document.querySelectorAll('#runs tbody tr').length === 0`, "the empty search")
		if got := eval[string](a, `document.querySelector('#empty-filtered').innerText`); !strings.Contains(got, "no run is called this") {
			t.Errorf("the empty search says %q, want the words searched for", got)
		}
		a.do(chromedp.Click(chromedp.ID("clear-filters")))
		a.until(30*time.Second, `document.querySelectorAll('#runs tbody tr').length > 0 && document.querySelector('#f-q').value === ''`, "the cleared filters")
	})

	var scratchRun string
	t.Run("scratch cells", func(t *testing.T) {
		a.t = t
		a.open("/")
		a.submit("#new-scratch")
		a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
		scratchRun = eval[string](a, `document.body.dataset.run`)
		a.cell(1, "x = 21")
		a.cell(2, "x*2")
		if out := a.cellOut(2); !strings.Contains(out, "42") {
			t.Errorf("x*2 shows %q, want 42", out)
		}
		a.cell(3, "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3))\nplt.plot([1, 2, 3], [1, 4, 9], marker='o')\nplt.title('squares')\nplt.show()")
		a.until(30*time.Second, `(() => { const i = document.querySelector('.cell[data-n="3"] .cell-out img'); return !!i && i.complete && i.naturalWidth > 0 })()`, "the matplotlib image")
		a.cell(4, "import pandas as pd\npd.DataFrame({'channel': ['search', 'social'], 'roi': [2.5, 1.25]})")
		if n := eval[int](a, `document.querySelectorAll('.cell[data-n="4"] .cell-out .html table td').length`); n < 4 {
			t.Errorf("the DataFrame's HTML table has %d cells", n)
		}
		a.cell(5, "print('to stdout')\nimport sys; print('to stderr', file=sys.stderr)\n1/0")
		out := a.cellOut(5)
		for _, want := range []string{"to stdout", "to stderr", "ZeroDivisionError", "Traceback", "1/0"} {
			if !strings.Contains(out, want) {
				t.Errorf("the 1/0 cell's output %q lacks %q", out, want)
			}
		}
		if eval[int](a, `document.querySelectorAll('.cell[data-n="5"] .cell-out .error .traceback').length`) != 1 {
			t.Error("the traceback is not shown as an error")
		}
		// Earlier cells stay, like a notebook; the files panel lists what
		// the cells wrote.
		if got := eval[string](a, `[...document.querySelectorAll('.cell .cell-count')].slice(0, 5).map(c => c.textContent).join(' ')`); got != "[1] [2] [3] [4] [5]" {
			t.Errorf("execution counts: %q", got)
		}
		a.cell(6, "open('notes.txt', 'w').write('written by a cell')")
		a.until(30*time.Second, `[...document.querySelectorAll('#filelist a')].some(a => a.textContent === 'notes.txt')`, "the files panel")
	})

	t.Run("notes", func(t *testing.T) {
		a.t = t
		if scratchRun == "" {
			t.Fatal("needs the scratch run")
		}
		const note = "Console note: use the EU figures only"
		a.open("/console/runs/" + scratchRun)
		a.until(30*time.Second, `document.querySelectorAll('#timeline li').length >= 6 && !!document.querySelector('#cel h2')`, "the run page")
		a.do(chromedp.SendKeys(chromedp.ID("note"), note), chromedp.Click(chromedp.CSS(`#note-form button[type=submit]`)))
		a.until(30*time.Second, fmt.Sprintf(`document.querySelector('#cel').innerText.includes(%q)`, note), "the note in the rendered journal")
		if n := eval[int](a, `document.querySelectorAll('#cel .badge-pass, #cel .badge-fail').length`); n < 6 {
			t.Errorf("the rendered journal has %d verdict badges, want one per step", n)
		}
		// The next step sees it.
		a.open("/console/runs/" + scratchRun + "/scratch")
		a.until(30*time.Second, `document.querySelectorAll('.cell').length >= 7`, "the restored cells")
		a.cell(7, "y = 1")
		a.open("/console/runs/" + scratchRun)
		seen := "Saw operator note: “" + note + "”"
		a.until(30*time.Second, fmt.Sprintf(`document.querySelector('#cel').innerText.includes(%q)`, seen), "the next step's record of the note")
		var cel bytes.Buffer
		req, _ := http.NewRequest("GET", s.url+"/cel", nil)
		req.Header.Set("Authorization", "Bearer "+s.keyA)
		req.Header.Set("X-Run-Id", scratchRun)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(&cel, resp.Body)
			resp.Body.Close()
		}
		if i := strings.Index(cel.String(), "## Step 7:"); i < 0 || !strings.Contains(cel.String()[i:], seen) {
			t.Errorf("step 7's block in CEL.md does not record the note:\n%s", cel.String())
		}
	})

	t.Run("editor, previews and journal", func(t *testing.T) {
		a.t = t
		a.open("/")
		a.submit("#new-scratch")
		a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
		run := eval[string](a, `document.body.dataset.run`)
		since := len(a.consoleSeen())
		// The editor indents after a colon and highlights Python.
		a.cell(1, "for i in range(2):\nprint(i * 7)")
		if got := a.editorValue(1); got != "for i in range(2):\n    print(i * 7)" {
			t.Errorf("the editor holds %q, want the loop's body indented", got)
		}
		if !eval[bool](a, `!!document.querySelector('.cell[data-n="1"] .cm-content .tok-keyword')`) {
			t.Error("the editor does not highlight keywords")
		}
		if out := a.cellOut(1); !strings.HasPrefix(out, "0\n7") {
			t.Errorf("the loop printed %q", out)
		}
		// Tab indents, Shift+Tab takes it back.
		a.until(30*time.Second, `!!document.querySelector('.cell[data-n="2"] .cm-content')`, "cell 2")
		a.do(chromedp.Focus(chromedp.CSS(`.cell[data-n="2"] .cm-content`)))
		a.press("Tab", 9, 0)
		a.typeCell(2, "x")
		if got := a.editorValue(2); got != "    x" {
			t.Errorf("Tab in an empty cell gave %q, want four spaces", got)
		}
		a.press("Tab", 9, modShift)
		a.until(10*time.Second, `document.querySelector('.cell[data-n="2"] .cell-editor').editor.value === 'x'`, "Shift+Tab to take the indentation back")
		a.do(chromedp.Evaluate[chromedp.Void](`document.querySelector('.cell[data-n="2"] .cell-editor').editor.value = ''`))
		// A CSV over 2 MiB, and a Markdown table with aligned columns.
		a.cell(2, "import os\nos.makedirs('artifacts', exist_ok=True)\n"+
			"open('artifacts/table.md', 'w').write('| name | n | share |\\n|:--|:-:|--:|\\n| a | 1 | 10% |\\n')\n"+
			"open('big.csv', 'w').write('id,value\\n' + ''.join(f'{i},{i * 3}\\n' for i in range(300000)))")
		if out := a.cellOut(2); strings.Contains(out, "Error") {
			t.Fatalf("the cell that writes the files: %s", out)
		}
		// A kernel restarted between two cells.
		a.do(chromedp.Click(chromedp.ID("restart-btn")), chromedp.Click(chromedp.ID("restart-btn")))
		a.until(time.Minute, `document.querySelector('#restart-btn').textContent === 'Restart kernel' && !document.querySelector('#restart-btn').disabled`, "the restart")
		a.cell(3, "print('after the restart')")

		a.open("/console/runs/" + run)
		a.until(30*time.Second, `document.querySelectorAll('#timeline li').length >= 3 && !!document.querySelector('#cel h2')`, "the run page")
		if n := eval[int](a, `document.querySelectorAll('#timeline .kernel-new').length`); n != 1 {
			t.Errorf("the timeline marks %d replaced kernels, want 1", n)
		}
		// A journal link to a run file opens its preview in the page; the
		// big CSV shows its first rows.
		path := eval[string](a, `location.pathname`)
		a.do(chromedp.Click(chromedp.CSS(`#cel a[href$="/files/big.csv"]`)))
		a.until(30*time.Second, `document.querySelectorAll('#preview-body table.csv tbody tr').length === 200`, "the big CSV's preview")
		if got := eval[string](a, `location.pathname`); got != path {
			t.Errorf("a journal link left the page for %s", got)
		}
		if note := eval[string](a, `document.querySelector('#preview-body .csv-note').textContent`); !strings.Contains(note, "MiB file") {
			t.Errorf("the big CSV's note: %q", note)
		}
		a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
		a.do(chromedp.Click(chromedp.CSS(`#tree li.file[data-path="artifacts/table.md"] .file-name`)))
		a.until(30*time.Second, `!!document.querySelector('#preview-body .markdown table')`, "the Markdown table")
		if got := eval[string](a, `[...document.querySelectorAll('#preview-body .markdown td')].map(td => getComputedStyle(td).textAlign).join(' ')`); got != "left center right" {
			t.Errorf("the table's cells are aligned %q, want left center right", got)
		}
		a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
		// Finalize twice: one summary.
		for range 2 {
			a.do(chromedp.Click(chromedp.ID("finalize-btn")))
			a.until(30*time.Second, `!document.querySelector('#finalize-btn').disabled`, "finalize")
		}
		a.until(30*time.Second, `document.querySelector('#cel').innerText.includes('Summary')`, "the summary")
		var cel bytes.Buffer
		req, _ := http.NewRequest("GET", s.url+"/cel", nil)
		req.Header.Set("Authorization", "Bearer "+s.keyA)
		req.Header.Set("X-Run-Id", run)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(&cel, resp.Body)
			resp.Body.Close()
		}
		if n := strings.Count(cel.String(), "\n## Summary\n"); n != 1 {
			t.Errorf("finalized twice, the journal has %d summaries, want 1", n)
		}
		// Nothing of the above was refused by the page's CSP (the editor's
		// styles, the tables' alignment).
		for _, m := range a.consoleSeen()[since:] {
			if strings.Contains(m.Text, "Content Security Policy") && !strings.Contains(m.URL, "/files/") {
				t.Errorf("a CSP refusal on the console's own page: %s (%s)", m, m.URL)
			}
		}
	})

	var sharedSHA string
	t.Run("sharing", func(t *testing.T) {
		a.t = t
		if recipeRun == "" {
			t.Fatal("needs the recipe run")
		}
		a.open("/console/runs/" + recipeRun)
		row := `#tree li.file[data-path="artifacts/charts/reallocation.png"]`
		a.until(30*time.Second, `!!document.querySelector('`+row+`') && document.querySelector('#live-text').textContent === 'Run succeeded'`, "the artifacts")
		sharedSHA = eval[string](a, `document.querySelector('`+row+` .sha').title.replace('sha256 ', '')`)
		a.do(chromedp.Click(chromedp.CSS(row + ` button.share`)))
		a.until(30*time.Second, `!!document.querySelector('`+row+` .share-box input')`, "the share link")
		link := eval[string](a, `document.querySelector('`+row+` .share-box input').value`)
		expires := eval[string](a, `document.querySelector('`+row+` .share-box .expires time').getAttribute('datetime')`)
		if !strings.HasPrefix(link, s.url+"/share/") {
			t.Fatalf("share link %q", link)
		}
		if exp, err := time.Parse(time.RFC3339, expires); err != nil || exp.Before(time.Now().Add(23*time.Hour)) {
			t.Errorf("the link's expiry %q: want about 24 h from now", expires)
		}
		// A fresh browser context, with no cookie, downloads the file.
		fresh := b.tab(t, s)
		if st := fresh.open(strings.TrimPrefix(link, s.url)); st != 200 {
			t.Fatalf("the share link in a fresh context: %d", st)
		}
		body := fresh.body(link)
		if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != sharedSHA {
			t.Errorf("the shared file (%d bytes) has sha256 %x, want %s", len(body), sum, sharedSHA)
		}
		if !eval[bool](fresh, `document.images.length === 1 && document.images[0].naturalWidth > 0`) {
			t.Error("the shared PNG does not show in the fresh context")
		}
		if r, err := chromedp.Call(fresh.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{s.url + "/"}}); err != nil || len(r.Cookies) != 0 {
			t.Errorf("the fresh context has cookies: %v %v", r, err)
		}
		// After a reload the link is still listed under its file, and
		// revoked from there, it is gone.
		a.open("/console/runs/" + recipeRun)
		a.until(30*time.Second, `!!document.querySelector('`+row+` .share-box input')`, "the share link after a reload")
		if got := eval[string](a, `document.querySelector('`+row+` .share-box input').value`); got != link {
			t.Errorf("the link listed after a reload is %q, want %q", got, link)
		}
		a.do(chromedp.Click(chromedp.CSS(row + ` .share-box .revoke`)))
		a.until(30*time.Second, `!!document.querySelector('`+row+` .share-box .revoked')`, "the revocation")
		if st := fresh.open(strings.TrimPrefix(link, s.url)); st != 404 {
			t.Errorf("the revoked link: got %d, want 404", st)
		}
	})

	t.Run("delete and collect", func(t *testing.T) {
		a.t = t
		// Two runs hold the same bytes; one of them also holds its own.
		gone, stays := "r-console-delete-gone", "r-console-delete-stays"
		var only, shared wire.FileRef
		for _, w := range []struct {
			run, path, text string
			out             *wire.FileRef
		}{
			{gone, "only.txt", "bytes only the deleted run holds", &only},
			{gone, "shared.txt", "bytes both runs hold", &shared},
			{stays, "shared.txt", "bytes both runs hold", nil},
		} {
			var out wire.FileRef
			if st := s.api(t, s.keyA, "POST", "/tmp/write", w.run, map[string]string{"path": w.path, "text": w.text}, &out); st != 200 {
				t.Fatalf("write %s: %d", w.path, st)
			}
			if w.out != nil {
				*w.out = out
			}
		}
		a.open("/console/runs/" + gone)
		// The button is in the page's HTML before run.js gives it its
		// handler: a click that came first did nothing (a CI waited its
		// whole deadline for the dialog), so the wait clicks again.
		a.until(10*time.Second, `(() => { const d = document.querySelector('#delete-dialog'); if (d && d.open) return true; document.querySelector('#delete-btn')?.click(); return false })()`, "the confirmation")
		a.do(chromedp.Click(chromedp.CSS(`#delete-confirm`)))
		a.until(30*time.Second, `location.pathname === '/'`, "the runs list after the delete")
		if st := s.api(t, s.keyA, "GET", "/runs/"+gone, "", nil, nil); st != 404 {
			t.Errorf("the deleted run: got %d, want 404", st)
		}
		// In a tab of its own: the 404 it expects is a console error, which
		// the xss check below counts against a's pages.
		g := b.tab(t, s)
		g.signIn(s.keyA)
		if st := g.open("/console/runs/" + gone); st != 404 || eval[bool](g, `!!document.querySelector('#delete-btn')`) {
			t.Errorf("the deleted run's page: %d, want 404 without the run", st)
		}
		// Time passes (the blobs are made an hour old, past --gc-grace),
		// then a collection runs beside the server, as its keeper would.
		blob := func(d string) string { return filepath.Join(s.data, "store", "blobs", "sha256", d[:2], d) }
		old := time.Now().Add(-time.Hour)
		if _, err := os.Stat(blob(only.SHA256.String())); err != nil {
			t.Fatalf("the deleted run's own blob before the collection: %v, want it stored", err)
		}
		filepath.WalkDir(filepath.Join(s.data, "store", "blobs"), func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				os.Chtimes(p, old, old)
			}
			return nil
		})
		if out, err := exec.Command(s.bin, "gc", "--data", s.data, "--grace", "10m").CombinedOutput(); err != nil {
			t.Fatalf("triad gc: %v\n%s", err, out)
		}
		if _, err := os.Stat(blob(only.SHA256.String())); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the deleted run's own blob after the collection: %v, want it removed", err)
		}
		if _, err := os.Stat(blob(shared.SHA256.String())); err != nil {
			t.Errorf("the blob the other run holds: %v, want it kept", err)
		}
		if st := s.api(t, s.keyA, "GET", "/tmp/files/shared.txt", stays, nil, nil); st != 200 {
			t.Errorf("the other run's file after the collection: got %d, want 200", st)
		}
		// A scratch run opened and left untouched leaves nothing.
		a.open("/")
		a.submit("#new-scratch")
		a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
		untouched := eval[string](a, `document.body.dataset.run`)
		if st := s.api(t, s.keyA, "GET", "/runs/"+untouched, "", nil, nil); st != 404 {
			t.Errorf("an untouched scratch run: got %d, want 404 (no run made)", st)
		}
	})

	t.Run("isolation", func(t *testing.T) {
		a.t = t
		if recipeRun == "" || sharedSHA == "" {
			t.Fatal("needs the recipe run")
		}
		bob := b.tab(t, s)
		bob.signIn(s.keyB)
		for _, p := range []string{
			"/console/runs/" + recipeRun,
			"/console/runs/" + recipeRun + "/scratch",
			"/console/runs/" + recipeRun + "/cel",
			"/console/runs/" + recipeRun + "/render/artifacts/reallocation.md",
			"/runs/" + recipeRun,
			"/runs/" + recipeRun + "/files",
			"/runs/" + recipeRun + "/files/artifacts/charts/reallocation.png",
			"/runs/" + recipeRun + "/files/artifacts/channel_kpis.csv?download=1",
			"/blobs/" + sharedSHA + "?run=" + recipeRun + "&name=x.png",
			"/runs/" + recipeRun + "/events",
		} {
			if st := bob.open(p); st != 404 {
				t.Errorf("tenant globex opening %s: got %d, want 404", p, st)
			}
		}
		bob.open("/console/runs/" + recipeRun)
		if h := eval[string](bob, `document.querySelector('main h1').textContent`); h != "Not found" {
			t.Errorf("the run page for another tenant says %q", h)
		}
		bob.open("/")
		bob.until(30*time.Second, `document.querySelector('#live').classList.contains('on')`, "the runs list")
		if ids := eval[[]string](bob, `[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)`); slices.Contains(ids, recipeRun) {
			t.Errorf("globex's runs list shows acme's run: %v", ids)
		}
	})

	t.Run("read-only key, admin keys, compression", func(t *testing.T) {
		a.t = t
		// A read-only key sees the launch form disabled, and why.
		carol := b.tab(t, s)
		carol.signIn(s.keyR)
		if eval[bool](carol, `!!document.querySelector('a[href="/console/launch"]')`) {
			t.Error("a read-only key is offered Launch recipe")
		}
		carol.open("/console/launch?recipe=sales-reallocation")
		carol.until(30*time.Second, `!!document.querySelector('#p-bootstrap')`, "the launch form")
		if !eval[bool](carol, `document.querySelector('#launch-fields').disabled && document.querySelector('#p-bootstrap').matches(':disabled') &&
			document.querySelector('#launch-btn').matches(':disabled') && !document.querySelector('#readonly-note').hidden`) {
			t.Error("the launch form is usable with a read-only key, or does not say why not")
		}
		if got := eval[string](carol, `document.querySelector('#readonly-note').textContent`); !strings.Contains(got, "runs scope") && !strings.Contains(got, "runs</code> scope") && !strings.Contains(got, "scope") {
			t.Errorf("the read-only note says %q", got)
		}
		if d := carol.dialogsSeen(); len(d) != 0 {
			t.Errorf("dialogs: %v", d)
		}
		carol.open("/console/keys")
		if eval[bool](carol, `!!document.querySelector('#key-form')`) {
			t.Error("a read-only key is shown the key form")
		}

		// An admin makes a key (shown once), which works, then revokes it.
		root := b.tab(t, s)
		root.signIn(s.keyAdmin)
		root.do(chromedp.Click(chromedp.CSS(`a[href="/console/keys"]`)))
		root.until(30*time.Second, `document.body.dataset.page === 'keys' && document.querySelectorAll('#keys tbody tr').length >= 4`, "the keys page")
		names := eval[[]string](root, `[...document.querySelectorAll('#keys .key-name')].map(e => e.textContent)`)
		for _, want := range []string{"alice", "bob", "carol", "root"} {
			if !slices.Contains(names, want) {
				t.Errorf("the keys page lists %v, without %s", names, want)
			}
		}
		root.do(chromedp.SendKeys(chromedp.ID("key-name"), "console-made"), chromedp.Click(chromedp.CSS(`input[name=scope][value=read]`)))
		root.clear("key-tenant")
		root.do(chromedp.SendKeys(chromedp.ID("key-tenant"), "acme"), chromedp.Click(chromedp.ID("key-create")))
		root.until(30*time.Second, `!document.querySelector('#new-key').hidden && document.querySelector('#new-key-token').value.startsWith('trd_')`, "the new key")
		made := eval[string](root, `document.querySelector('#new-key-token').value`)
		if st := s.api(t, made, "GET", "/runs", "", nil, nil); st != 200 {
			t.Fatalf("the key made in the console: GET /runs %d", st)
		}
		if st := s.api(t, made, "POST", "/runs", "", nil, nil); st != 403 {
			t.Errorf("the read key made in the console: POST /runs %d, want 403", st)
		}
		root.until(30*time.Second, `[...document.querySelectorAll('#keys .key-name')].some(e => e.textContent === 'console-made')`, "the new key in the list")
		root.do(chromedp.Click(chromedp.CSS(`#keys tr:has(.key-name) button.revoke[aria-label^="Revoke key console-made"]`)))
		root.until(10*time.Second, `document.querySelector('#revoke-dialog').open`, "the confirmation")
		root.do(chromedp.Click(chromedp.ID("revoke-confirm")))
		root.until(30*time.Second, `![...document.querySelectorAll('#keys .key-name')].some(e => e.textContent === 'console-made')`, "the revoked key gone from the list")
		deadline := time.Now().Add(30 * time.Second)
		for s.api(t, made, "GET", "/runs", "", nil, nil) != 401 {
			if time.Now().After(deadline) {
				t.Fatal("the revoked key still works")
			}
			time.Sleep(200 * time.Millisecond)
		}

		// Text answers are gzipped for a client that accepts it; downloads
		// are not.
		for _, tc := range []struct {
			path, rng string
			gzip      bool
		}{
			{"/runs/" + recipeRun, "", true},
			{"/console/static/vendor/editor.js", "", true},
			{"/console/static/console.css", "", true},
			{"/runs/" + recipeRun + "/files/artifacts/reallocation.md", "bytes=0-1999", false},
			{"/runs/" + recipeRun + "/files/artifacts/charts/cac_roi.png", "", false},
		} {
			req, _ := http.NewRequest("GET", s.url+tc.path, nil)
			req.Header.Set("Authorization", "Bearer "+s.keyA)
			req.Header.Set("Accept-Encoding", "gzip")
			if tc.rng != "" {
				req.Header.Set("Range", tc.rng)
			}
			resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := resp.Header.Get("Content-Encoding") == "gzip"; got != tc.gzip || resp.StatusCode/100 != 2 {
				t.Errorf("GET %s: %d, gzipped %v, want %v", tc.path, resp.StatusCode, got, tc.gzip)
			}
			t.Logf("GET %s: %d bytes on the wire (Content-Encoding %q)", tc.path, len(raw), resp.Header.Get("Content-Encoding"))
		}

		// Relative times move on while a page stays open.
		a.open("/")
		a.until(30*time.Second, `document.querySelectorAll('#runs time.rel').length > 0`, "the runs list")
		eval[bool](a, `(() => { const e = document.querySelector('#runs time.rel'); e.dateTime = new Date(Date.now() - 3 * 3600e3).toISOString(); return true })()`)
		a.until(30*time.Second, `document.querySelector('#runs time.rel').textContent.includes('3 hours ago')`, "the relative time to update")
	})

	t.Run("xss", func(t *testing.T) {
		a.t = t
		a.open("/")
		a.submit("#new-scratch")
		a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
		run := eval[string](a, `document.body.dataset.run`)
		t.Logf("cell 1 at %s", time.Now().Format("15:04:05.000"))
		a.cell(1, "print('<img src=x onerror=alert(1)>')")
		t.Logf("cell 2 at %s", time.Now().Format("15:04:05.000"))
		a.cell(2, "from IPython.display import HTML, SVG, display\n"+
			"display(HTML('<b>bold</b><img src=x onerror=\"alert(2)\"><script>alert(3)</script><a href=\"javascript:alert(4)\">link</a>'))\n"+
			"display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"20\" height=\"20\" onload=\"alert(5)\"><script>alert(6)</script><rect width=\"20\" height=\"20\" fill=\"red\"/></svg>'))")
		t.Logf("cell 3 at %s", time.Now().Format("15:04:05.000"))
		payload := `<script>alert(7); console.log("XSS-RAN"); try { top.__pwned = 1 } catch (e) {} </script><img src=x onerror="alert(8)"><h1>hello</h1>`
		a.cell(3, "import os\nos.makedirs('artifacts', exist_ok=True)\n"+
			fmt.Sprintf("open('artifacts/xss.html', 'w').write(%q)\n", payload)+
			`open('artifacts/xss.svg', 'w').write('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" onload="alert(9)"><script>alert(10); console.log("XSS-RAN")</script><rect width="40" height="40" fill="blue"/></svg>')`+"\n"+
			`open('artifacts/xss.md', 'w').write('# Report\n\n<script>alert(11)</script>\n\n<img src=x onerror=alert(12)>\n\n[click](javascript:alert(13))\n')`)
		if out := a.cellOut(1); !strings.Contains(out, "<img src=x onerror=alert(1)>") {
			t.Errorf("cell 1 shows %q, want the markup as text", out)
		}
		if n := eval[int](a, `document.querySelectorAll('.cell-out img[src="x"], .cell-out script, .cell-out a, .cell-out [onerror], .cell-out [onload]').length`); n != 0 {
			t.Errorf("%d live elements from cell output reached the page", n)
		}
		if eval[string](a, `document.querySelector('.cell[data-n="2"] .cell-out b')?.textContent || ''`) != "bold" {
			t.Error("the harmless part of the HTML output is not shown")
		}
		// A note with markup, and the files previewed.
		t.Logf("run page at %s", time.Now().Format("15:04:05.000"))
		a.open("/console/runs/" + run)
		a.until(30*time.Second, `!!document.querySelector('#tree li.file[data-path="artifacts/xss.svg"]')`, "the artifacts")
		a.do(chromedp.SendKeys(chromedp.ID("note"), `<img src=x onerror=alert(14)> **not bold**`), chromedp.Click(chromedp.CSS(`#note-form button[type=submit]`)))
		a.until(30*time.Second, `document.querySelector('#cel').innerText.includes('<img src=x onerror=alert(14)>')`, "the note, as text")
		for _, p := range []string{"artifacts/xss.html", "artifacts/xss.svg", "artifacts/xss.md"} {
			t.Logf("preview %s at %s", p, time.Now().Format("15:04:05.000"))
			a.do(chromedp.Click(chromedp.CSS(`#tree li.file[data-path="` + p + `"] .file-name`)))
			a.until(30*time.Second, `!!document.querySelector('#preview-body iframe, #preview-body img, #preview-body article')`, "the preview of "+p)
			time.Sleep(1500 * time.Millisecond) // give a script that would run the time to run
			a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
		}
		if n := eval[int](a, `document.querySelectorAll('#cel script, #cel img[src="x"], #cel a[href^="javascript"], .markdown script').length`); n != 0 {
			t.Errorf("%d live elements in the rendered journal", n)
		}
		// Opened on their own, the artifacts are sandboxed documents.
		for _, p := range []string{"artifacts/xss.html", "artifacts/xss.svg"} {
			if st := a.open("/runs/" + run + "/files/" + p); st != 200 {
				t.Errorf("%s: %d", p, st)
			}
			time.Sleep(time.Second)
		}
		a.open("/console/runs/" + run)
		a.until(30*time.Second, `!!document.querySelector('#cel h2')`, "the run page")
		if eval[bool](a, `window.__pwned === 1`) {
			t.Error("an artifact reached the console's window")
		}
		if d := a.dialogsSeen(); len(d) != 0 {
			t.Errorf("dialogs opened: %v", d)
		}
		for _, m := range a.consoleSeen() {
			if strings.Contains(m.Text, "XSS-RAN") {
				t.Errorf("a payload ran: %s", m)
			}
		}
		if ex := a.exceptions(); len(ex) != 0 {
			t.Errorf("uncaught exceptions in the console's pages: %v", ex)
		}
		// Every error the console's tab logged, from signing in to here,
		// is the browser refusing run content: a CSP or sandbox refusal,
		// or an artifact's image blocked by Cross-Origin-Resource-Policy.
		// Anything else (a script error, a failed API call) fails.
		var blocked []string
		for _, m := range a.consoleSeen() {
			if m.Type != "error" && m.Type != "warning" {
				continue
			}
			line := fmt.Sprintf("%s (%s %s:%d, at %s)", m, m.Source, m.URL, m.Line, m.Time.Format("15:04:05.000"))
			if m.Source == "security" || (m.Source == "network" && strings.Contains(m.Text, "ERR_BLOCKED_BY_RESPONSE")) {
				blocked = append(blocked, line)
				continue
			}
			t.Errorf("a console error that is not a refusal: %s", line)
		}
		if len(blocked) == 0 {
			t.Error("the browser logged no refusal: the payloads were not put to the test")
		}
		t.Logf("console errors (the browser refusing the payloads): %d\n%s", len(blocked), strings.Join(blocked, "\n"))
	})

	// At the kernel quota (4), the 5th kernel reclaims the least recently
	// used idle one, and that run's journal says so; the kernels view
	// lists the tenant's kernels and stops one; the launch page and the
	// scratch path show the quota's use.
	t.Run("kernels", func(t *testing.T) {
		a.t = t
		type kernelList struct {
			Kernels []struct {
				RunID string `json:"run_id"`
				Busy  bool   `json:"busy"`
			} `json:"kernels"`
			Quota struct{ Limit, Live, Busy int } `json:"quota"`
		}
		kernels := func() kernelList {
			var kl kernelList
			if st := s.api(t, s.keyA, "GET", "/kernels", "", nil, &kl); st != 200 {
				t.Fatalf("GET /kernels: %d", st)
			}
			return kl
		}
		// A known start: none of acme's earlier kernels live.
		for _, k := range kernels().Kernels {
			s.api(t, s.keyA, "DELETE", "/kernels/"+k.RunID, "", nil, nil)
		}
		var runs []string
		for i := range 4 {
			var nr struct {
				RunID string `json:"run_id"`
			}
			s.api(t, s.keyA, "POST", "/runs", "", nil, &nr)
			var out struct{ OK bool }
			if st := s.api(t, s.keyA, "POST", "/sandbox/exec", nr.RunID, map[string]any{"code": fmt.Sprintf("x = %d", i)}, &out); st != 200 || !out.OK {
				t.Fatalf("kernel %d: %d %+v", i, st, out)
			}
			runs = append(runs, nr.RunID)
		}
		a.emulate(1280, 800, false, "light")
		a.open("/console/kernels")
		a.until(30*time.Second, `document.querySelectorAll('#kernels tbody tr').length === 4`, "the kernels view")
		if q := eval[string](a, `document.querySelector('#kernel-quota').textContent`); !strings.Contains(q, "4 live kernels, 0 busy, of 4") || !strings.Contains(q, "least recently used idle") {
			t.Errorf("the kernels view's quota line: %q", q)
		}
		if got := eval[string](a, `[...document.querySelectorAll('#kernels tbody tr')].map(r => r.dataset.run).join(' ')`); got != strings.Join(runs, " ") {
			t.Errorf("the kernels view lists %q, want the 4 runs oldest first", got)
		}
		a.until(30*time.Second, `[...document.querySelectorAll('#kernels tbody td.num')].every(td => /\d/.test(td.textContent))`, "each kernel's CPU and memory")
		a.shot("kernels-1280x800-light")
		a.audit("the kernels view")
		a.open("/console/launch")
		a.until(30*time.Second, `document.querySelector('#kernel-quota').textContent.includes('of 4')`, "the launch page's kernel quota")

		// The 5th: a new scratch run's first cell gets a kernel.
		a.open("/")
		a.submit("#new-scratch")
		a.until(time.Minute, `document.body.dataset.page === 'scratch'`, "a new scratch run")
		fifth := eval[string](a, `document.body.dataset.run`)
		a.until(30*time.Second, `document.querySelector('#kernel-quota').textContent.includes('least recently used idle')`, "the scratch page's kernel quota")
		a.cell(1, "y = 5\ny * 2")
		if out := a.cellOut(1); !strings.Contains(out, "10") {
			t.Fatalf("the 5th kernel's cell shows %q, want 10", out)
		}
		kl := kernels()
		var live []string
		for _, k := range kl.Kernels {
			live = append(live, k.RunID)
		}
		if want := append(slices.Clone(runs[1:]), fifth); !slices.Equal(live, want) || kl.Quota.Live != 4 {
			t.Errorf("live kernels after the 5th: %q (quota %+v), want %q", live, kl.Quota, want)
		}
		// The reclaimed run's journal says so, in the console.
		a.open("/console/runs/" + runs[0])
		a.until(time.Minute, `(document.querySelector('#cel')?.textContent || '').includes('Kernel state reclaimed')`, "the reclaim in the journal")
		if j := eval[string](a, `document.querySelector('#cel').textContent`); !strings.Contains(j, fifth) || !strings.Contains(j, "kernel quota (4)") || !strings.Contains(j, "files stay") {
			t.Errorf("the reclaimed run's journal: %q; want it to name %s, the quota and that the files stay", j, fifth)
		}
		a.do(chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('#cel h3')].find(h => h.textContent.includes('Kernel state reclaimed')).scrollIntoView()`))
		time.Sleep(300 * time.Millisecond)
		a.shot("kernel-reclaimed-journal-1280x800-light")

		// Stop one from the kernels view.
		a.open("/console/kernels")
		a.until(30*time.Second, `document.querySelectorAll('#kernels tbody tr').length === 4`, "the kernels view")
		a.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`#kernels tr[data-run=%q] button[data-action=stop]`, runs[1]))))
		a.until(30*time.Second, fmt.Sprintf(`!document.querySelector('#kernels tr[data-run=%q]') && document.querySelectorAll('#kernels tbody tr').length === 3`, runs[1]), "the stopped kernel gone from the view")
		if q := eval[string](a, `document.querySelector('#kernel-quota').textContent`); !strings.Contains(q, "3 live kernels, 0 busy, of 4") {
			t.Errorf("the quota line after a stop: %q", q)
		}
		for _, k := range kernels().Kernels {
			if k.RunID == runs[1] {
				t.Errorf("GET /kernels still lists %s's kernel after the view stopped it", runs[1])
			}
		}
		a.shot("kernels-after-stop-1280x800-light")
		a.emulate(390, 844, true, "dark")
		a.open("/console/kernels")
		a.until(30*time.Second, `document.querySelectorAll('#kernels tbody tr').length === 3`, "the kernels view on a phone")
		a.shot("kernels-390x844-dark")
		a.audit("the kernels view at 390x844, dark")
		for _, p := range eval[[]string](a, touchAudit) {
			t.Errorf("the kernels view at 390x844: a touch target under 44 px: %s", p)
		}
		a.emulate(1280, 800, false, "light")
		if ex := a.exceptions(); len(ex) > 0 {
			t.Errorf("script errors: %q", ex)
		}
	})

	t.Run("screenshots", func(t *testing.T) {
		a.t = t
		if recipeRun == "" || scratchRun == "" {
			t.Fatal("needs the recipe and scratch runs")
		}
		var paths []string
		admin := b.tab(t, s)
		admin.signIn(s.keyAdmin)
		// The audit finds what it looks for: a faint line and a field
		// with no label, added to a page for the purpose.
		a.open("/")
		a.until(30*time.Second, `document.querySelectorAll('#runs tbody tr').length >= 3`, "the runs list")
		found := eval[[]string](a, `(() => { const p = document.createElement('p'); p.textContent = 'faint line'; p.style.color = '#c8c8c8';
			document.querySelector('main').append(p, document.createElement('input')); return `+audit+` })()`)
		if len(found) != 2 || !strings.Contains(found[0]+found[1], `"faint line"`) || !strings.Contains(found[0]+found[1], "no accessible name: <input>") {
			t.Fatalf("the audit of a page with a faint line and an unlabelled field found %q", found)
		}
		// Keyboard: Tab walks the runs page in document order, from the
		// skip link through the header to the filters and the runs, and
		// every stop shows a focus ring.
		a.emulate(1280, 800, false, "light")
		a.open("/")
		a.until(30*time.Second, `document.querySelectorAll('#runs tbody tr').length >= 3`, "the runs list")
		var stops []string
		for i := 0; i < 16 && !slices.Contains(stops, "body"); i++ {
			a.do(chromedp.KeyEvent(kb.Tab))
			stop := eval[string](a, `(() => { const e = document.activeElement; if (!e || e === document.body) return 'body';
				const prev = window.__lastFocus; window.__lastFocus = e;
				const after = !prev || !!(prev.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING);
				const cs = getComputedStyle(e);
				const ring = e.matches(':focus-visible') && cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2;
				return (e.id || e.getAttribute('href') || e.textContent.trim().slice(0, 24)) + (after ? '' : ' (out of order)') + (ring ? '' : ' (no focus ring)') })()`)
			stops = append(stops, stop)
			if i == 1 {
				paths = append(paths, a.shot("focus-1280x800-light"))
			}
		}
		// The runs are reached: the first rows' links (newest first; which
		// runs they are depends on the subtests before this one).
		reachesRuns := slices.ContainsFunc(stops, func(s string) bool { return strings.HasPrefix(s, "/console/runs/r-") })
		if !strings.HasPrefix(stops[0], "#main") || !slices.Contains(stops, "f-status") || !reachesRuns {
			t.Errorf("Tab stops on the runs page: %q: want the skip link first, then the header, the filters and the runs", stops)
		}
		t.Logf("Tab stops on the runs page: %q", stops)
		for i, st := range stops {
			if strings.Contains(st, "(") || st == "body" && i < 12 {
				t.Errorf("Tab stops on the runs page: %q", stops)
				break
			}
		}
		for _, vp := range []struct {
			name   string
			w, h   int64
			mobile bool
		}{{"1280x800", 1280, 800, false}, {"390x844", 390, 844, true}} {
			for _, dark := range []bool{false, true} {
				scheme := "light"
				if dark {
					scheme = "dark"
				}
				a.emulate(vp.w, vp.h, vp.mobile, scheme)
				a.open("/")
				a.until(30*time.Second, `document.querySelectorAll('#runs tbody tr').length >= 3`, "the runs list")
				paths = append(paths, a.shot(fmt.Sprintf("runs-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the runs list at %s, %s", vp.name, scheme))
				touch := func(what string) {
					if !vp.mobile {
						return
					}
					for _, p := range eval[[]string](a, touchAudit) {
						t.Errorf("%s at %s: a touch target under 44 px: %s", what, vp.name, p)
					}
				}
				touch("the runs list")
				a.open("/console/runs/" + recipeRun)
				a.until(30*time.Second, `document.querySelectorAll('#timeline li').length >= 8 && !!document.querySelector('#cel h2') && !!document.querySelector('#tree li.file')`, "the run page")
				paths = append(paths, a.shot(fmt.Sprintf("run-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the run page at %s, %s", vp.name, scheme))
				touch("the run page")
				a.do(chromedp.Evaluate[chromedp.Void](`document.querySelector('#cel').scrollIntoView()`))
				time.Sleep(300 * time.Millisecond)
				paths = append(paths, a.shot(fmt.Sprintf("journal-%s-%s", vp.name, scheme)))
				a.do(chromedp.Click(chromedp.CSS(`#tree li.file[data-path="artifacts/channel_kpis.csv"] .file-name`)))
				a.until(30*time.Second, `document.querySelectorAll('#preview-body table.csv tbody tr').length > 0`, "the CSV preview")
				paths = append(paths, a.shot(fmt.Sprintf("preview-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the CSV preview at %s, %s", vp.name, scheme))
				a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
				a.open("/console/runs/" + scratchRun + "/scratch")
				a.until(30*time.Second, `document.querySelectorAll('.cell').length >= 7`, "the scratch cells")
				a.do(chromedp.Evaluate[chromedp.Void](`document.querySelector('.cell[data-n="3"]').scrollIntoView()`))
				time.Sleep(300 * time.Millisecond)
				paths = append(paths, a.shot(fmt.Sprintf("scratch-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the scratch page at %s, %s", vp.name, scheme))
				touch("the scratch page")
				a.open("/console/launch?recipe=sales-reallocation")
				a.until(30*time.Second, `!!document.querySelector('#p-bootstrap')`, "the launch form")
				paths = append(paths, a.shot(fmt.Sprintf("launch-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the launch form at %s, %s", vp.name, scheme))
				touch("the launch form")
				// The run's notebook, previewed.
				a.open("/console/runs/" + recipeRun)
				a.openRecord("run.ipynb")
				a.until(30*time.Second, `document.querySelectorAll('#preview-body .notebook .nb-cell').length > 3`, "the notebook preview")
				a.do(chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#preview-body .nb-cell')[2].scrollIntoView()`))
				time.Sleep(300 * time.Millisecond)
				paths = append(paths, a.shot(fmt.Sprintf("notebook-%s-%s", vp.name, scheme)))
				a.audit(fmt.Sprintf("the notebook preview at %s, %s", vp.name, scheme))
				a.do(chromedp.Click(chromedp.CSS(`#preview form[method=dialog] button`)))
				// The admin's keys page.
				admin.emulate(vp.w, vp.h, vp.mobile, scheme)
				admin.open("/console/keys")
				admin.until(30*time.Second, `document.querySelectorAll('#keys tbody tr').length >= 4`, "the keys page")
				paths = append(paths, admin.shot(fmt.Sprintf("keys-%s-%s", vp.name, scheme)))
				admin.audit(fmt.Sprintf("the keys page at %s, %s", vp.name, scheme))
				// The sign-in page, in a tab with no session.
				signin := b.tab(t, s)
				signin.emulate(vp.w, vp.h, vp.mobile, scheme)
				signin.open("/")
				signin.until(30*time.Second, `document.body.dataset.page === 'signin'`, "the sign-in page")
				paths = append(paths, signin.shot(fmt.Sprintf("signin-%s-%s", vp.name, scheme)))
				signin.audit(fmt.Sprintf("the sign-in page at %s, %s", vp.name, scheme))
			}
		}
		for _, p := range paths {
			if p == "" {
				t.Error("a screenshot failed")
			}
			t.Logf("screenshot: %s", p)
		}
	})
}
