package api_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/tmpfstest"
	"github.com/triadhq/triad/wire"
)

// backend opens stores over one persistent backing; each call is a
// "restart": a fresh Store (and, for S3, an empty local directory).
type backend struct {
	name string
	open func(t *testing.T) *tmpfs.Store
	// blobCount counts stored blobs, to prove deduplication.
	blobCount func(t *testing.T) int
	// stop and start take the store's engine down and up (S3 only).
	stop, start func()
	// corrupt flips a byte of blob d's stored bytes behind the store's
	// back, keeping their size.
	corrupt func(t *testing.T, d tmpfs.Digest)
}

func localBackend(t *testing.T) backend {
	dir := t.TempDir()
	return backend{
		name: "local",
		open: func(t *testing.T) *tmpfs.Store {
			b, err := local.NewBlobs(dir)
			if err != nil {
				t.Fatal(err)
			}
			x, err := local.NewIndex(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { x.Close() })
			return tmpfs.New(b, x, nil)
		},
		blobCount: func(t *testing.T) int {
			n := 0
			filepath.WalkDir(filepath.Join(dir, "blobs"), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					n++
				}
				return nil
			})
			return n
		},
		corrupt: func(t *testing.T, d tmpfs.Digest) {
			tmpfstest.FlipFileByte(t, filepath.Join(dir, "blobs", "sha256", d.String()[:2], d.String()), 7)
		},
	}
}

// backends lists the store backends every API test runs against.
func backends(t *testing.T) []backend {
	return append([]backend{localBackend(t)}, extraBackends(t)...)
}

// extraBackends is extended by files that add backends (S3).
var extraBackends = func(t *testing.T) []backend { return nil }

func newServer(t *testing.T, store *tmpfs.Store, limits orchestrator.Limits) *client {
	t.Helper()
	orch := orchestrator.New(orchestrator.Config{Store: store, Limits: limits})
	return apiServer(t, api.Config{Orchestrator: orch})
}

type answer struct {
	status int
	body   []byte
	header http.Header
}

func (a answer) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
}

// errKind returns the structured error's kind, failing if the body isn't one.
func (a answer) errKind(t testing.TB) string {
	t.Helper()
	var e wire.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Kind == "" || e.Error.Message == "" || e.Error.Suggestion == "" {
		t.Fatalf("got body %s, want {error:{kind,message,suggestion}}", a.body)
	}
	return string(e.Error.Kind)
}

func (c *client) post(path, run string, v any) answer {
	c.t.Helper()
	b, _ := json.Marshal(v)
	return c.do(http.MethodPost, path, run, bytes.NewReader(b))
}

func (c *client) write(run, path, text string) wire.FileRef {
	c.t.Helper()
	a := c.post("/tmp/write", run, map[string]string{"path": path, "text": text})
	if a.status != 200 {
		c.t.Fatalf("write %s: got %d %s", path, a.status, a.body)
	}
	var f wire.FileRef
	a.json(c.t, &f)
	return f
}

func (c *client) list(run, prefix string) []wire.FileInfo {
	c.t.Helper()
	a := c.do(http.MethodGet, "/tmp/list?prefix="+prefix, run, nil)
	if a.status != 200 {
		c.t.Fatalf("list: got %d %s", a.status, a.body)
	}
	var out wire.ListResponse
	a.json(c.t, &out)
	return out.Files
}

