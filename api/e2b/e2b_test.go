package e2b_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/e2b"
	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	"github.com/triadhq/triad/api/e2b/envd/filesystem/filesystemconnect"
	procpb "github.com/triadhq/triad/api/e2b/envd/process"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/seal"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
)

const apiKey = "e2b_0123456789abcdef"

// harness is a real Triad stack (store, Docker kernels, journal, evaluator)
// behind Triad's HTTP API with the E2B surface in front, on one listener.
type harness struct {
	url   string
	stack *orchestratortest.Stack
	e2b   *e2b.Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return serve(t, orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Warm: 1}))
}

// serve puts a fresh E2B surface in front of st; its sandbox records are in
// st's store, so a second surface over the same stack is a restart.
func serve(t *testing.T, st *orchestratortest.Stack) *harness {
	t.Helper()
	e, err := e2b.New(t.Context(), e2b.Config{Core: st.Orch, Records: metarecords.New(st.Store.Meta()), Sealer: sealer(t, st),
		APIKey: apiKey, ExpiryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	srv := httptest.NewServer(e.Handler(api.New(api.Config{Orchestrator: st.Orch})))
	t.Cleanup(srv.Close)
	return &harness{url: srv.URL, stack: st, e2b: e}
}

// shorten cuts s for a failure message.
func shorten(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// sealer is the stack's seal, with its key kept in the stack's store, as
// triad serve keeps it: a second surface over the same store opens the
// records the first sealed.
func sealer(t *testing.T, st *orchestratortest.Stack) *seal.Sealer {
	t.Helper()
	s, err := seal.Open(t.Context(), st.Store.Meta(), seal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// codeContext is a code context as the SDKs read it.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// sandbox is what create answers.
type sandbox struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// TrafficAccessToken is what the code interpreter SDKs send on
	// their context calls.
	TrafficAccessToken string `json:"trafficAccessToken"`
}

type errBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Error   struct {
		Kind       string `json:"kind"`
		Message    string `json:"message"`
		Suggestion string `json:"suggestion"`
	} `json:"error"`
}

// do sends a request and returns the status and body.
func (h *harness) do(t *testing.T, method, path string, hdr map[string]string, body io.Reader) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, h.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, b
}

func (h *harness) control(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	st, _, b := h.do(t, method, path, map[string]string{"X-API-Key": apiKey, "Content-Type": "application/json"}, r)
	return st, b
}

func (h *harness) create(t *testing.T, body map[string]any) sandbox {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "code-interpreter-v1"
	}
	st, b := h.control(t, http.MethodPost, "/v2/sandboxes", body)
	if st != http.StatusCreated {
		t.Fatalf("create: got %d %s, want 201", st, b)
	}
	var sb sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

// envd returns the headers of a data-plane request to sb's envd.
func envd(sb sandbox) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
}

func interp(sb sandbox) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/json"}
}

// execute runs code with runCode's request and returns its JSON lines.
func (h *harness) execute(t *testing.T, sb sandbox, body map[string]any) (int, []map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	st, _, out := h.do(t, http.MethodPost, "/execute", interp(sb), bytes.NewReader(b))
	if st != http.StatusOK {
		return st, []map[string]any{{"body": string(out)}}
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["type"] != "keepalive" {
			lines = append(lines, m)
		}
	}
	return st, lines
}

