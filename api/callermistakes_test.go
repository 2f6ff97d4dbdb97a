package api_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/orchestrator"
)

// Invalid UTF-8 in a JSON body is refused, never rewritten to U+FFFD:
// "\xff.txt" and "\xfe.txt" are two names, and neither may silently become
// the other (issue 28). The URL form of the same path is refused too.
func TestInvalidUTF8IsRefusedNotRewritten(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	const run = "r-utf8"
	for _, name := range []string{"\xff.txt", "\xfe.txt"} {
		body := []byte(`{"path": "` + name + `", "text": "` + name + `"}`)
		a := c.do(http.MethodPost, "/tmp/write", run, bytes.NewReader(body))
		wantErr(t, a, 400, "bad_input")
	}
	for _, body := range [][]byte{
		[]byte(`{"text": "note \xff"}`),
		[]byte("{\"text\": \"ok\", \"author\": \"\xc3\"}"),
	} {
		wantErr(t, c.do(http.MethodPost, "/cel/note", run, bytes.NewReader(body)), 400, "bad_input")
	}
	wantErr(t, c.do(http.MethodPut, "/tmp/files/%FF.txt", run, bytes.NewReader([]byte("x"))), 400, "bad_input")
	if a := c.do(http.MethodGet, "/tmp/list", run, nil); a.status == 200 && bytes.Contains(a.body, []byte(".txt")) {
		t.Errorf("a file was stored under a rewritten name: %s", a.body)
	}
}

// Every caller mistake is a 4xx with the error body, the kind saying
// which (issue 28): wrong methods, wrong media types, null and empty
// values, dead share links, malformed files_in paths, and no Go type
// names in any message.
func TestCallerMistakes(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	const run = "r-mistakes"
	c.write(run, "a.txt", "0123456789")
	raw := func(method, path, body string, hdr ...string) answer {
		return c.do(method, path, run, strings.NewReader(body), hdr...)
	}
	cases := []struct {
		name   string
		a      func() answer
		status int
		kind   string
	}{
		{"405 names its kind", func() answer { return c.do("DELETE", "/tmp/list", run, nil) }, 405, "method_not_allowed"},
		{"null body", func() answer { return raw("POST", "/tmp/write", "null") }, 400, "bad_input"},
		{"null body of an optional body", func() answer { return raw("POST", "/runs", "null") }, 400, "bad_input"},
		{"array body", func() answer { return raw("POST", "/cel/note", `["text"]`) }, 400, "bad_input"},
		{"null field", func() answer { return raw("POST", "/browser/search", `{"query": "x", "top_k": null}`) }, 400, "bad_input"},
		{"top_k 0", func() answer { return raw("POST", "/browser/search", `{"query": "x", "top_k": 0}`) }, 400, "bad_input"},
		{"top_k 21", func() answer { return raw("POST", "/browser/search", `{"query": "x", "top_k": 21}`) }, 400, "bad_input"},
		{"empty limit", func() answer { return c.do("GET", "/runs?limit=", "", nil) }, 400, "bad_input"},
		{"limit 0", func() answer { return c.do("GET", "/runs?limit=0", "", nil) }, 400, "bad_input"},
		{"limit twice", func() answer { return c.do("GET", "/runs?limit=1&limit=2", "", nil) }, 400, "bad_input"},
		{"seed out of range", func() answer { return raw("POST", "/runs", `{"seed": 4294967296}`) }, 400, "bad_input"},
		{"as_of not a date", func() answer { return raw("POST", "/runs", `{"as_of": "2026-02-30"}`) }, 400, "bad_input"},
		{"share ttl 1ns", func() answer { return raw("POST", "/runs/"+run+"/share", `{"path": "a.txt", "ttl": "1ns"}`) }, 400, "bad_input"},
		{"share ttl 59s", func() answer { return raw("POST", "/runs/"+run+"/share", `{"path": "a.txt", "ttl": "59s"}`) }, 400, "bad_input"},
		{"share both path and prefix", func() answer { return raw("POST", "/runs/"+run+"/share", `{"path": "a.txt", "prefix": "x/"}`) }, 400, "bad_input"},
		{"files_in path escapes", func() answer {
			return raw("POST", "/sandbox/exec", `{"code": "1", "files_in": [{"name": "x", "path": "../other/secret"}]}`)
		}, 400, "bad_input"},
		{"env for a python cell", func() answer { return raw("POST", "/sandbox/exec", `{"code": "1", "env": {"A": "b"}}`) }, 400, "bad_input"},
		{"write both text and bytes", func() answer { return raw("POST", "/tmp/write", `{"path": "b.txt", "text": "", "bytes_b64": ""}`) }, 400, "bad_input"},
		{"form body", func() answer {
			return raw("POST", "/cel/note", `text=hello`, "Content-Type", "application/x-www-form-urlencoded")
		}, 415, "unsupported_media_type"},
		{"text body", func() answer { return raw("POST", "/cel/note", `{"text": "hello"}`, "Content-Type", "text/plain") }, 415, "unsupported_media_type"},
		{"latin-1 JSON", func() answer {
			return raw("POST", "/cel/note", `{"text": "hello"}`, "Content-Type", "application/json; charset=iso-8859-1")
		}, 415, "unsupported_media_type"},
		{"gzip JSON", func() answer {
			return raw("POST", "/cel/note", `{"text": "hello"}`, "Content-Type", "application/json", "Content-Encoding", "gzip")
		}, 415, "unsupported_media_type"},
		{"gzip upload", func() answer { return raw("PUT", "/tmp/files/b.txt", "x", "Content-Encoding", "gzip") }, 415, "unsupported_media_type"},
		{"suffix range of 0 bytes", func() answer { return c.do("GET", "/tmp/files/a.txt", run, nil, "Range", "bytes=-0") }, 416, "range_not_satisfiable"},
		{"range past the end", func() answer { return c.do("GET", "/tmp/files/a.txt", run, nil, "Range", "bytes=100-200") }, 416, "range_not_satisfiable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := wantErr(t, tc.a(), tc.status, tc.kind)
			for _, goName := range []string{"Go struct", "Go value", "wire.", "struct field", "json: "} {
				if strings.Contains(e.Message, goName) || strings.Contains(e.Suggestion, goName) {
					t.Errorf("the error names Go's types: %+v", e)
				}
			}
		})
	}

	// 405s say what is allowed.
	a := c.do("POST", "/healthz", "", nil)
	if got := a.header.Get("Allow"); got != "GET, HEAD" {
		t.Errorf("POST /healthz: Allow %q, want GET, HEAD", got)
	}
	// A 416 says the file's size, as RFC 9110 asks.
	a = c.do("GET", "/tmp/files/a.txt", run, nil, "Range", "bytes=100-200")
	if got := a.header.Get("Content-Range"); got != "bytes */10" {
		t.Errorf("416: Content-Range %q, want bytes */10", got)
	}
	// What is allowed still works: JSON with a charset, a link of a minute.
	if a := raw("POST", "/tmp/write", `{"path": "c.txt", "text": "hello"}`, "Content-Type", "application/json; charset=utf-8"); a.status != 200 {
		t.Errorf("JSON with charset=utf-8: %d %s", a.status, a.body)
	}
	if a := raw("POST", "/runs/"+run+"/share", `{"path": "a.txt", "ttl": "1m"}`); a.status != 201 {
		t.Errorf("a link of a minute: %d %s", a.status, a.body)
	}
	if a := c.do("GET", "/tmp/files/a.txt", run, nil, "Range", "bytes=-3"); a.status != 206 || string(a.body) != "789" {
		t.Errorf("bytes=-3: %d %q, want 206 789", a.status, a.body)
	}

	// Wrong types are named by their JSON types, never Go's.
	for _, body := range []string{`{"code": 5}`, `{"code": "1", "timeout_s": "x"}`, `{"code": "1", "files_in": {}}`} {
		e := wantErr(t, raw("POST", "/sandbox/exec", body), 400, "bad_input")
		if strings.Contains(e.Message, "Go ") || strings.Contains(e.Message, "ExecRequest") {
			t.Errorf("%s: %s", body, e.Message)
		}
	}
}