func TestRoundTrip(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newServer(t, b.open(t), orchestrator.Limits{})
			run := "r-roundtrip-" + b.name
			f := c.write(run, "data/kpis.csv", "channel,cac\nads,12.5\n")
			if f.Path != "data/kpis.csv" || f.Size != 21 || f.SHA256 != tmpfs.DigestOf([]byte("channel,cac\nads,12.5\n")) {
				t.Fatalf("write: got %+v", f)
			}
			bin := []byte{0xff, 0x00, 0xfe, 'x'}
			a := c.post("/tmp/write", run, map[string]string{"path": "bin/blob", "bytes_b64": base64.StdEncoding.EncodeToString(bin)})
			if a.status != 200 {
				t.Fatalf("binary write: got %d %s", a.status, a.body)
			}
			var rd wire.ReadResponse
			c.do(http.MethodGet, "/tmp/read?path=data/kpis.csv", run, nil).json(t, &rd)
			if rd.Text == nil || *rd.Text != "channel,cac\nads,12.5\n" || rd.BytesB64 != nil || rd.SHA256 != f.SHA256 {
				t.Fatalf("read text: got %+v", rd)
			}
			rd = wire.ReadResponse{}
			c.do(http.MethodGet, "/tmp/read?path=bin/blob", run, nil).json(t, &rd)
			if rd.BytesB64 == nil || *rd.BytesB64 != base64.StdEncoding.EncodeToString(bin) || rd.Text != nil {
				t.Fatalf("read binary: got %+v", rd)
			}
			files := c.list(run, "data/")
			if len(files) != 1 || files[0].Path != "data/kpis.csv" || files[0].SHA256 != f.SHA256 || files[0].ModifiedAt.IsZero() {
				t.Fatalf("list: got %+v", files)
			}
			if all := c.list(run, ""); len(all) != 2 {
				t.Fatalf("list all: got %d files, want 2", len(all))
			}
			a = c.post("/tmp/delete", run, map[string]string{"path": "data/kpis.csv"})
			if a.status != 200 || !strings.Contains(string(a.body), `"ok":true`) {
				t.Fatalf("delete: got %d %s", a.status, a.body)
			}
			a = c.do(http.MethodGet, "/tmp/read?path=data/kpis.csv", run, nil)
			if a.status != 404 || a.errKind(t) != "not_found" {
				t.Fatalf("read after delete: got %d %s, want 404 not_found", a.status, a.body)
			}
			// Raw file download with Content-Type, ETag and Range.
			c.write(run, "report.html", "<h1>hi</h1>")
			a = c.do(http.MethodGet, "/tmp/files/report.html", run, nil)
			if a.status != 200 || string(a.body) != "<h1>hi</h1>" || !strings.HasPrefix(a.header.Get("Content-Type"), "text/html") ||
				a.header.Get("ETag") != `"`+tmpfs.DigestOf([]byte("<h1>hi</h1>")).String()+`"` {
				t.Fatalf("GET /tmp/files: got %d %q %v", a.status, a.body, a.header)
			}
			a = c.do(http.MethodGet, "/tmp/files/report.html", run, nil, "Range", "bytes=1-2")
			if a.status != http.StatusPartialContent || string(a.body) != "h1" {
				t.Fatalf("range: got %d %q, want 206 \"h1\"", a.status, a.body)
			}
		})
	}
}

// A 50 MiB streamed upload hashes to what sha256sum says, downloads intact by
// hash (whole and by range), is stored once across runs, and survives a restart.
func TestStreamedUploadDedupAndRestart(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Fatal("sha256sum (coreutils) is needed to check the upload's hash independently")
	}
	data := make([]byte, 50<<20)
	rand.Read(data)
	file := filepath.Join(t.TempDir(), "upload.bin")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sha256sum", file).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(string(out))[0]
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newServer(t, b.open(t), orchestrator.Limits{})
			before := b.blobCount(t)
			var refs []wire.FileRef
			for _, run := range []string{"r-up-a-" + b.name, "r-up-b-" + b.name} {
				f, _ := os.Open(file)
				a := c.do(http.MethodPut, "/tmp/files/uploads/big.bin", run, f)
				f.Close()
				if a.status != 200 {
					t.Fatalf("PUT: got %d %s", a.status, a.body)
				}
				var ref wire.FileRef
				a.json(t, &ref)
				refs = append(refs, ref)
			}
			if refs[0].SHA256.String() != want || refs[1].SHA256.String() != want || refs[0].Size != int64(len(data)) {
				t.Fatalf("got %+v, want sha256 %s (sha256sum) and size %d", refs, want, len(data))
			}
			if got := b.blobCount(t) - before; got != 1 {
				t.Fatalf("the same 50 MiB in two runs made %d new blobs, want 1", got)
			}
			a := c.do(http.MethodGet, "/blobs/"+want, "r-up-a-"+b.name, nil)
			if a.status != 200 || !bytes.Equal(a.body, data) {
				t.Fatalf("GET /blobs: got %d, %d bytes, equal=%v", a.status, len(a.body), bytes.Equal(a.body, data))
			}
			if a.header.Get("ETag") != `"`+want+`"` || !strings.Contains(a.header.Get("Cache-Control"), "immutable") {
				t.Fatalf("GET /blobs headers: %v", a.header)
			}
			a = c.do(http.MethodGet, "/blobs/"+want, "r-up-b-"+b.name, nil, "Range", "bytes=1000-1999")
			if a.status != 206 || !bytes.Equal(a.body, data[1000:2000]) {
				t.Fatalf("ranged /blobs: got %d, %d bytes", a.status, len(a.body))
			}
			a = c.do(http.MethodHead, "/blobs/"+want, "r-up-a-"+b.name, nil)
			if a.status != 200 || a.header.Get("Content-Length") != fmt.Sprint(len(data)) {
				t.Fatalf("HEAD /blobs: got %d %v", a.status, a.header)
			}
			// Restart: a new server over the same backing sees everything.
			c2 := newServer(t, b.open(t), orchestrator.Limits{})
			files := c2.list("r-up-a-"+b.name, "uploads/")
			if len(files) != 1 || files[0].SHA256.String() != want {
				t.Fatalf("after restart: got %+v", files)
			}
			a = c2.do(http.MethodGet, "/tmp/files/uploads/big.bin", "r-up-b-"+b.name, nil)
			if a.status != 200 || !bytes.Equal(a.body, data) {
				t.Fatalf("after restart GET: got %d, %d bytes", a.status, len(a.body))
			}
		})
	}
}