func find(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// rpc returns Connect clients for sb's envd that speak JSON, as the SDKs do.
func (h *harness) rpc(sb sandbox) (filesystemconnect.FilesystemClient, processconnect.ProcessClient) {
	hc := &http.Client{Transport: headers{envd(sb)}}
	return filesystemconnect.NewFilesystemClient(hc, h.url, connect.WithProtoJSON()),
		processconnect.NewProcessClient(hc, h.url, connect.WithProtoJSON())
}

type headers struct{ h map[string]string }

func (x headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range x.h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

func TestControlPlane(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"metadata": map[string]string{"team": "a b", "k": "v"}, "timeout": 120})
	if sb.ClientID == "" || sb.EnvdVersion != e2b.EnvdVersion || sb.EnvdAccessToken == "" || sb.TemplateID != "code-interpreter-v1" {
		t.Fatalf("create answered %+v", sb)
	}

	t.Run("getInfo", func(t *testing.T) {
		st, b := h.control(t, http.MethodGet, "/sandboxes/"+sb.SandboxID, nil)
		var d map[string]any
		json.Unmarshal(b, &d)
		if st != 200 || d["state"] != "running" || d["sandboxID"] != sb.SandboxID || d["metadata"].(map[string]any)["team"] != "a b" {
			t.Fatalf("got %d %s", st, b)
		}
		for _, k := range []string{"templateID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion"} {
			if _, ok := d[k]; !ok {
				t.Errorf("getInfo lacks required %q: %s", k, b)
			}
		}
	})

	t.Run("allow_internet_access is accepted, and getInfo says there is none", func(t *testing.T) {
		// The Python SDK sends true on every create.
		net := h.create(t, map[string]any{"allow_internet_access": true, "secure": true, "metadata": map[string]string{}, "envVars": map[string]string{}})
		st, b := h.control(t, http.MethodGet, "/sandboxes/"+net.SandboxID, nil)
		var d map[string]any
		json.Unmarshal(b, &d)
		if st != 200 || d["allowInternetAccess"] != false {
			t.Fatalf("got %d %s", st, b)
		}
		h.control(t, http.MethodDelete, "/sandboxes/"+net.SandboxID, nil)
	})

	t.Run("list filters and pages", func(t *testing.T) {
		other := h.create(t, nil)
		// The SDK URL-encodes keys and values, then the pairs (e2b-protocol.md §5).
		md := url.Values{"team": {url.QueryEscape("a b")}}.Encode()
		st, b := h.control(t, http.MethodGet, "/v2/sandboxes?metadata="+url.QueryEscape(md), nil)
		var l []map[string]any
		json.Unmarshal(b, &l)
		if st != 200 || len(l) != 1 || l[0]["sandboxID"] != sb.SandboxID {
			t.Fatalf("metadata filter: got %d %s", st, b)
		}
		st, hdr, b := h.do(t, http.MethodGet, "/v2/sandboxes?limit=1", map[string]string{"X-API-Key": apiKey}, nil)
		json.Unmarshal(b, &l)
		next := hdr.Get("X-Next-Token")
		if st != 200 || len(l) != 1 || next == "" {
			t.Fatalf("page 1: got %d %s next=%q", st, b, next)
		}
		first := l[0]["sandboxID"]
		st, hdr, b = h.do(t, http.MethodGet, "/v2/sandboxes?limit=1&nextToken="+next, map[string]string{"X-API-Key": apiKey}, nil)
		json.Unmarshal(b, &l)
		if st != 200 || len(l) != 1 || l[0]["sandboxID"] == first || hdr.Get("X-Next-Token") != "" {
			t.Fatalf("page 2: got %d %s next=%q", st, b, hdr.Get("X-Next-Token"))
		}
		if st, b := h.control(t, http.MethodDelete, "/sandboxes/"+other.SandboxID, nil); st != 204 {
			t.Fatalf("kill: got %d %s", st, b)
		}
	})

	t.Run("setTimeout and connect", func(t *testing.T) {
		if st, b := h.control(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/timeout", map[string]any{"timeout": 600}); st != 204 {
			t.Fatalf("setTimeout: got %d %s", st, b)
		}
		st, b := h.control(t, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 30})
		var c sandbox
		json.Unmarshal(b, &c)
		if st != 200 || c.EnvdAccessToken == "" || c.EnvdAccessToken == sb.EnvdAccessToken {
			t.Fatalf("connect to a running sandbox: got %d %s, want 200 with a fresh token", st, b)
		}
		// Both tokens open the data plane.
		for _, tok := range []string{sb.EnvdAccessToken, c.EnvdAccessToken} {
			s2 := sb
			s2.EnvdAccessToken = tok
			if st, _, b := h.do(t, http.MethodGet, "/envs", envd(s2), nil); st != 200 {
				t.Fatalf("envs with token: got %d %s", st, b)
			}
		}
	})

	t.Run("auth", func(t *testing.T) {
		for _, key := range []string{"", "e2b_wrong"} {
			st, _, b := h.do(t, http.MethodGet, "/v2/sandboxes", map[string]string{"X-API-Key": key}, nil)
			var e errBody
			json.Unmarshal(b, &e)
			if st != 401 || e.Code != 401 || e.Error.Kind != "auth" || e.Error.Suggestion == "" {
				t.Fatalf("key %q: got %d %s, want 401 with both error shapes", key, st, b)
			}
		}
		// A wrong token is answered exactly as a sandbox that is not
		// here: the data plane tells nobody which sandboxes exist.
		bad := sb
		bad.EnvdAccessToken = "nope"
		st, _, wrong := h.do(t, http.MethodGet, "/files?path=x", envd(bad), nil)
		unknown := bad
		unknown.SandboxID = "r-nope"
		st2, _, none := h.do(t, http.MethodGet, "/files?path=x", envd(unknown), nil)
		if st != 502 || st2 != 502 || strings.ReplaceAll(string(wrong), sb.SandboxID, "r-nope") != string(none) {
			t.Fatalf("wrong access token: got %d %s; unknown sandbox: %d %s; want the same 502", st, wrong, st2, none)
		}
	})

	t.Run("unknown sandbox", func(t *testing.T) {
		for _, tc := range []struct{ method, path string }{
			{"GET", "/sandboxes/r-nope"}, {"DELETE", "/sandboxes/r-nope"}, {"POST", "/sandboxes/r-nope/timeout"},
			{"POST", "/v2/sandboxes/r-nope/connect"}, {"GET", "/sandboxes/..%2f..%2fetc"},
		} {
			st, b := h.control(t, tc.method, tc.path, map[string]any{"timeout": 10})
			var e errBody
			json.Unmarshal(b, &e)
			if st != 404 || e.Code != 404 {
				t.Errorf("%s %s: got %d %s, want 404 with code 404 (the SDK reads it)", tc.method, tc.path, st, b)
			}
		}
		ghost := sandbox{SandboxID: "r-nope", EnvdAccessToken: "x"}
		if st, _, b := h.do(t, http.MethodGet, "/health", envd(ghost), nil); st != 502 {
			t.Fatalf("health of an unknown sandbox: got %d %s, want 502 (isRunning false)", st, b)
		}
	})

	t.Run("bad create input", func(t *testing.T) {
		for name, body := range map[string]any{
			"no template": map[string]any{},
			"mcp":         map[string]any{"templateID": "base", "mcp": map[string]any{"x": 1}},
			"timeout":     map[string]any{"templateID": "base", "timeout": -1},
			"env name":    map[string]any{"templateID": "base", "envVars": map[string]string{"A=B": "x"}},
		} {
			st, b := h.control(t, http.MethodPost, "/v2/sandboxes", body)
			var e errBody
			json.Unmarshal(b, &e)
			if st < 400 || st >= 500 || e.Code != st || e.Error.Kind == "" {
				t.Errorf("%s: got %d %s, want a 4xx with both error shapes", name, st, b)
			}
		}
		st, _, b := h.do(t, http.MethodPost, "/v2/sandboxes", map[string]string{"X-API-Key": apiKey}, strings.NewReader("{"))
		if st != 400 {
			t.Errorf("malformed JSON: got %d %s", st, b)
		}
	})

	t.Run("kill", func(t *testing.T) {
		if st, b := h.control(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, nil); st != 204 {
			t.Fatalf("kill: got %d %s", st, b)
		}
		if st, b := h.control(t, http.MethodGet, "/sandboxes/"+sb.SandboxID, nil); st != 404 {
			t.Fatalf("getInfo after kill: got %d %s", st, b)
		}
		st, b := h.control(t, http.MethodGet, "/v2/sandboxes", nil)
		if st != 200 || strings.Contains(string(b), sb.SandboxID) {
			t.Fatalf("list after kill: got %d %s", st, b)
		}
		if st, _, b := h.do(t, http.MethodGet, "/health", envd(sb), nil); st != 502 {
			t.Fatalf("health after kill: got %d %s", st, b)
		}
	})
}

