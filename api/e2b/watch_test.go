package e2b_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/triadhq/triad/api/e2b"
	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	procpb "github.com/triadhq/triad/api/e2b/envd/process"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
)

// newLightHarness is a stack without Docker: the wasm backend's kernels,
// enough for files, watches and signed links.
func newLightHarness(t *testing.T) *harness {
	t.Helper()
	return serve(t, orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"}))
}

// watchEvent is one event as the test compares it.
type watchEvent struct {
	name string
	typ  fspb.EventType
}

// watchStream opens files.watchDir and hands its events to a channel; the
// start event has arrived when it returns.
func watchStream(t *testing.T, fs interface {
	WatchDir(context.Context, *connect.Request[fspb.WatchDirRequest]) (*connect.ServerStreamForClient[fspb.WatchDirResponse], error)
}, req *fspb.WatchDirRequest) (<-chan *fspb.FilesystemEvent, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s, err := fs.WatchDir(ctx, connect.NewRequest(req))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		cancel()
		t.Fatalf("watchDir: no start event: %v", s.Err())
	}
	ch := make(chan *fspb.FilesystemEvent, 1024)
	done := make(chan error, 1)
	go func() {
		defer close(ch)
		for s.Receive() {
			if e := s.Msg().GetFilesystem(); e != nil {
				ch <- e
			}
		}
		done <- s.Err()
	}()
	t.Cleanup(cancel)
	return ch, func() error { return <-done }
}

// await reads events until want is seen; the stream's end fails the test.
func await(t *testing.T, ch <-chan *fspb.FilesystemEvent, want watchEvent) *fspb.FilesystemEvent {
	t.Helper()
	var seen []watchEvent
	for e := range ch {
		got := watchEvent{e.GetName(), e.GetType()}
		if got == want {
			return e
		}
		seen = append(seen, got)
	}
	t.Fatalf("the watch ended before %v; saw %v", want, seen)
	return nil
}