func TestBadInputs(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{JSONBody: 1 << 10, StreamBody: 4 << 10})
	const run = "r-bad"
	c.write(run, "kept.txt", "still here")
	cases := []struct {
		name   string
		do     func() answer
		status int
		kind   string
	}{
		{"dotdot", func() answer { return c.post("/tmp/write", run, map[string]string{"path": "../x", "text": "x"}) }, 400, "bad_input"},
		{"absolute", func() answer { return c.post("/tmp/write", run, map[string]string{"path": "/etc/passwd", "text": "x"}) }, 400, "bad_input"},
		{"inner dotdot", func() answer { return c.post("/tmp/write", run, map[string]string{"path": "a/../../b", "text": "x"}) }, 400, "bad_input"},
		{"NUL", func() answer { return c.post("/tmp/write", run, map[string]string{"path": "a\x00b", "text": "x"}) }, 400, "bad_input"},
		{"read dotdot", func() answer { return c.do("GET", "/tmp/read?path=../../etc/passwd", run, nil) }, 400, "bad_input"},
		{"read absolute", func() answer { return c.do("GET", "/tmp/read?path=/etc/passwd", run, nil) }, 400, "bad_input"},
		{"raw get dotdot", func() answer { return c.do("GET", "/tmp/files/a/../../b", run, nil) }, 400, "bad_input"},
		{"raw put NUL", func() answer { return c.do("PUT", "/tmp/files/a%00b", run, strings.NewReader("x")) }, 400, "bad_input"},
		{"delete dotdot", func() answer { return c.post("/tmp/delete", run, map[string]string{"path": "../kept.txt"}) }, 400, "bad_input"},
		{"list dotdot", func() answer { return c.do("GET", "/tmp/list?prefix=../", run, nil) }, 400, "bad_input"},
		{"missing run", func() answer { return c.post("/tmp/write", "", map[string]string{"path": "x", "text": "x"}) }, 400, "missing_run_id"},
		{"invalid run", func() answer { return c.post("/tmp/write", "r/../../x", map[string]string{"path": "x", "text": "x"}) }, 400, "invalid_run_id"},
		{"long run", func() answer { return c.do("GET", "/tmp/list", strings.Repeat("a", 65), nil) }, 400, "invalid_run_id"},
		{"bad base64", func() answer {
			return c.post("/tmp/write", run, map[string]string{"path": "x", "bytes_b64": "not base64!"})
		}, 400, "bad_input"},
		{"text and bytes", func() answer {
			return c.post("/tmp/write", run, map[string]string{"path": "x", "text": "a", "bytes_b64": "YQ=="})
		}, 400, "bad_input"},
		{"neither", func() answer { return c.post("/tmp/write", run, map[string]string{"path": "x"}) }, 400, "bad_input"},
		{"not json", func() answer { return c.do("POST", "/tmp/write", run, strings.NewReader("{nope")) }, 400, "bad_input"},
		{"unknown field", func() answer {
			return c.post("/tmp/write", run, map[string]string{"path": "x", "text": "a", "mode": "0777"})
		}, 400, "bad_input"},
		{"oversize json", func() answer {
			return c.post("/tmp/write", run, map[string]string{"path": "x", "text": strings.Repeat("a", 4<<10)})
		}, 413, "too_large"},
		{"oversize stream", func() answer { return c.do("PUT", "/tmp/files/big", run, bytes.NewReader(make([]byte, 5<<10))) }, 413, "too_large"},
		{"oversize chunked stream", func() answer {
			return c.do("PUT", "/tmp/files/big", run, io.MultiReader(strings.NewReader(strings.Repeat("a", 5<<10))))
		}, 413, "too_large"},
		{"malformed hash", func() answer { return c.do("GET", "/blobs/abc123", "", nil) }, 400, "bad_input"},
		{"unknown hash", func() answer { return c.do("GET", "/blobs/"+strings.Repeat("ab", 32), "", nil) }, 404, "not_found"},
		{"read missing", func() answer { return c.do("GET", "/tmp/read?path=nope.txt", run, nil) }, 404, "not_found"},
		{"read without path", func() answer { return c.do("GET", "/tmp/read", run, nil) }, 400, "bad_input"},
		{"unknown route", func() answer { return c.do("GET", "/nope", run, nil) }, 404, "not_found"},
		{"wrong method", func() answer { return c.do("DELETE", "/tmp/list", run, nil) }, 405, "method_not_allowed"},
		{"file over dir", func() answer {
			c.write(run, "dir/child.txt", "x")
			return c.post("/tmp/write", run, map[string]string{"path": "dir", "text": "x"})
		}, 409, "conflict"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.do()
			if a.status != tc.status {
				t.Fatalf("got %d %s, want %d", a.status, a.body, tc.status)
			}
			if got := a.errKind(t); got != tc.kind {
				t.Fatalf("got kind %s, want %s", got, tc.kind)
			}
		})
	}
	// The service is still up and nothing was lost.
	if files := c.list(run, ""); len(files) != 2 {
		t.Fatalf("after bad inputs: got %+v, want kept.txt and dir/child.txt", files)
	}
	if a := c.do("GET", "/healthz", "", nil); a.status != 200 {
		t.Fatalf("healthz after bad inputs: %d", a.status)
	}
}

