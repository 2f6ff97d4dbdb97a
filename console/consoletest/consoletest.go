// Package consoletest drives the web console in a real browser against a real triad serve, for the console's browser tests and bench/console alike, so the two measure the same thing the same way.
//
// A Server is `triad serve` built from this tree, with a data directory
// of its own and API keys made by `triad keys create`. A Meter counts
// the bytes a chromium tab receives over the DevTools protocol. LiveBytes
// is the live-update protocol both the test and the benchmark measure: a
// run's page open and settled, then calls made through the API, and the
// bytes the page fetched to show them.
package consoletest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// Server is a triad serve process.
type Server struct {
	// URL is where it answers; KeyA is a runs key of tenant acme, KeyAdmin
	// an admin key.
	URL            string
	KeyA, KeyAdmin string
	cmd            *exec.Cmd
	done           chan struct{}
	logs           *bytes.Buffer
	mu             *sync.Mutex
	closeOnce      sync.Once
}

// Build builds cmd/triad into dir and returns the binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "triad")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/triadhq/triad/cmd/triad").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// lockedBuffer is a log both of the process's streams write into.
type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Start starts bin serve on a free loopback port over data (made if
// missing), with args added (such as --sandbox wasm), and waits until it
// answers /healthz. ctx bounds only the wait: the process runs until
// Close.
func Start(ctx context.Context, bin, data string, args ...string) (*Server, error) {
	key := func(name, tenant, scope string) (string, error) {
		out, err := exec.Command(bin, "keys", "create", "--data", data, "--name", name, "--tenant", tenant, "--scope", scope).Output()
		if err != nil {
			return "", fmt.Errorf("triad keys create: %w", err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	s := &Server{logs: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	var err error
	if s.KeyA, err = key("alice", "acme", "runs"); err != nil {
		return nil, err
	}
	if s.KeyAdmin, err = key("root", "ops", "admin"); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	s.cmd = exec.Command(bin, append([]string{"serve", "--addr", addr, "--data", data}, args...)...)
	s.cmd.Env = append(os.Environ(), "TAVILY_API_KEY=")
	s.cmd.Stdout, s.cmd.Stderr = lockedBuffer{s.mu, s.logs}, lockedBuffer{s.mu, s.logs}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	s.URL = "http://" + addr
	for {
		if r, err := http.Get(s.URL + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return s, nil
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("triad serve exited:\n%s", s.Logs())
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("triad serve did not answer: %w\n%s", ctx.Err(), s.Logs())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Logs is what the server logged so far.
func (s *Server) Logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// Close stops the server (SIGTERM, then SIGKILL after a minute) and
// waits for it. It is safe to call twice.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Call calls the JSON API with key; run, when set, is the X-Run-Id. It
// returns the status, and decodes the answer into out when out is set.
func (s *Server) Call(key, method, path, run string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if run != "" {
		req.Header.Set("X-Run-Id", run)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, nil
}

// NewRun mints a run of key's tenant.
func (s *Server) NewRun(key string) (string, error) {
	var nr struct {
		RunID string `json:"run_id"`
	}
	_, err := s.Call(key, "POST", "/runs", "", nil, &nr)
	return nr.RunID, err
}

// Writes makes n steps of run, from step first on: each a tmp.write of a
// small text file (notes/<first+i>.txt), the cheapest journaled call.
func (s *Server) Writes(key, run string, first, n int) error {
	for i := range n {
		text := fmt.Sprintf("note %d\n", first+i)
		if _, err := s.Call(key, "POST", "/tmp/write", run, map[string]any{"path": fmt.Sprintf("notes/%05d.txt", first+i), "text": text}, nil); err != nil {
			return fmt.Errorf("step %d: %w", first+i, err)
		}
	}
	return nil
}

// SignIn signs a tab in with key through the console's sign-in form.
func SignIn(ctx context.Context, base, key string) error {
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/console/signin")); err != nil {
		return err
	}
	if err := waitJS(ctx, `!!document.getElementById('key')`); err != nil {
		return fmt.Errorf("the sign-in form: %w", err)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("key"), key)); err != nil {
		return err
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`form button[type=submit]`))); err != nil {
		return err
	}
	return waitJS(ctx, `document.body && document.body.dataset.page === 'runs'`)
}

// waitJS polls a JavaScript condition until it holds or ctx ends.
func waitJS(ctx context.Context, cond string) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ok, err := chromedp.Run(cctx, chromedp.Evaluate[bool](cond))
		cancel()
		if err == nil && ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited for %s: %w (last error %v)", cond, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitJS is waitJS for callers: it polls cond until it is true or ctx
// ends.
func WaitJS(ctx context.Context, cond string) error { return waitJS(ctx, cond) }

// Meter counts what a tab receives once Start is called: every request's
// bytes on the wire (the DevTools protocol's encodedDataLength: headers
// and the body as sent, compressed or not) when it finishes, and each
// Server-Sent Event as its text on the wire ("event:", "id:", "data:"
// lines and the blank line), since an event stream never finishes while
// the page is open.
type Meter struct {
	mu    sync.Mutex
	on    bool
	since time.Time
	// started holds every request in flight, counted or not: settled
	// waits for those the page started before counting began too.
	started  map[network.RequestID]request
	last     time.Time
	fetched  int64
	busy     time.Duration
	sse      int64
	events   int
	requests []string
}

// NewMeter subscribes to the tab's network events; they stop with ctx.
func NewMeter(ctx context.Context) *Meter {
	m := &Meter{started: map[network.RequestID]request{}}
	sent := chromedp.Events(ctx, network.RequestWillBeSent)
	done := chromedp.Events(ctx, network.LoadingFinished)
	failed := chromedp.Events(ctx, network.LoadingFailed)
	msgs := chromedp.Events(ctx, network.EventSourceMessageReceived)
	go func() {
		for ev, err := range sent {
			if err != nil {
				return
			}
			m.mu.Lock()
			if ev.Type != network.ResourceTypeEventSource {
				m.started[ev.RequestID] = request{what: ev.Request.Method + " " + ev.Request.URL, counted: m.on, at: float64(ev.Timestamp), sent: time.Now()}
			}
			m.last = time.Now()
			m.mu.Unlock()
		}
	}()
	go func() {
		for ev, err := range done {
			if err != nil {
				return
			}
			m.mu.Lock()
			if r, ok := m.started[ev.RequestID]; ok {
				delete(m.started, ev.RequestID)
				if r.counted && m.on {
					m.fetched += int64(ev.EncodedDataLength)
					m.busy += time.Duration((float64(ev.Timestamp) - r.at) * float64(time.Second))
					m.requests = append(m.requests, fmt.Sprintf("%s %d", r.what, int64(ev.EncodedDataLength)))
				}
			}
			m.last = time.Now()
			m.mu.Unlock()
		}
	}()
	go func() {
		for ev, err := range failed {
			if err != nil {
				return
			}
			m.mu.Lock()
			delete(m.started, ev.RequestID)
			m.mu.Unlock()
		}
	}()
	go func() {
		for ev, err := range msgs {
			if err != nil {
				return
			}
			m.mu.Lock()
			if m.on {
				m.sse += EventBytes(ev.EventName, ev.EventID, ev.Data)
				m.events++
			}
			m.last = time.Now()
			m.mu.Unlock()
		}
	}()
	return m
}

// EventBytes is the size of one Server-Sent Event as the server writes
// it: its event and id lines, a data line per line of data, and the
// blank line that ends it.
func EventBytes(name, id, data string) int64 {
	n := len("event: ") + len(name) + 1 + len("\n")
	if id != "" {
		n += len("id: ") + len(id) + 1
	}
	for l := range strings.SplitSeq(data, "\n") {
		n += len("data: ") + len(l) + 1
	}
	return int64(n)
}

// Start zeroes the counts and starts counting.
func (m *Meter) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on, m.since = true, time.Now()
	m.fetched, m.sse, m.events, m.busy = 0, 0, 0, 0
	m.requests = nil
	for id, r := range m.started {
		r.counted = false // started before: not this count's
		m.started[id] = r
	}
}

// Stop stops counting and returns what was counted.
func (m *Meter) Stop() Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	return Bytes{Fetched: m.fetched, SSE: m.sse, Events: m.events, Busy: m.busy, Requests: append([]string(nil), m.requests...)}
}

// settled waits until no counted request is in flight and the network
// has been quiet for quiet: the page's refreshes are debounced (run.js
// soon()), so a quiet spell longer than their delay means they ran.
func (m *Meter) settled(ctx context.Context, quiet time.Duration) error {
	for {
		m.mu.Lock()
		inFlight := 0
		for id, r := range m.started {
			// A request of a page navigated away from whose end the
			// browser never reported: not the page's any more.
			if !r.counted && time.Since(r.sent) > 20*time.Second {
				delete(m.started, id)
				continue
			}
			inFlight++
		}
		ok := inFlight == 0 && time.Since(m.last) >= quiet
		m.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the page's requests did not settle: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type request struct {
	what    string
	counted bool
	at      float64 // the browser's monotonic clock, in seconds
	sent    time.Time
}

// Bytes is what a Meter counted.
type Bytes struct {
	// Fetched is the bytes of the requests the page made; SSE the bytes
	// of the Events events it received on its open event stream.
	Fetched, SSE int64
	Events       int
	// Busy is the time the counted requests took, each from when the
	// browser sent it to its last byte (on loopback: the server's time).
	Busy time.Duration
	// Requests lists each counted request with its bytes.
	Requests []string
}

// Total is Fetched and SSE.
func (b Bytes) Total() int64 { return b.Fetched + b.SSE }

// LiveBytes is the live-update measurement: tab ctx (signed in as key's
// tenant) opens run's page and waits until it shows its steps steps and
// has settled; then calls more tmp.write steps are made through the API,
// and it waits until the page's timeline and journal show the last of
// them and its requests have settled. It returns the bytes the page
// received for those calls.
func LiveBytes(ctx context.Context, s *Server, m *Meter, key, run string, steps, calls int) (Bytes, error) {
	if err := chromedp.Do(ctx, chromedp.Navigate(s.URL+"/console/runs/"+url.PathEscape(run))); err != nil {
		return Bytes{}, err
	}
	shows := func(n int) string {
		return fmt.Sprintf(`document.querySelectorAll('#timeline > li').length === %d && !!document.getElementById('step-%d') &&
			[...document.querySelectorAll('#cel h2')].some((h) => h.textContent.startsWith('Step %d:')) && document.getElementById('live').classList.contains('on')`, n, n, n)
	}
	if err := waitJS(ctx, shows(steps)); err != nil {
		return Bytes{}, fmt.Errorf("the run page with %d steps: %w", steps, err)
	}
	m.Start()
	if err := m.settled(ctx, 1500*time.Millisecond); err != nil {
		return Bytes{}, err
	}
	m.Start()
	if err := s.Writes(key, run, steps+1, calls); err != nil {
		return Bytes{}, err
	}
	if err := waitJS(ctx, shows(steps+calls)); err != nil {
		return Bytes{}, fmt.Errorf("the run page after %d more calls: %w", calls, err)
	}
	if err := m.settled(ctx, 1500*time.Millisecond); err != nil {
		return Bytes{}, err
	}
	b := m.Stop()
	if b.Events < calls {
		return b, errors.New("the page's event stream brought fewer events than calls")
	}
	return b, nil
}