func TestWatchDir(t *testing.T) {
	h := newLightHarness(t)
	sb := h.create(t, nil)
	fs, _ := h.rpc(sb)
	ctx := t.Context()
	upload(t, h, sb, map[string][]byte{"w/a.txt": []byte("one"), "w/sub/b.txt": []byte("bee"), "other/c.txt": []byte("c")})

	t.Run("files.write, tmp.write and PUT /tmp/files are seen", func(t *testing.T) {
		ch, _ := watchStream(t, fs, &fspb.WatchDirRequest{Path: "w", IncludeEntry: true})
		upload(t, h, sb, map[string][]byte{"w/a.txt": []byte("two")})
		e := await(t, ch, watchEvent{"a.txt", fspb.EventType_EVENT_TYPE_WRITE})
		if e.GetEntry().GetPath() != "/home/user/w/a.txt" || e.GetEntry().GetSize() != 3 || e.GetEntry().GetType() != fspb.FileType_FILE_TYPE_FILE {
			t.Errorf("entry: got %v", e.GetEntry())
		}
		body, _ := json.Marshal(map[string]any{"path": "w/new.txt", "text": "made by tmp.write"})
		if st, _, b := h.do(t, http.MethodPost, "/tmp/write", map[string]string{"X-Run-Id": sb.SandboxID, "Content-Type": "application/json"}, bytes.NewReader(body)); st != 200 {
			t.Fatalf("tmp.write: got %d %s", st, b)
		}
		await(t, ch, watchEvent{"new.txt", fspb.EventType_EVENT_TYPE_CREATE})
		await(t, ch, watchEvent{"new.txt", fspb.EventType_EVENT_TYPE_WRITE})
		if st, _, b := h.do(t, http.MethodPut, "/tmp/files/w/put.bin", map[string]string{"X-Run-Id": sb.SandboxID}, strings.NewReader("streamed")); st != 200 {
			t.Fatalf("PUT /tmp/files: got %d %s", st, b)
		}
		await(t, ch, watchEvent{"put.bin", fspb.EventType_EVENT_TYPE_CREATE})
		if _, err := fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "w/new.txt"})); err != nil {
			t.Fatal(err)
		}
		await(t, ch, watchEvent{"new.txt", fspb.EventType_EVENT_TYPE_REMOVE})
		if _, err := fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "w/put.bin", Destination: "w/moved.bin"})); err != nil {
			t.Fatal(err)
		}
		await(t, ch, watchEvent{"moved.bin", fspb.EventType_EVENT_TYPE_CREATE})
	})

	t.Run("not recursive: a subdirectory's files are not seen, its creation is", func(t *testing.T) {
		ch, _ := watchStream(t, fs, &fspb.WatchDirRequest{Path: "/home/user/w"})
		upload(t, h, sb, map[string][]byte{"w/sub/b.txt": []byte("changed"), "w/sub2/d.txt": []byte("d")})
		upload(t, h, sb, map[string][]byte{"w/zz-marker": []byte("m")})
		var got []watchEvent
		for e := range ch {
			got = append(got, watchEvent{e.GetName(), e.GetType()})
			if e.GetName() == "zz-marker" && e.GetType() == fspb.EventType_EVENT_TYPE_WRITE {
				break
			}
		}
		want := []watchEvent{{"zz-marker", fspb.EventType_EVENT_TYPE_CREATE}, {"zz-marker", fspb.EventType_EVENT_TYPE_WRITE}, {"sub2", fspb.EventType_EVENT_TYPE_CREATE}}
		sortEvents(got)
		sortEvents(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("got %v, want %v (one poll)", got, want)
		}
	})

	t.Run("recursive: names are relative to the watched directory", func(t *testing.T) {
		ch, _ := watchStream(t, fs, &fspb.WatchDirRequest{Path: "w", Recursive: true})
		if _, err := fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "w/deep/er"})); err != nil {
			t.Fatal(err)
		}
		await(t, ch, watchEvent{"deep", fspb.EventType_EVENT_TYPE_CREATE})
		upload(t, h, sb, map[string][]byte{"w/deep/er/f.txt": []byte("f")})
		await(t, ch, watchEvent{"deep/er/f.txt", fspb.EventType_EVENT_TYPE_WRITE})
	})

	t.Run("polling watcher", func(t *testing.T) {
		res, err := fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "other", Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		id := res.Msg.GetWatcherId()
		upload(t, h, sb, map[string][]byte{"other/c.txt": []byte("c2")})
		var got []*fspb.FilesystemEvent
		for len(got) == 0 {
			ev, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil {
				t.Fatal(err)
			}
			got = ev.Msg.GetEvents()
		}
		if got[0].GetName() != "c.txt" || got[0].GetType() != fspb.EventType_EVENT_TYPE_WRITE {
			t.Fatalf("got %v, want c.txt WRITE", got)
		}
		if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
			t.Fatal(err)
		}
		_, err = fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if codeOf(err) != connect.CodeNotFound {
			t.Fatalf("events of a removed watcher: got %v, want not_found", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			want connect.Code
		}{
			{"missing", connect.CodeNotFound},
			{"w/a.txt", connect.CodeInvalidArgument},
			{"/etc", connect.CodeInvalidArgument},
			{"../x", connect.CodeInvalidArgument},
		} {
			s, err := fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: tc.path}))
			if err == nil {
				s.Receive()
				err = s.Err()
			}
			if codeOf(err) != tc.want {
				t.Errorf("watch %q: got %v, want %v", tc.path, err, tc.want)
			}
			_, err = fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: tc.path}))
			if codeOf(err) != tc.want {
				t.Errorf("createWatcher %q: got %v, want %v", tc.path, err, tc.want)
			}
		}
		for _, id := range []string{"", "wnope"} {
			if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); codeOf(err) != connect.CodeNotFound {
				t.Errorf("events of %q: got %v, want not_found", id, err)
			}
			if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); codeOf(err) != connect.CodeNotFound {
				t.Errorf("remove %q: got %v, want not_found", id, err)
			}
		}
	})

	t.Run("another sandbox's watcher and token", func(t *testing.T) {
		other := h.create(t, nil)
		ofs, _ := h.rpc(other)
		res, err := fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "w"}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ofs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: res.Msg.GetWatcherId()})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("another sandbox read this one's watcher: got %v, want not_found", err)
		}
		// This sandbox's id with the other's token: the same 502 as any
		// data-plane call.
		hdr := envd(sb)
		hdr["X-Access-Token"] = other.EnvdAccessToken
		hdr["Content-Type"] = "application/json"
		st, _, b := h.do(t, http.MethodPost, "/filesystem.Filesystem/CreateWatcher", hdr, strings.NewReader(`{"path":"w"}`))
		if st != http.StatusBadGateway {
			t.Errorf("a foreign token: got %d %s, want 502", st, b)
		}
	})

	t.Run("the watch is journaled once, its polls are not", func(t *testing.T) {
		before := celSteps(t, h, sb)
		ch, _ := watchStream(t, fs, &fspb.WatchDirRequest{Path: "w"})
		upload(t, h, sb, map[string][]byte{"w/journaled.txt": []byte("j")})
		// The event proves the watcher polled after the write.
		await(t, ch, watchEvent{"journaled.txt", fspb.EventType_EVENT_TYPE_CREATE})
		after := celSteps(t, h, sb)
		if after != before+2 {
			t.Fatalf("CEL.md steps: got %d, want %d (the watch's tmp.list and the write)", after, before+2)
		}
	})

	t.Run("kill ends the stream with an error", func(t *testing.T) {
		ch, end := watchStream(t, fs, &fspb.WatchDirRequest{Path: "w"})
		if st, b := h.control(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, nil); st != http.StatusNoContent {
			t.Fatalf("kill: got %d %s", st, b)
		}
		for range ch {
		}
		if err := end(); codeOf(err) != connect.CodeUnavailable {
			t.Fatalf("the stream ended with %v, want unavailable", err)
		}
	})
}