// Run A's files are invisible to run B through every endpoint.
func TestRunIsolation(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newServer(t, b.open(t), orchestrator.Limits{})
			c.write("run-a", "secret.txt", "a's secret")
			for name, a := range map[string]answer{
				"read":     c.do("GET", "/tmp/read?path=secret.txt", "run-b", nil),
				"raw get":  c.do("GET", "/tmp/files/secret.txt", "run-b", nil),
				"raw head": c.do("HEAD", "/tmp/files/secret.txt", "run-b", nil),
				"delete":   c.post("/tmp/delete", "run-b", map[string]string{"path": "secret.txt"}),
			} {
				if a.status != 404 {
					t.Errorf("%s from run-b: got %d %s, want 404", name, a.status, a.body)
				}
			}
			if files := c.list("run-b", ""); len(files) != 0 {
				t.Errorf("list from run-b: got %+v, want none", files)
			}
			// And run A still has it.
			if files := c.list("run-a", ""); len(files) != 1 {
				t.Errorf("run-a lost its file: %+v", files)
			}
		})
	}
}

func TestHealthAndVersion(t *testing.T) {
	c := newServer(t, localBackend(t).open(t), orchestrator.Limits{})
	if a := c.do("GET", "/healthz", "", nil); a.status != 200 {
		t.Fatalf("healthz: %d %s", a.status, a.body)
	}
	var v map[string]string
	c.do("GET", "/version", "", nil).json(t, &v)
	if v["version"] == "" {
		t.Fatalf("version: got %v", v)
	}
	var r struct {
		RunID string `json:"run_id"`
	}
	a := c.do("POST", "/runs", "", nil)
	a.json(t, &r)
	if a.status != 201 || !strings.HasPrefix(r.RunID, "r-") {
		t.Fatalf("POST /runs: got %d %s", a.status, a.body)
	}
	// The fresh id is usable.
	c.write(r.RunID, "x.txt", "x")
}
