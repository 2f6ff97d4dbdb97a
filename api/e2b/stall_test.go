package e2b_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/tmpfsrecords"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
)

// files.write that stalls holds no sandbox: the sandbox's other calls
// answer while it is open, and its body deadline cuts it with a 400 and
// the error body (E2B's spec documents 400 for a refused upload).
func TestStalledUploadHoldsNoSandbox(t *testing.T) {
	var mu sync.Mutex
	var fns []func()
	armed := make(chan struct{}, 64)
	after := func(_ time.Duration, fn func()) bodyread.Timer {
		mu.Lock()
		fns = append(fns, fn)
		mu.Unlock()
		select {
		case armed <- struct{}{}:
		default:
		}
		return time.NewTimer(time.Hour) // never fires by itself in a test
	}
	fire := func() {
		mu.Lock()
		f := fns
		fns = nil
		mu.Unlock()
		for _, fn := range f {
			fn()
		}
	}
	st := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	e, err := e2b.New(t.Context(), e2b.Config{Core: st.Orch, Records: tmpfsrecords.New(st.Store), APIKey: apiKey,
		Body: bodyread.Config{Idle: time.Hour, AfterFunc: after}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	srv := httptest.NewServer(e.Handler(api.New(api.Config{Orchestrator: st.Orch})))
	t.Cleanup(srv.Close)
	h := &harness{url: srv.URL, stack: st, e2b: e}
	sb := h.create(t, nil)
	if st, _, b := h.do(t, "POST", "/files?path=/home/user/a.txt", merge(envd(sb), map[string]string{"Content-Type": "application/octet-stream"}), strings.NewReader("a")); st != 200 {
		t.Fatalf("upload: %d %s", st, b)
	}
	<-armed

	u, _ := url.Parse(h.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /files?path=/home/user/big.bin HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s",
		sb.SandboxID, sb.EnvdAccessToken, 1<<20, strings.Repeat("z", 4096))
	answered := make(chan struct{})
	var status int
	var body string
	go func() {
		defer close(answered)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(resp.Body)
		status, body = resp.StatusCode, string(b)
	}()
	<-armed // the stalled body is being read

	if st, _, b := h.do(t, "GET", "/files?path=/home/user/a.txt", envd(sb), nil); st != 200 || string(b) != "a" {
		t.Fatalf("download during the stalled upload: %d %s", st, b)
	}
	select {
	case <-answered:
		t.Fatalf("the stalled upload was answered (%d %s) before its deadline fired", status, body)
	default:
	}
	for done := false; !done; {
		fire()
		select {
		case <-answered:
			done = true
		case <-armed:
		}
	}
	if status != 400 || !strings.Contains(body, `"body_timeout"`) || !strings.Contains(body, `"code":400`) {
		t.Fatalf("the stalled upload: got %d %s, want 400 with body_timeout in E2B's and Triad's error shapes", status, body)
	}
}