// celSteps counts the Step Blocks in the run's journal.
func celSteps(t *testing.T, h *harness, sb sandbox) int {
	t.Helper()
	st, _, b := h.do(t, http.MethodGet, "/cel", map[string]string{"X-Run-Id": sb.SandboxID}, nil)
	if st != 200 {
		t.Fatalf("GET /cel: got %d %s", st, b)
	}
	return strings.Count(string(b), "\n## Step ")
}

// sortEvents orders events as fmt prints them, to compare two sets.
func sortEvents(s []watchEvent) {
	slices.SortFunc(s, func(a, b watchEvent) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
}

// TestWatchCommand: a command still running is seen writing, before its
// call ends and is harvested.
func TestWatchCommand(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, nil)
	fs, proc := h.rpc(sb)
	if _, err := fs.MakeDir(t.Context(), connect.NewRequest(&fspb.MakeDirRequest{Path: "out"})); err != nil {
		t.Fatal(err)
	}
	ch, _ := watchStream(t, fs, &fspb.WatchDirRequest{Path: "out"})
	// The command writes, then waits for the test to say it saw the write.
	s, err := proc.Start(t.Context(), connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/bash",
		Args: []string{"-l", "-c", "echo running > out/progress.txt; while [ ! -e seen ]; do sleep 0.05; done; rm out/progress.txt"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	await(t, ch, watchEvent{"progress.txt", fspb.EventType_EVENT_TYPE_CREATE})
	upload(t, h, sb, map[string][]byte{"seen": nil})
	await(t, ch, watchEvent{"progress.txt", fspb.EventType_EVENT_TYPE_REMOVE})
	for s.Receive() {
	}
	// A cell's write is seen too.
	if st, lines := h.execute(t, sb, map[string]any{"code": "open('out/cell.txt', 'w').write('from a cell')"}); st != 200 || len(find(lines, "error")) > 0 {
		t.Fatalf("runCode: got %d %v", st, lines)
	}
	await(t, ch, watchEvent{"cell.txt", fspb.EventType_EVENT_TYPE_CREATE})
}

// sign is the SDK's getSignature, written again from its source.
func sign(path, op, user, token string, exp *int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != nil {
		raw += ":" + strconv.FormatInt(*exp, 10)
	}
	s := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(s[:]), "=")
}

func TestSignedURLs(t *testing.T) {
	h := newLightHarness(t)
	sb := h.create(t, map[string]any{"secure": true})
	other := h.create(t, nil)
	upload(t, h, sb, map[string][]byte{"hello.txt": []byte("hello world")})
	upload(t, h, other, map[string][]byte{"hello.txt": []byte("other's")})
	link := func(method, path, user, token string, exp *int64) string {
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		op := "read"
		if method == http.MethodPost {
			op = "write"
		}
		q.Set("signature", sign(path, op, user, token, exp))
		if exp != nil {
			q.Set("signature_expiration", strconv.FormatInt(*exp, 10))
		}
		return "/files?" + q.Encode()
	}
	future, past := time.Now().Unix()+86400, time.Now().Unix()-86400

	t.Run("download without the sandbox's id", func(t *testing.T) {
		for _, exp := range []*int64{nil, &future} {
			st, _, b := h.do(t, http.MethodGet, link(http.MethodGet, "hello.txt", "", sb.EnvdAccessToken, exp), nil, nil)
			if st != 200 || string(b) != "hello world" {
				t.Fatalf("got %d %q, want 200 hello world", st, b)
			}
		}
		// The other sandbox's token signs for the other sandbox.
		st, _, b := h.do(t, http.MethodGet, link(http.MethodGet, "hello.txt", "user", other.EnvdAccessToken, nil), nil, nil)
		if st != 200 || string(b) != "other's" {
			t.Fatalf("got %d %q, want the other sandbox's file", st, b)
		}
	})

	t.Run("upload", func(t *testing.T) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		fw, _ := mw.CreateFormField("file")
		fw.Write([]byte("file content"))
		mw.Close()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.url+link(http.MethodPost, "up.txt", "", sb.EnvdAccessToken, &future), &buf)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("got %d, want 200", res.StatusCode)
		}
		st, _, b := h.do(t, http.MethodGet, "/files?path=up.txt", envd(sb), nil)
		if st != 200 || string(b) != "file content" {
			t.Fatalf("read back: got %d %q", st, b)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		readSig := link(http.MethodGet, "hello.txt", "", sb.EnvdAccessToken, nil)
		for _, tc := range []struct {
			name, method, path string
			hdr                map[string]string
			status             int
			body               string
		}{
			{"expired", http.MethodGet, link(http.MethodGet, "hello.txt", "", sb.EnvdAccessToken, &past), nil, 401, `{"code":401,"message":"signature is already expired"}`},
			{"forged", http.MethodGet, "/files?path=hello.txt&signature=v1_forged", nil, 401, `{"code":401,"message":"invalid signature"}`},
			{"forged and expired", http.MethodGet, "/files?path=hello.txt&signature=v1_forged&signature_expiration=" + strconv.FormatInt(past, 10), nil, 401, `{"code":401,"message":"invalid signature"}`},
			{"another path", http.MethodGet, strings.Replace(readSig, "hello.txt", "other.txt", 1), nil, 401, `{"code":401,"message":"invalid signature"}`},
			{"a read link used to write", http.MethodPost, readSig, map[string]string{"Content-Type": "application/octet-stream"}, 401, `{"code":401,"message":"invalid signature"}`},
			{"another user", http.MethodGet, readSig + "&username=root", nil, 401, `{"code":401,"message":"invalid signature"}`},
			{"a bad expiry", http.MethodGet, "/files?path=hello.txt&signature=v1_x&signature_expiration=soon", nil, 400, ""},
			{"this sandbox's id, the other's signature", http.MethodGet, link(http.MethodGet, "hello.txt", "", other.EnvdAccessToken, nil),
				map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}, 502, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st, _, b := h.do(t, tc.method, tc.path, tc.hdr, nil)
				if st != tc.status {
					t.Fatalf("got %d %s, want %d", st, b, tc.status)
				}
				if tc.body != "" && strings.TrimSpace(string(b)) != tc.body {
					t.Fatalf("got %s, want %s", b, tc.body)
				}
				if tc.body == "" {
					var eb errBody
					if json.Unmarshal(b, &eb) != nil || eb.Error.Kind == "" || eb.Error.Suggestion == "" {
						t.Fatalf("got %s, want Triad's error body", b)
					}
				}
			})
		}
	})

	t.Run("a killed sandbox's links are dead", func(t *testing.T) {
		if st, b := h.control(t, http.MethodDelete, "/sandboxes/"+other.SandboxID, nil); st != http.StatusNoContent {
			t.Fatalf("kill: got %d %s", st, b)
		}
		st, _, b := h.do(t, http.MethodGet, link(http.MethodGet, "hello.txt", "", other.EnvdAccessToken, nil), nil, nil)
		if st != 401 {
			t.Fatalf("got %d %s, want 401", st, b)
		}
	})
}