func upload(t *testing.T, h *harness, sb sandbox, files map[string][]byte) []map[string]string {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for p, data := range files {
		w, err := mw.CreateFormFile("file", p)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
	}
	mw.Close()
	hdr := envd(sb)
	hdr["Content-Type"] = mw.FormDataContentType()
	st, _, b := h.do(t, http.MethodPost, "/files", hdr, &buf)
	if st != 200 {
		t.Fatalf("upload: got %d %s", st, b)
	}
	var out []map[string]string
	json.Unmarshal(b, &out)
	return out
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestFiles(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, nil)
	fs, _ := h.rpc(sb)
	ctx := t.Context()
	csv := []byte("a,b\n1,2\n")

	t.Run("write multipart, several files", func(t *testing.T) {
		out := upload(t, h, sb, map[string][]byte{"data/a.csv": csv, "/home/user/data/sub/b.txt": []byte("bee")})
		if len(out) != 2 {
			t.Fatalf("got %v", out)
		}
		for _, w := range out {
			if w["type"] != "file" || !strings.HasPrefix(w["path"], "/home/user/data/") {
				t.Errorf("write info %v", w)
			}
		}
	})

	t.Run("write octet-stream gzip", func(t *testing.T) {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write([]byte("zipped"))
		zw.Close()
		hdr := envd(sb)
		hdr["Content-Type"] = "application/octet-stream"
		hdr["Content-Encoding"] = "gzip"
		st, _, b := h.do(t, http.MethodPost, "/files?path=z.txt", hdr, &z)
		if st != 200 || !strings.Contains(string(b), `"/home/user/z.txt"`) {
			t.Fatalf("got %d %s", st, b)
		}
	})

	t.Run("read", func(t *testing.T) {
		st, hdr, b := h.do(t, http.MethodGet, "/files?path="+url.QueryEscape("/home/user/data/a.csv"), envd(sb), nil)
		if st != 200 || !bytes.Equal(b, csv) || hdr.Get("Content-Length") != "8" {
			t.Fatalf("got %d %q %v", st, b, hdr)
		}
		st, _, b = h.do(t, http.MethodGet, "/files?path=z.txt", envd(sb), nil)
		if st != 200 || string(b) != "zipped" {
			t.Fatalf("gzip upload read back: got %d %q", st, b)
		}
	})

	t.Run("visible to Triad's tmp.list with sha256", func(t *testing.T) {
		st, _, b := h.do(t, http.MethodGet, "/tmp/list?prefix=data/", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
		if st != 200 || !strings.Contains(string(b), sum(csv)) {
			t.Fatalf("tmp.list: got %d %s, want a.csv with sha256 %s", st, b, sum(csv))
		}
	})

	t.Run("stat, exists, list", func(t *testing.T) {
		r, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "data/a.csv"}))
		if err != nil {
			t.Fatal(err)
		}
		e := r.Msg.GetEntry()
		if e.GetType() != fspb.FileType_FILE_TYPE_FILE || e.GetSize() != int64(len(csv)) || e.GetPath() != "/home/user/data/a.csv" || len(e.GetMetadata()) != 0 {
			t.Fatalf("stat: got %v", e)
		}
		r, err = fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/home/user/data"}))
		if err != nil || r.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY {
			t.Fatalf("stat dir: %v %v", r, err)
		}
		if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "data/nope.csv"})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("stat missing: got %v, want not_found (files.exists false)", err)
		}
		l, err := fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "data", Depth: 1}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range l.Msg.GetEntries() {
			got = append(got, e.GetName()+":"+e.GetType().String())
		}
		if strings.Join(got, ",") != "a.csv:FILE_TYPE_FILE,sub:FILE_TYPE_DIRECTORY" {
			t.Fatalf("list depth 1: got %v", got)
		}
		l, _ = fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "data", Depth: 2}))
		if len(l.Msg.GetEntries()) != 3 {
			t.Fatalf("list depth 2: got %v", l.Msg.GetEntries())
		}
	})

	t.Run("makeDir, rename, remove", func(t *testing.T) {
		if _, err := fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "out"})); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "out"})); codeOf(err) != connect.CodeAlreadyExists {
			t.Fatalf("makeDir twice: got %v, want already_exists (the SDK returns false)", err)
		}
		m, err := fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "data/sub/b.txt", Destination: "out/b.txt"}))
		if err != nil || m.Msg.GetEntry().GetPath() != "/home/user/out/b.txt" {
			t.Fatalf("move: %v %v", m, err)
		}
		if st, _, b := h.do(t, http.MethodGet, "/files?path=out/b.txt", envd(sb), nil); st != 200 || string(b) != "bee" {
			t.Fatalf("moved file: got %d %q", st, b)
		}
		if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "data/sub/b.txt"})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("move left the source: %v", err)
		}
		if _, err := fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "out"})); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "out"})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("removed dir still there: %v", err)
		}
		if _, err := fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "out"})); err != nil {
			t.Fatalf("remove missing: got %v, want done (envd's os.RemoveAll)", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, p := range []string{"../etc/passwd", "a/../../b", "sub/../../x"} {
			if st, _, b := h.do(t, http.MethodGet, "/files?path="+url.QueryEscape(p), envd(sb), nil); st != 400 {
				t.Errorf("read %q: got %d %s, want 400 (InvalidArgumentError)", p, st, b)
			}
			if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: p})); codeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("stat %q: got %v, want invalid_argument", p, err)
			}
		}
		// An absolute path outside /home/user is the sandbox's own
		// filesystem (sandbox.fs), never the host's: a write there, then
		// the sandbox's /etc/passwd (its user, not the host's), the
		// read-only root refused.
		if st, _, b := h.do(t, http.MethodPost, "/files?path=/tmp/own/a.txt", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/octet-stream"}, strings.NewReader("own")); st != 200 || !strings.Contains(string(b), `"/tmp/own/a.txt"`) {
			t.Errorf("write /tmp/own/a.txt: got %d %s", st, b)
		}
		for _, p := range []string{"/tmp/own/a.txt", "/home/user/../../tmp/own/a.txt"} {
			if st, _, b := h.do(t, http.MethodGet, "/files?path="+url.QueryEscape(p), envd(sb), nil); st != 200 || string(b) != "own" {
				t.Errorf("read %q: got %d %q, want 200 own", p, st, b)
			}
		}
		if st, _, b := h.do(t, http.MethodGet, "/files?path=/etc/passwd", envd(sb), nil); st != 200 || !strings.Contains(string(b), "root:x:0:0") {
			t.Errorf("read the sandbox's /etc/passwd: got %d %.200s", st, b)
		}
		if st, _, b := h.do(t, http.MethodPost, "/files?path=/etc/x", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/octet-stream"}, strings.NewReader("x")); st != 400 || !strings.Contains(string(b), "permission_denied") {
			t.Errorf("write on the read-only root: got %d %s, want 400 (envd's spec) with kind permission_denied", st, b)
		}
		if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/tmp/own/missing"})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("stat a missing path outside /home/user: got %v, want not_found", err)
		}
		if st, _, b := h.do(t, http.MethodGet, "/files?path=nope.txt", envd(sb), nil); st != 404 {
			t.Errorf("missing file: got %d %s, want 404 (FileNotFoundError)", st, b)
		}
		if st, _, b := h.do(t, http.MethodPost, "/files?path=CEL.md", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/octet-stream"}, strings.NewReader("x")); st != 403 {
			t.Errorf("writing the journal: got %d %s, want 403", st, b)
		}
		// A malformed Connect request: invalid_argument, never a 500.
		hdr := envd(sb)
		hdr["Content-Type"] = "application/json"
		hdr["Connect-Protocol-Version"] = "1"
		st, _, b := h.do(t, http.MethodPost, "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path": 5`))
		if st != 400 || !strings.Contains(string(b), `"invalid_argument"`) {
			t.Errorf("malformed Connect body: got %d %s, want 400 invalid_argument", st, b)
		}
		st, _, b = h.do(t, http.MethodPost, "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path": 5}`))
		if st != 400 || !strings.Contains(string(b), `"invalid_argument"`) {
			t.Errorf("wrong field type: got %d %s, want 400 invalid_argument", st, b)
		}
		delete(hdr, "X-Access-Token")
		st, _, b = h.do(t, http.MethodPost, "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path": "a"}`))
		if st != 502 || !strings.Contains(string(b), `"unavailable"`) {
			t.Errorf("no token: got %d %s, want 502 unavailable, as for a sandbox that is not here", st, b)
		}
	})
}

func TestExecute(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"envVars": map[string]string{"SANDBOX_VAR": "from-create"}})

	t.Run("state and results", func(t *testing.T) {
		if st, lines := h.execute(t, sb, map[string]any{"code": "x = 21"}); st != 200 || len(find(lines, "end_of_execution")) != 1 {
			t.Fatalf("got %d %v", st, lines)
		}
		st, lines := h.execute(t, sb, map[string]any{"code": "x * 2"})
		res := find(lines, "result")
		if st != 200 || len(res) != 1 || res[0]["text"] != "42" || res[0]["is_main_result"] != true {
			t.Fatalf("got %d %v", st, lines)
		}
		if n := find(lines, "number_of_executions"); len(n) != 1 || n[0]["execution_count"].(float64) < 2 {
			t.Fatalf("execution count: %v", lines)
		}
		other := h.create(t, nil)
		_, lines = h.execute(t, other, map[string]any{"code": "x"})
		if e := find(lines, "error"); len(e) != 1 || e[0]["name"] != "NameError" {
			t.Fatalf("another sandbox sees x: %v", lines)
		}
	})

	t.Run("stdout, errors, rich output", func(t *testing.T) {
		_, lines := h.execute(t, sb, map[string]any{"code": "print('hi')\n1/0"})
		if o := find(lines, "stdout"); len(o) != 1 || o[0]["text"] != "hi\n" {
			t.Fatalf("stdout: %v", lines)
		}
		e := find(lines, "error")
		if len(e) != 1 || e[0]["name"] != "ZeroDivisionError" || !strings.Contains(e[0]["traceback"].(string), "ZeroDivisionError") {
			t.Fatalf("error: %v", lines)
		}
		_, lines = h.execute(t, sb, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()\nimport pandas as pd\npd.DataFrame({'a':[1,2]})"})
		var png, html bool
		for _, r := range find(lines, "result") {
			if p, ok := r["png"].(string); ok {
				b, err := base64.StdEncoding.DecodeString(p)
				png = err == nil && bytes.HasPrefix(b, []byte("\x89PNG"))
			}
			if s, ok := r["html"].(string); ok && strings.Contains(s, "<table") && r["is_main_result"] == true {
				html = true
			}
		}
		if !png || !html {
			t.Fatalf("want a base64 PNG display and a DataFrame with html: %v", lines)
		}
	})

	t.Run("a long stdout arrives whole", func(t *testing.T) {
		// Triad's answer caps stdout at 64 KiB and keeps the rest in a run
		// file; runCode streams all of it as it is printed.
		_, lines := h.execute(t, sb, map[string]any{"code": "print('é' * 100000)"})
		var out strings.Builder
		for _, l := range find(lines, "stdout") {
			out.WriteString(l["text"].(string))
		}
		if want := strings.Repeat("é", 100000) + "\n"; out.String() != want {
			t.Fatalf("got %d bytes of stdout, want %d", out.Len(), len(want))
		}
	})

	t.Run("envs", func(t *testing.T) {
		_, lines := h.execute(t, sb, map[string]any{"code": "import os\n(os.environ.get('SANDBOX_VAR'), os.environ.get('CALL_VAR'))", "env_vars": map[string]string{"CALL_VAR": "per-call"}})
		if r := find(lines, "result"); len(r) != 1 || r[0]["text"] != "('from-create', 'per-call')" {
			t.Fatalf("envs: %v", lines)
		}
		_, lines = h.execute(t, sb, map[string]any{"code": "import os\nos.environ.get('CALL_VAR')"})
		if r := find(lines, "result"); len(r) != 0 {
			t.Fatalf("a per-call env outlived its call: %v", lines)
		}
		// The values are secrets: no API returns them, and neither the
		// journal, the trace, the kept sources of the cells nor the
		// sandbox's record holds them in plain text.
		if st, _, b := h.do(t, http.MethodGet, "/envs", envd(sb), nil); st != 200 || strings.TrimSpace(string(b)) != "{}" {
			t.Errorf("GET /envs: got %d %s, want {}", st, b)
		}
		run := runid.Must(sb.SandboxID)
		st := h.stack.Store
		tr, err := h.stack.Trace(t.Context(), run)
		if err != nil {
			t.Fatal(err)
		}
		var kept []string
		for _, r := range tr {
			if !r.CodeSHA256.IsZero() {
				rd, err := st.OpenBlob(t.Context(), r.CodeSHA256)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(rd)
				rd.Close()
				kept = append(kept, string(b))
			}
		}
		files, _ := st.List(t.Context(), run, "")
		for _, f := range files {
			b, _, _ := st.ReadAll(t.Context(), run, f.Path)
			kept = append(kept, string(b))
		}
		recs, err := metarecords.New(st.Meta()).All(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			kept = append(kept, string(r))
		}
		for _, k := range kept {
			if strings.Contains(k, "from-create") || strings.Contains(k, "per-call") {
				t.Errorf("an env's value is kept in plain text:\n%s", shorten(k))
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if st, lines := h.execute(t, sb, map[string]any{"code": "1", "context_id": "nope"}); st != 404 {
			t.Fatalf("unknown context: got %d %v, want 404 (NotFoundError)", st, lines)
		}
		if st, lines := h.execute(t, sb, map[string]any{"code": "1", "language": "java"}); st != 422 {
			t.Fatalf("language java (no kernel): got %d %v, want 422", st, lines)
		}
		if st, lines := h.execute(t, sb, map[string]any{"code": "1", "language": "cobol"}); st != 422 {
			t.Fatalf("language cobol: got %d %v, want 422", st, lines)
		}
		if st, lines := h.execute(t, sb, map[string]any{}); st != 400 {
			t.Fatalf("no code: got %d %v", st, lines)
		}
		ghost := sb
		ghost.SandboxID = "r-ghost"
		b, _ := json.Marshal(map[string]any{"code": "1"})
		if st, _, body := h.do(t, http.MethodPost, "/execute", interp(ghost), bytes.NewReader(b)); st != 502 {
			t.Fatalf("unknown sandbox: got %d %s, want 502", st, body)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		// Each line is printed only after the test has seen the one
		// before and answered with a file: without streaming the cell
		// would wait for its acknowledgements until the test's deadline.
		// The file goes straight into the kernel's working directory,
		// as an event outside the run would: a files.write waits for
		// the running cell (one call at a time per run).
		run, err := runid.Parse(sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(map[string]any{"code": "import os, time\nfor i in range(3):\n    print(i, flush=True)\n    while not os.path.exists('ack%d' % i):\n        time.sleep(0.05)"})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.url+"/execute", bytes.NewReader(b))
		for k, v := range interp(sb) {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var got []string
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatal(err)
			}
			if m["type"] == "stdout" {
				got = append(got, m["text"].(string))
				if _, err := h.stack.Kernels.Peek(run).Kernel.Files().Put(t.Context(), fmt.Sprintf("ack%d", len(got)-1), strings.NewReader("")); err != nil {
					t.Fatal(err)
				}
			}
			if m["type"] == "error" {
				t.Fatalf("error: %v", m)
			}
		}
		if want := []string{"0\n", "1\n", "2\n"}; !slices.Equal(got, want) {
			t.Fatalf("stdout lines: got %q, want %q", got, want)
		}
	})

	t.Run("a client that goes away interrupts the cell; the kernel keeps its state", func(t *testing.T) {
		h.execute(t, sb, map[string]any{"code": "kept = 1"})
		ctx, cancel := context.WithCancel(t.Context())
		b, _ := json.Marshal(map[string]any{"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(600)"})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/execute", bytes.NewReader(b))
		for k, v := range interp(sb) {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), "sleeping") {
		}
		cancel() // as the SDK's timeoutMs does: the fetch is aborted
		res.Body.Close()
		_, lines := h.execute(t, sb, map[string]any{"code": "kept"})
		if r := find(lines, "result"); len(r) != 1 || r[0]["text"] != "1" || len(find(lines, "stderr")) != 0 {
			t.Fatalf("after the hang-up: got %v, want kept = 1 from the same kernel", lines)
		}
		// The interrupted cell is journaled as such.
		_, _, cel := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
		if !strings.Contains(string(cel), "the call was abandoned while the cell ran") {
			t.Errorf("the interrupted cell's Step Block does not say it was interrupted:\n%s", cel)
		}
	})

	t.Run("a kill during runCode ends the cell and breaks the stream off", func(t *testing.T) {
		// As E2B's does when its sandbox goes: the SDK then finds the
		// sandbox gone and raises its TimeoutError. The cell sleeps far
		// past the test's own deadline, so only the kill can end it.
		doomed := h.create(t, map[string]any{})
		b, _ := json.Marshal(map[string]any{"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(3600)"})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.url+"/execute", bytes.NewReader(b))
		for k, v := range interp(doomed) {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), "sleeping") {
		}
		if st, body := h.control(t, http.MethodDelete, "/sandboxes/"+doomed.SandboxID, nil); st != 204 {
			t.Fatalf("kill: got %d %s", st, body)
		}
		var rest []string
		for sc.Scan() {
			rest = append(rest, sc.Text())
		}
		if sc.Err() == nil {
			t.Fatalf("the stream ended cleanly after the kill (%q); want it broken off", rest)
		}
		for _, l := range rest {
			if strings.Contains(l, "end_of_execution") {
				t.Errorf("the stream ended the execution after the kill: %q", rest)
			}
		}
		_, _, cel := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": doomed.SandboxID}, nil)
		if !strings.Contains(string(cel), "the call was abandoned while the cell ran") {
			t.Errorf("the killed cell's Step Block does not say it was interrupted:\n%s", cel)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		hdr := interp(sb)
		// The SDKs send no X-Access-Token for contexts, but the traffic
		// token create handed out; without either, no answer.
		delete(hdr, "X-Access-Token")
		if st, _, b := h.do(t, http.MethodGet, "/contexts", hdr, nil); st != 502 {
			t.Fatalf("list without a token: got %d %s, want 502", st, b)
		}
		hdr["E2B-Traffic-Access-Token"] = sb.TrafficAccessToken
		st, _, b := h.do(t, http.MethodGet, "/contexts", hdr, nil)
		if st != 200 || !strings.Contains(string(b), `"default"`) {
			t.Fatalf("list: got %d %s", st, b)
		}
		if st, _, b := h.do(t, http.MethodPost, "/contexts/nope/restart", hdr, nil); st != 404 {
			t.Fatalf("restart unknown: got %d %s", st, b)
		}
		if st, _, b := h.do(t, http.MethodDelete, "/contexts/nope", hdr, nil); st != 404 {
			t.Fatalf("remove unknown: got %d %s", st, b)
		}
		if st, _, b := h.do(t, http.MethodPost, "/contexts", hdr, strings.NewReader(`{"language": "java"}`)); st != 422 {
			t.Fatalf("create a Java context (no kernel): got %d %s, want 422", st, b)
		}
		if st, _, b := h.do(t, http.MethodPost, "/contexts", hdr, strings.NewReader(`{"cwd": "/etc"}`)); st != 400 {
			t.Fatalf("create a context outside the files: got %d %s, want 400", st, b)
		}
		create := func(body string) codeContext {
			t.Helper()
			st, _, b := h.do(t, http.MethodPost, "/contexts", hdr, strings.NewReader(body))
			var c codeContext
			if st != 200 || json.Unmarshal(b, &c) != nil || c.ID == "" || c.Language != "python" {
				t.Fatalf("create: got %d %s", st, b)
			}
			return c
		}
		a, c := create(`{}`), create(`{"cwd": "/home/user/sub", "language": "python"}`)
		if a.Cwd != "/home/user" || c.Cwd != "/home/user/sub" {
			t.Errorf("cwd: got %q and %q, want /home/user and /home/user/sub", a.Cwd, c.Cwd)
		}
		h.execute(t, sb, map[string]any{"code": "v = 'a'", "context_id": a.ID})
		h.execute(t, sb, map[string]any{"code": "v = 'c'\nimport os\ncwd = os.getcwd()", "context_id": c.ID})
		value := func(ctx, code string) any {
			_, lines := h.execute(t, sb, map[string]any{"code": code, "context_id": ctx})
			if r := find(lines, "result"); len(r) == 1 {
				return r[0]["text"]
			}
			if e := find(lines, "error"); len(e) == 1 {
				return e[0]["name"]
			}
			return lines
		}
		if got := value(a.ID, "v"); got != "a" {
			t.Errorf("v in a: got %v, want a", got)
		}
		if got := value(c.ID, "v, cwd"); got != "('c', '/home/user/sub')" {
			t.Errorf("v, cwd in c: got %v, want ('c', '/home/user/sub')", got)
		}
		if got := value(e2b.DefaultContext, "v"); got != "NameError" {
			t.Errorf("v in the default context: got %v, want NameError", got)
		}
		if st, _, b := h.do(t, http.MethodPost, "/contexts/"+a.ID+"/restart", hdr, nil); st != 200 {
			t.Fatalf("restart a: got %d %s", st, b)
		}
		if got := value(a.ID, "v"); got != "NameError" {
			t.Errorf("v in a after its restart: got %v, want NameError", got)
		}
		if got := value(c.ID, "v"); got != "c" {
			t.Errorf("v in c after a's restart: got %v, want c", got)
		}
		st, _, b = h.do(t, http.MethodGet, "/contexts", hdr, nil)
		var list []codeContext
		// default (Python), each other language's default context, then
		// the sandbox's own.
		if st != 200 || json.Unmarshal(b, &list) != nil || len(list) != 7 || list[0].ID != e2b.DefaultContext ||
			list[1].ID != "r" || list[1].Language != "r" || list[2].ID != "javascript" || list[5].ID != a.ID || list[6].ID != c.ID {
			t.Fatalf("list: got %d %s, want default, r, javascript, typescript, bash, a, c", st, b)
		}
		if st, _, b := h.do(t, http.MethodDelete, "/contexts/"+c.ID, hdr, nil); st != 200 {
			t.Fatalf("remove c: got %d %s", st, b)
		}
		if st, lines := h.execute(t, sb, map[string]any{"code": "1", "context_id": c.ID}); st != 404 {
			t.Fatalf("a removed context: got %d %v, want 404", st, lines)
		}
		if st, _, b := h.do(t, http.MethodPost, "/contexts/default/restart", hdr, nil); st != 200 {
			t.Fatalf("restart: got %d %s", st, b)
		}
		_, lines := h.execute(t, sb, map[string]any{"code": "x"})
		if e := find(lines, "error"); len(e) != 1 || e[0]["name"] != "NameError" {
			t.Fatalf("x survived a restart: %v", lines)
		}
	})

	t.Run("journal", func(t *testing.T) {
		st, _, b := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
		if st != 200 || !strings.Contains(string(b), "sandbox.exec") || strings.Contains(string(b), "PENDING") {
			t.Fatalf("journal: got %d\n%s", st, b)
		}
		if strings.Contains(string(b), "from-create") || strings.Contains(string(b), "per-call") {
			t.Fatalf("the journal shows an environment value:\n%s", b)
		}
	})
}

func TestCommands(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"envVars": map[string]string{"GREETING": "hello"}})
	_, proc := h.rpc(sb)
	run := func(t *testing.T, cmd string, envs map[string]string) (pid uint32, stdout, stderr string, end *procpb.ProcessEvent_EndEvent) {
		t.Helper()
		s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Envs: envs}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for s.Receive() {
			switch e := s.Msg().GetEvent(); {
			case e.GetStart() != nil:
				if end != nil || stdout != "" {
					t.Fatal("start came after output")
				}
				pid = e.GetStart().GetPid()
			case e.GetData() != nil:
				stdout += string(e.GetData().GetStdout())
				stderr += string(e.GetData().GetStderr())
			case e.GetEnd() != nil:
				end = e.GetEnd()
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Run("exit code", func(t *testing.T) {
		pid, out, _, end := run(t, "echo hi && exit 3", nil)
		if pid == 0 || out != "hi\n" || end == nil || end.GetExitCode() != 3 {
			t.Fatalf("got pid %d stdout %q end %v", pid, out, end)
		}
	})
	t.Run("envs", func(t *testing.T) {
		_, out, errOut, end := run(t, `echo "$GREETING $WHO" >&2; pwd`, map[string]string{"WHO": "world"})
		if end.GetExitCode() != 0 || errOut != "hello world\n" || out != "/home/user\n" {
			t.Fatalf("got stdout %q stderr %q end %v", out, errOut, end)
		}
	})
	t.Run("no network", func(t *testing.T) {
		_, _, errOut, end := run(t, "python3 -c \"import urllib.request; urllib.request.urlopen('http://1.1.1.1', timeout=5)\"", nil)
		if end.GetExitCode() == 0 {
			t.Fatalf("a network call succeeded in the jail: %v %q", end, errOut)
		}
	})
	t.Run("output streams while the command runs", func(t *testing.T) {
		// As for runCode: each line waits for the test's acknowledgement.
		s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash",
			Args: []string{"-l", "-c", "for i in 0 1 2; do echo $i; while [ ! -e cmdack$i ]; do sleep 0.05; done; done"}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var lines []string
		var end *procpb.ProcessEvent_EndEvent
		for s.Receive() {
			if d := s.Msg().GetEvent().GetData(); d != nil {
				lines = append(lines, string(d.GetStdout()))
				upload(t, h, sb, map[string][]byte{fmt.Sprintf("cmdack%d", len(lines)-1): nil})
			}
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if want := []string{"0\n", "1\n", "2\n"}; !slices.Equal(lines, want) || end == nil || end.GetExitCode() != 0 {
			t.Fatalf("got %q, end %v; want %q and exit code 0 (err %v)", lines, end, want, s.Err())
		}
	})
	t.Run("a command does not hold the sandbox; kill ends it; the kernel keeps its state", func(t *testing.T) {
		h.execute(t, sb, map[string]any{"code": "kept = 1"})
		s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash",
			Args: []string{"-l", "-c", "echo started; while [ ! -e go ]; do sleep 0.05; done; echo went; sleep 600"}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var pid uint32
		for pid == 0 && s.Receive() {
			pid = s.Msg().GetEvent().GetStart().GetPid()
		}
		// runCode while the command runs: the command waits for its file.
		if _, lines := h.execute(t, sb, map[string]any{"code": "open('go', 'w').close()\nkept"}); len(find(lines, "result")) != 1 {
			t.Fatalf("runCode while a command runs: %v", lines)
		}
		// commands.connect attaches to it; commands.list shows it.
		cs, err := proc.Connect(t.Context(), connect.NewRequest(&procpb.ConnectRequest{Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: pid}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect: first event %v, want the start of %d (%v)", cs.Msg(), pid, cs.Err())
		}
		l, err := proc.List(t.Context(), connect.NewRequest(&procpb.ListRequest{}))
		if err != nil || len(l.Msg.GetProcesses()) != 1 || l.Msg.GetProcesses()[0].GetPid() != pid {
			t.Fatalf("list: got %v, %v; want pid %d", l, err, pid)
		}
		var out string
		for !strings.Contains(out, "went") && s.Receive() {
			out += string(s.Msg().GetEvent().GetData().GetStdout())
		}
		if _, err := proc.SendSignal(t.Context(), connect.NewRequest(&procpb.SendSignalRequest{Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: pid}},
			Signal: procpb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		for _, st := range []interface {
			Receive() bool
			Err() error
		}{s, cs} {
			var end *procpb.ProcessEvent_EndEvent
			for st.Receive() {
				switch m := st.(type) {
				case *connect.ServerStreamForClient[procpb.StartResponse]:
					end = m.Msg().GetEvent().GetEnd()
				case *connect.ServerStreamForClient[procpb.ConnectResponse]:
					end = m.Msg().GetEvent().GetEnd()
				}
			}
			if end == nil || end.GetExited() || end.GetStatus() != "signal: killed" || end.GetExitCode() == 0 {
				t.Errorf("the killed command's end: got %v (%v), want signal: killed", end, st.Err())
			}
		}
		if _, lines := h.execute(t, sb, map[string]any{"code": "kept"}); len(find(lines, "result")) != 1 || find(lines, "result")[0]["text"] != "1" {
			t.Fatalf("kept after the kill: %v", lines)
		}
		_, _, cel := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
		if !strings.Contains(string(cel), "started in the background") || !strings.Contains(string(cel), "the command was killed before it ended") {
			t.Errorf("the command's start and end are not journaled:\n%s", cel)
		}
	})
	sel := func(pid uint32) *procpb.ProcessSelector {
		return &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: pid}}
	}
	// start starts a command and returns its stream after the start event.
	start := func(t *testing.T, req *procpb.StartRequest) (*connect.ServerStreamForClient[procpb.StartResponse], uint32) {
		t.Helper()
		s, err := proc.Start(t.Context(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
			t.Fatalf("first event %v, want the start (%v)", s.Msg(), s.Err())
		}
		return s, s.Msg().GetEvent().GetStart().GetPid()
	}
	// drain reads a command's stream to its end: stdout (or the terminal's
	// output) and the end event.
	drain := func(s *connect.ServerStreamForClient[procpb.StartResponse]) (out string, end *procpb.ProcessEvent_EndEvent) {
		for s.Receive() {
			e := s.Msg().GetEvent()
			out += string(e.GetData().GetStdout()) + string(e.GetData().GetPty())
			if e.GetEnd() != nil {
				end = e.GetEnd()
			}
		}
		return out, end
	}
	t.Run("stdin: sendStdin, closeStdin; the pid is the process's own", func(t *testing.T) {
		s, pid := start(t, &procpb.StartRequest{Stdin: ptr(true), Process: &procpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "cat"}}})
		// The pid is the command's in the sandbox: another command sees it.
		if _, out, _, end := run(t, fmt.Sprintf("tr '\\0' ' ' < /proc/%d/cmdline", pid), nil); end.GetExitCode() != 0 || !strings.Contains(out, "cat") {
			t.Fatalf("/proc/%d/cmdline: %q %v, want the command's (bash -l -c cat)", pid, out, end)
		}
		for _, in := range []string{"Hello, ", "World!\n", "!@#$%^&*()_+"} {
			if _, err := proc.SendInput(t.Context(), connect.NewRequest(&procpb.SendInputRequest{Process: sel(pid),
				Input: &procpb.ProcessInput{Input: &procpb.ProcessInput_Stdin{Stdin: []byte(in)}}})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := proc.CloseStdin(t.Context(), connect.NewRequest(&procpb.CloseStdinRequest{Process: sel(pid)})); err != nil {
			t.Fatal(err)
		}
		out, end := drain(s)
		if out != "Hello, World!\n!@#$%^&*()_+" || end == nil || end.GetExitCode() != 0 {
			t.Fatalf("cat got %q, end %v (%v)", out, end, s.Err())
		}
		if _, err := proc.SendInput(t.Context(), connect.NewRequest(&procpb.SendInputRequest{Process: sel(pid),
			Input: &procpb.ProcessInput{Input: &procpb.ProcessInput_Stdin{Stdin: []byte("late")}}})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("stdin to an ended command: got %v, want not_found", err)
		}
		_, _, cel := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
		if !strings.Contains(string(cel), "sent 26 bytes in 3 writes") || !strings.Contains(string(cel), "stdin closed") {
			t.Errorf("the input sent is not in the command's end step:\n%s", cel)
		}
	})
	t.Run("a command without stdin takes none", func(t *testing.T) {
		s, pid := start(t, &procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "cat; echo done"}}})
		if _, err := proc.SendInput(t.Context(), connect.NewRequest(&procpb.SendInputRequest{Process: sel(pid),
			Input: &procpb.ProcessInput{Input: &procpb.ProcessInput_Stdin{Stdin: []byte("x")}}})); err != nil && codeOf(err) != connect.CodeInvalidArgument && codeOf(err) != connect.CodeNotFound {
			t.Fatalf("stdin to a command without it: got %v, want invalid_argument (or not_found once it ended)", err)
		}
		if out, end := drain(s); out != "done\n" || end.GetExitCode() != 0 {
			t.Fatalf("got %q %v: cat should read an empty stdin", out, end)
		}
	})
	t.Run("pty: create, sendInput, resize, kill", func(t *testing.T) {
		pty := func(t *testing.T) (*connect.ServerStreamForClient[procpb.StartResponse], uint32) {
			return start(t, &procpb.StartRequest{Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 80, Rows: 24}},
				Process: &procpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color", "ABC": "123"}}})
		}
		typeIn := func(pid uint32, text string) {
			if _, err := proc.SendInput(t.Context(), connect.NewRequest(&procpb.SendInputRequest{Process: sel(pid),
				Input: &procpb.ProcessInput{Input: &procpb.ProcessInput_Pty{Pty: []byte(text)}}})); err != nil {
				t.Fatal(err)
			}
		}
		s, pid := pty(t)
		typeIn(pid, "tty; echo $ABC; tput cols\nexit\n")
		out, end := drain(s)
		if !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "123") || !strings.Contains(out, "80") || end == nil || end.GetExitCode() != 0 {
			t.Fatalf("the terminal's output %q, end %v (%v)", out, end, s.Err())
		}
		s, pid = pty(t)
		if _, err := proc.Update(t.Context(), connect.NewRequest(&procpb.UpdateRequest{Process: sel(pid), Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 100, Rows: 24}}})); err != nil {
			t.Fatal(err)
		}
		typeIn(pid, "tput cols\nexit\n")
		if out, end := drain(s); !strings.Contains(out, "100") || end.GetExitCode() != 0 {
			t.Fatalf("after resize: %q %v", out, end)
		}
		_, pid = pty(t)
		if _, err := proc.SendSignal(t.Context(), connect.NewRequest(&procpb.SendSignalRequest{Process: sel(pid), Signal: procpb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		// Killing answers once it is gone.
		if _, _, _, end := run(t, fmt.Sprintf("kill -0 %d", pid), nil); end.GetExitCode() == 0 {
			t.Fatalf("kill -0 %d: the killed terminal's shell is still there", pid)
		}
	})
	t.Run("a timeout is deadline_exceeded (the SDK's TimeoutError)", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		s, err := proc.Start(ctx, connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "sleep 600"}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for s.Receive() {
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				t.Fatalf("got an end %v, want deadline_exceeded", e)
			}
		}
		if codeOf(s.Err()) != connect.CodeDeadlineExceeded {
			t.Fatalf("got %v, want deadline_exceeded", s.Err())
		}
	})
	t.Run("unknown pid", func(t *testing.T) {
		if _, err := proc.SendSignal(t.Context(), connect.NewRequest(&procpb.SendSignalRequest{Process: sel(999999)})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("kill unknown pid: got %v, want not_found (the SDK returns false)", err)
		}
		if _, err := proc.SendInput(t.Context(), connect.NewRequest(&procpb.SendInputRequest{Process: sel(999999)})); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("stdin to an unknown pid: got %v, want not_found", err)
		}
	})
}

// TestLifecycle: past its timeout a sandbox's kernel stops and its files
// stay, verified by hash; connect resumes it with a fresh kernel over them;
// a restarted server knows its sandboxes.
func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	// The cell runs first, then the timeout is cut to a second: a sandbox
	// paused during a runCode breaks that call off (as E2B's does), and a
	// loaded machine can take longer than a second to start the kernel.
	sb := h.create(t, map[string]any{"timeout": 300})
	data := []byte("kept across the timeout")
	upload(t, h, sb, map[string][]byte{"keep.txt": data})
	if st, lines := h.execute(t, sb, map[string]any{"code": "y = 1"}); st != 200 || len(find(lines, "end_of_execution")) != 1 {
		t.Fatalf("y = 1: got %d %v", st, lines)
	}
	if st, b := h.control(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/timeout", map[string]any{"timeout": 1}); st != 204 {
		t.Fatalf("setTimeout 1: got %d %s", st, b)
	}

	waitState(t, h, sb, "paused")
	if st, _, b := h.do(t, http.MethodGet, "/files?path=keep.txt", envd(sb), nil); st != 502 {
		t.Fatalf("data plane of a paused sandbox: got %d %s, want 502", st, b)
	}
	if st, _, _ := h.do(t, http.MethodGet, "/health", envd(sb), nil); st != 502 {
		t.Fatalf("health of a paused sandbox: got %d, want 502", st)
	}

	// A restarted surface over the same store knows the sandbox, and a
	// damaged record (written straight into the store's records: no tool
	// reaches them) costs only itself.
	if err := metarecords.New(h.stack.Store.Meta()).Put(t.Context(), runid.Must("r-broken"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	h.e2b.Close()
	h2 := serve(t, h.stack)
	st, b := h2.control(t, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300})
	var c sandbox
	json.Unmarshal(b, &c)
	if st != 201 || c.EnvdAccessToken == "" {
		t.Fatalf("connect to a paused sandbox: got %d %s, want 201", st, b)
	}
	sb.EnvdAccessToken = c.EnvdAccessToken
	st, _, got := h2.do(t, http.MethodGet, "/files?path=keep.txt", envd(sb), nil)
	if st != 200 || sum(got) != sum(data) {
		t.Fatalf("file after resume: got %d %q, want sha256 %s", st, got, sum(data))
	}
	_, lines := h2.execute(t, sb, map[string]any{"code": "open('keep.txt').read(), 'y' in globals()"})
	if r := find(lines, "result"); len(r) != 1 || r[0]["text"] != "('kept across the timeout', False)" {
		t.Fatalf("fresh kernel over the same files: %v", lines)
	}
}

func waitState(t *testing.T, h *harness, sb sandbox, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for {
		st, b := h.control(t, http.MethodGet, "/sandboxes/"+sb.SandboxID, nil)
		var d map[string]any
		json.Unmarshal(b, &d)
		if st == 200 && d["state"] == state {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox never became %s: last %d %s", state, st, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestAuthorize: the control plane's X-API-Key decides who the caller is
// (Triad's keys plug in through Config.Authorize): a refused key is E2B's
// 401; a sandbox belongs to its creator's tenant, and another tenant
// neither lists nor finds it.
func TestAuthorize(t *testing.T) {
	st := orchestratortest.New(t, orchestratortest.Options{})
	tenants := map[string]auth.Principal{
		"trd_a": {KeyID: "a", Tenant: "tenant-a", Scopes: []auth.Scope{auth.Runs}},
		"trd_b": {KeyID: "b", Tenant: "tenant-b", Scopes: []auth.Scope{auth.Runs}},
	}
	e, err := e2b.New(t.Context(), e2b.Config{Core: st.Orch, Records: metarecords.New(st.Store.Meta()),
		Authorize: func(r *http.Request) (auth.Principal, bool) {
			p, ok := tenants[r.Header.Get(e2b.HeaderAPIKey)]
			return p, ok
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	srv := httptest.NewServer(e.Handler(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	h := &harness{url: srv.URL}
	for _, key := range []string{"trd_bad", ""} {
		if st, _, b := h.do(t, http.MethodGet, "/v2/sandboxes", map[string]string{"X-API-Key": key}, nil); st != 401 {
			t.Errorf("key %q: got %d %s, want 401", key, st, b)
		}
	}
	code, _, b := h.do(t, http.MethodPost, "/sandboxes", map[string]string{"X-API-Key": "trd_a", "Content-Type": "application/json"}, strings.NewReader(`{"templateID": "base"}`))
	if code != 201 {
		t.Fatalf("create as tenant-a: %d %s", code, b)
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(b, &sb)
	for key, want := range map[string]int{"trd_a": 200, "trd_b": 404} {
		if code, _, b := h.do(t, http.MethodGet, "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": key}, nil); code != want {
			t.Errorf("getInfo as %s: got %d %s, want %d", key, code, b, want)
		}
		_, _, b := h.do(t, http.MethodGet, "/v2/sandboxes", map[string]string{"X-API-Key": key}, nil)
		if listed := strings.Contains(string(b), sb.SandboxID); listed != (want == 200) {
			t.Errorf("list as %s: listed=%v, want %v", key, listed, want == 200)
		}
	}
	if code, _, b := h.do(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": "trd_b"}, nil); code != 404 {
		t.Errorf("kill as tenant-b: got %d %s, want 404", code, b)
	}
}

func ptr[T any](v T) *T { return &v }
