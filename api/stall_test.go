package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/orchestrator"
)

// timers are body deadlines the test fires when it chooses: by event,
// never by the clock.
type timers struct {
	mu    sync.Mutex
	fns   []func()
	armed chan struct{}
}

func newTimers() *timers { return &timers{armed: make(chan struct{}, 64)} }

type noTimer struct{}

func (noTimer) Stop() bool { return true }

func (f *timers) after(_ time.Duration, fn func()) bodyread.Timer {
	f.mu.Lock()
	f.fns = append(f.fns, fn)
	f.mu.Unlock()
	select {
	case f.armed <- struct{}{}:
	default:
	}
	return noTimer{}
}

// fire runs every timer armed so far (each idle check re-arms itself).
func (f *timers) fire() {
	f.mu.Lock()
	fns := f.fns
	f.fns = nil
	f.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// stalled is an upload that sent its headers and part of its body and
// went quiet; answer is closed when the server has answered it.
type stalled struct {
	conn   net.Conn
	status int
	body   string
	answer chan struct{}
}

func stallUpload(t *testing.T, c *client, key, run, path string) *stalled {
	t.Helper()
	u, _ := url.Parse(c.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "PUT /tmp/files/%s HTTP/1.1\r\nHost: x\r\nX-Run-Id: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
		path, run, key, 1<<20, strings.Repeat("z", 4096))
	s := &stalled{conn: conn, answer: make(chan struct{})}
	go func() {
		defer close(s.answer)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s.status, s.body = resp.StatusCode, string(b)
	}()
	return s
}

func (s *stalled) open() bool {
	select {
	case <-s.answer:
		return false
	default:
		return true
	}
}

// An upload that stalls holds no run: every other call on the run answers
// while it is still open, and when its body deadline cuts it the caller
// gets 408 body_timeout; nothing is stored (issue 28: the run's lock was
// held for as long as the socket stayed open).
func TestStalledUploadHoldsNoRun(t *testing.T) {
	tm := newTimers()
	c := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t)}),
		Body: bodyread.Config{Idle: time.Hour, AfterFunc: tm.after}})
	const run = "r-stall"
	c.write(run, "before.txt", "x")
	<-tm.armed // the write's own body
	s := stallUpload(t, c, c.key, run, "big.bin")
	<-tm.armed // the upload's body is being read: it holds its slot

	if a := c.do("GET", "/tmp/list", run, nil); a.status != 200 {
		t.Fatalf("list during the stalled upload: %d %s", a.status, a.body)
	}
	c.write(run, "during.txt", "y")
	if a := c.post("/tmp/delete", run, map[string]string{"path": "before.txt"}); a.status != 200 {
		t.Fatalf("delete during the stalled upload: %d %s", a.status, a.body)
	}
	if a := c.do("GET", "/cel", run, nil); a.status >= 500 {
		t.Fatalf("journal during the stalled upload: %d %s", a.status, a.body)
	}
	if !s.open() {
		t.Fatalf("the stalled upload was answered (%d %s) before its deadline fired", s.status, s.body)
	}

	// The deadline: the first check sees the 4 KiB that came, the next
	// sees nothing more and cuts.
	for s.open() {
		tm.fire()
		select {
		case <-s.answer:
		case <-tm.armed:
		}
	}
	if s.status != http.StatusRequestTimeout || !strings.Contains(s.body, `"body_timeout"`) {
		t.Fatalf("the stalled upload: got %d %s, want 408 body_timeout", s.status, s.body)
	}
	for _, f := range c.list(run, "") {
		if f.Path == "big.bin" {
			t.Errorf("the cut upload was stored: %+v", f)
		}
	}
}

// A tenant may have Quotas.Uploads streamed uploads in flight; one more is
// 429 quota, another tenant's is not affected, and a slot frees when an
// upload ends.
func TestUploadsPerTenant(t *testing.T) {
	tm := newTimers()
	c := apiServer(t, api.Config{Orchestrator: orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t),
		Quotas: orchestrator.Quotas{Uploads: 1}}), Body: bodyread.Config{Idle: time.Hour, AfterFunc: tm.after}})
	other := c.as(c.newKey("globex", auth.Runs))
	s := stallUpload(t, c, c.key, "r-up-1", "a.bin")
	<-tm.armed
	wantErr(t, c.do("PUT", "/tmp/files/b.bin", "r-up-2", strings.NewReader("b")), 429, "quota")
	if a := other.do("PUT", "/tmp/files/c.bin", "r-up-3", strings.NewReader("c")); a.status != 200 {
		t.Fatalf("another tenant's upload: %d %s", a.status, a.body)
	}
	s.conn.Close() // the client gives up: its slot frees
	<-s.answer
	for {
		a := c.do("PUT", "/tmp/files/b.bin", "r-up-2", strings.NewReader("b"))
		if a.status == 200 {
			break
		}
		// The server notices the closed connection when its read of the
		// body fails: until then the slot is still taken.
		wantErr(t, a, 429, "quota")
		tm.fire()
	}
}