func TestFileMetadata(t *testing.T) {
	h := newLightHarness(t)
	sb := h.create(t, nil)
	if sb.EnvdVersion != e2b.EnvdVersion || e2b.EnvdVersion != "0.6.4" {
		t.Fatalf("envdVersion: got %q (const %q), want 0.6.4", sb.EnvdVersion, e2b.EnvdVersion)
	}
	fs, _ := h.rpc(sb)
	ctx := t.Context()
	write := func(t *testing.T, p, body string, meta map[string]string) (int, string) {
		t.Helper()
		hdr := envd(sb)
		hdr["Content-Type"] = "application/octet-stream"
		for k, v := range meta {
			hdr["X-Metadata-"+k] = v
		}
		st, _, b := h.do(t, http.MethodPost, "/files?path="+url.QueryEscape(p), hdr, strings.NewReader(body))
		return st, string(b)
	}
	statMeta := func(t *testing.T, p string) map[string]string {
		t.Helper()
		res, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: p}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetEntry().GetMetadata()
	}

	t.Run("written, shown by write, getInfo, list and rename", func(t *testing.T) {
		st, b := write(t, "d/m.txt", "x", map[string]string{"Author": "mish", "purpose": "up load"})
		if st != 200 || !strings.Contains(b, `"metadata":{"author":"mish","purpose":"up load"}`) {
			t.Fatalf("write: got %d %s", st, b)
		}
		if got := statMeta(t, "d/m.txt"); fmt.Sprint(got) != "map[author:mish purpose:up load]" {
			t.Fatalf("getInfo: got %v", got)
		}
		l, err := fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "d"}))
		if err != nil || len(l.Msg.GetEntries()) != 1 || l.Msg.GetEntries()[0].GetMetadata()["author"] != "mish" {
			t.Fatalf("list: got %v %v", l, err)
		}
		mv, err := fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "d/m.txt", Destination: "e/m.txt"}))
		if err != nil || mv.Msg.GetEntry().GetMetadata()["author"] != "mish" || statMeta(t, "e/m.txt")["purpose"] != "up load" {
			t.Fatalf("rename: got %v %v", mv, err)
		}
	})

	t.Run("overwritten bytes have none", func(t *testing.T) {
		write(t, "o.txt", "first", map[string]string{"author": "mish"})
		if st, b := write(t, "o.txt", "second", nil); st != 200 || strings.Contains(b, "metadata") {
			t.Fatalf("overwrite: got %d %s", st, b)
		}
		if got := statMeta(t, "o.txt"); len(got) != 0 {
			t.Fatalf("after overwrite: got %v, want none", got)
		}
		// A write from Triad's own API changes the bytes: the metadata
		// was the old bytes'.
		write(t, "t.txt", "first", map[string]string{"author": "mish"})
		if st, _, b := h.do(t, http.MethodPut, "/tmp/files/t.txt", map[string]string{"X-Run-Id": sb.SandboxID}, strings.NewReader("by tmp")); st != 200 {
			t.Fatalf("PUT: got %d %s", st, b)
		}
		if got := statMeta(t, "t.txt"); len(got) != 0 {
			t.Fatalf("after tmp.write: got %v, want none", got)
		}
	})

	t.Run("removed with its file", func(t *testing.T) {
		write(t, "r.txt", "same", map[string]string{"k": "v"})
		if _, err := fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "r.txt"})); err != nil {
			t.Fatal(err)
		}
		if st, _, b := h.do(t, http.MethodPut, "/tmp/files/r.txt", map[string]string{"X-Run-Id": sb.SandboxID}, strings.NewReader("same")); st != 200 {
			t.Fatalf("PUT: got %d %s", st, b)
		}
		if got := statMeta(t, "r.txt"); len(got) != 0 {
			t.Fatalf("a removed file's metadata came back: %v", got)
		}
	})

	t.Run("bad metadata is a 400, and writes nothing", func(t *testing.T) {
		// (A key that is no HTTP token cannot be sent at all.)
		for _, meta := range []map[string]string{{"k": "caf\u00e9"}, {"k": "tab\there"}} {
			st, b := write(t, "bad.txt", "x", meta)
			var eb errBody
			if st != 400 || json.Unmarshal([]byte(b), &eb) != nil || eb.Error.Suggestion == "" {
				t.Errorf("%v: got %d %s, want 400 with a suggestion", meta, st, b)
			}
		}
		if st, _, _ := h.do(t, http.MethodGet, "/files?path=bad.txt", envd(sb), nil); st != 404 {
			t.Fatalf("a refused write left a file: got %d", st)
		}
	})

	t.Run("bounded", func(t *testing.T) {
		big := strings.Repeat("v", 8000)
		var st int
		var b string
		for i := 0; i < 40 && st != 429; i++ {
			st, b = write(t, fmt.Sprintf("big/%d.txt", i), "x", map[string]string{"k": big, "k2": big, "k3": big, "k4": big})
		}
		var eb errBody
		if st != 429 || json.Unmarshal([]byte(b), &eb) != nil || eb.Error.Kind != "quota" {
			t.Fatalf("got %d %s, want 429 quota once the sandbox's metadata is full", st, b)
		}
	})
}