// rawRequest sends head and body over a fresh connection to c's server,
// half-closes it (the client has nothing more to send), and reads the
// answer.
func rawRequest(t *testing.T, c *client, head, body string) answer {
	t.Helper()
	u, err := url.Parse(c.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head+"Authorization: Bearer "+c.key+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, header: resp.Header}
}

// A body cut short before its Content-Length is the caller's mistake,
// 400 incomplete_body, on a JSON route and on a streamed upload alike;
// nothing is stored (issue 28: they were 504 and 500).
func TestTruncatedBodies(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	const run = "r-cut"
	c.write(run, "keep.txt", "kept")
	body := `{"path": "half.txt", "text": "` + strings.Repeat("x", 50)
	a := rawRequest(t, c, fmt.Sprintf("POST /tmp/write HTTP/1.1\r\nHost: x\r\nX-Run-Id: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", run, len(body)+100), body)
	wantErr(t, a, 400, "incomplete_body")
	a = rawRequest(t, c, fmt.Sprintf("PUT /tmp/files/big.bin HTTP/1.1\r\nHost: x\r\nX-Run-Id: %s\r\nContent-Length: %d\r\n", run, 1<<20), strings.Repeat("y", 4096))
	wantErr(t, a, 400, "incomplete_body")
	a = rawRequest(t, c, fmt.Sprintf("PUT /tmp/files/chunked.bin HTTP/1.1\r\nHost: x\r\nX-Run-Id: %s\r\nTransfer-Encoding: chunked\r\n", run), "10\r\n0123456789abcdef\r\n")
	wantErr(t, a, 400, "incomplete_body")
	files := c.list(run, "")
	if len(files) != 1 || files[0].Path != "keep.txt" {
		t.Errorf("after cut bodies the run has %+v, want only keep.txt", files)
	}
}

// /mcp's transport errors are the error body too, not the SDK's plain
// text (issue 28).
func TestMCPTransportErrors(t *testing.T) {
	orch := orchestrator.New(orchestrator.Config{Store: localBackend(t).open(t)})
	c := apiServer(t, api.Config{Orchestrator: orch})
	srv := mcp.New(mcp.Config{Orchestrator: orch})
	t.Cleanup(func() { srv.Close() })
	c.h.Mount("/mcp", "MCP over streamable HTTP", srv.Handler())
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	for _, tc := range []struct {
		name   string
		method string
		body   string
		hdr    []string
	}{
		{"not JSON", "POST", "hello", []string{"Content-Type", "text/plain", "Accept", "application/json, text/event-stream"}},
		{"no Accept", "POST", initialize, []string{"Content-Type", "application/json"}},
		{"not JSON-RPC", "POST", `{"hello": 1}`, []string{"Content-Type", "application/json", "Accept", "application/json, text/event-stream"}},
		{"unknown session", "DELETE", "", []string{"Mcp-Session-Id", "no-such-session"}},
		{"wrong method", "PUT", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := c.do(tc.method, "/mcp", "", strings.NewReader(tc.body), tc.hdr...)
			if a.status < 400 || a.status >= 500 {
				t.Fatalf("got %d %s, want a 4xx", a.status, a.body)
			}
			if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			a.errKind(t)
		})
	}
}
