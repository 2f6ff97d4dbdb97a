package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/triadhq/triad/tmpfs/tmpfstest"
)

// putFile streams body to path in run and returns the blob's sha256.
func (s *server) putFile(run, path, body string) string {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, s.url+"/tmp/files/"+path, strings.NewReader(body))
	req.Header.Set("X-Run-Id", run)
	resp, err := s.do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var ref struct {
		SHA256 string `json:"sha256"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &ref) != nil {
		s.t.Fatalf("PUT %s: %d %s", path, resp.StatusCode, b)
	}
	return ref.SHA256
}

// flipBlob changes one byte of a local blob file in place.
func flipBlob(t *testing.T, data, sha string) {
	t.Helper()
	tmpfstest.FlipFileByte(t, filepath.Join(data, "store", "blobs", "sha256", sha[:2], sha), 3)
}

// corruptAnswer checks that a GET answers 500 corrupt, with a suggestion.
func (s *server) corruptAnswer(path, run string) string {
	s.t.Helper()
	resp := s.get(path, run)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Kind, Message, Suggestion string } `json:"error"`
	}
	if resp.StatusCode != 500 || json.Unmarshal(b, &e) != nil || e.Error.Kind != "corrupt" || e.Error.Suggestion == "" {
		s.t.Fatalf("GET %s: got %d %s, want 500 corrupt with a suggestion", path, resp.StatusCode, b)
	}
	return e.Error.Message
}

// triad fsck, run beside a server on its data directory, finds a flipped
// byte, quarantines the blob, lists every run and path that held it and
// exits 1; the server never serves the bytes again; a second fsck finds
// nothing.
func TestFsckCommand(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	s := launch(t, bin, data, "--sandbox", "none", "--auth", "none")
	const body = "region,revenue\nnorth,120\nsouth,80\n"
	sha := s.putFile("r-fsck-a", "in/sales.csv", body)
	if got := s.putFile("r-fsck-b", "copy.csv", body); got != sha {
		t.Fatalf("the same bytes got %s and %s", sha, got)
	}
	s.putFile("r-fsck-a", "fine.txt", "untouched")
	flipBlob(t, data, sha)

	cmd := exec.Command(bin, "fsck", "--data", data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("triad fsck: got %v, want exit status 1\n%s%s", err, out, stderr.String())
	}
	for _, want := range []string{"BAD " + sha, "quarantined", "run r-fsck-a path in/sales.csv", "run r-fsck-b path copy.csv", "1 bad"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("triad fsck printed:\n%s\nwant %q in it", out, want)
		}
	}
	q := filepath.Join(data, "store", "quarantine", "sha256", sha)
	if _, err := os.Stat(q); err != nil {
		t.Fatalf("quarantined blob: %v", err)
	}
	if report, err := os.ReadFile(q + ".json"); err != nil || !strings.Contains(string(report), "r-fsck-b") {
		t.Fatalf("quarantine report: %s, %v, want it to name r-fsck-b", report, err)
	}

	if msg := s.corruptAnswer("/tmp/files/in/sales.csv", "r-fsck-a"); !strings.Contains(msg, "quarantined") {
		t.Fatalf("message %q, want it to say quarantined", msg)
	}
	s.corruptAnswer("/tmp/files/copy.csv", "r-fsck-b")
	s.corruptAnswer("/blobs/"+sha, "r-fsck-b")
	if resp := s.get("/tmp/files/fine.txt", "r-fsck-a"); resp.StatusCode != 200 {
		t.Fatalf("the good file: %d", resp.StatusCode)
	}

	out, err = exec.Command(bin, "fsck", "--data", data).Output()
	if err != nil || !strings.Contains(string(out), "0 bad") {
		t.Fatalf("second triad fsck: %v\n%s", err, out)
	}
}

// triad fsck checks the journal too: CEL.md grows by appends, stored as
// versions that share one extent, and a byte damaged in it makes every
// version that holds the byte bad. fsck lists the current one with its run
// and path, quarantines it, and the server answers corrupt for CEL.md from
// then on. (The server is stopped for the damage, so that no append is in
// flight while the byte is flipped; fsck beside a running server is
// TestAppendAfterOtherProcessQuarantined in tmpfs/local.)
func TestFsckJournal(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	s := launch(t, bin, data, "--sandbox", "none", "--auth", "none")
	const run = "r-fsck-journal"
	for i := range 3 {
		s.putFile(run, fmt.Sprintf("notes/%d.md", i), fmt.Sprintf("# note %d\n", i))
	}
	resp := s.get("/tmp/read?path=CEL.md", run)
	var cel struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || json.Unmarshal(b, &cel) != nil || cel.Size < 100 {
		t.Fatalf("tmp.read CEL.md: %d %s", resp.StatusCode, b)
	}
	ref, err := os.ReadFile(filepath.Join(data, "store", "extents", "refs", cel.SHA256[:2], cel.SHA256))
	var where struct {
		Extent string `json:"extent"`
	}
	if err != nil || json.Unmarshal(ref, &where) != nil {
		t.Fatalf("CEL.md's ref: %s, %v, want CEL.md stored as an appended blob", ref, err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
	tmpfstest.FlipFileByte(t, filepath.Join(data, "store", "extents", where.Extent), cel.Size-5)

	out, err := exec.Command(bin, "fsck", "--data", data).Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("triad fsck: got %v, want exit status 1\n%s", err, out)
	}
	if want := "BAD " + cel.SHA256; !strings.Contains(string(out), want) || !strings.Contains(string(out), "run "+run+" path CEL.md") {
		t.Fatalf("triad fsck printed:\n%s\nwant %q with run %s path CEL.md", out, want, run)
	}
	s = launch(t, bin, data, "--sandbox", "none", "--auth", "none")
	if msg := s.corruptAnswer("/tmp/files/CEL.md", run); !strings.Contains(msg, "quarantined") {
		t.Fatalf("message %q, want it to say quarantined", msg)
	}
	if out, err := exec.Command(bin, "fsck", "--data", data).Output(); err != nil || !strings.Contains(string(out), "0 bad") {
		t.Fatalf("second triad fsck: %v\n%s", err, out)
	}
}

// triad serve --scrub-rate finds a flipped byte on its own and
// quarantines the blob; a bad rate is refused at startup.
func TestScrubRate(t *testing.T) {
	bin := buildTriad(t)
	data := t.TempDir()
	s := launch(t, bin, data, "--sandbox", "none", "--auth", "none")
	sha := s.putFile("r-scrub", "notes.md", "# findings\nthe scrub reads this\n")
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
	flipBlob(t, data, sha)

	if out, err := exec.Command(bin, "serve", "--data", data, "--sandbox", "none", "--scrub-rate", "fast").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--scrub-rate") {
		t.Fatalf("serve --scrub-rate fast: got %v\n%s, want it refused naming the flag", err, out)
	}

	s = launch(t, bin, data, "--sandbox", "none", "--auth", "none", "--scrub-rate", "64MiB")
	q := filepath.Join(data, "store", "quarantine", "sha256", sha)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(q); err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Signal(syscall.SIGTERM)
			s.cmd.Wait()
			t.Fatalf("the scrub did not quarantine the blob; server log:\n%s", s.logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.corruptAnswer("/tmp/files/notes.md", "r-scrub")
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait() // the log is complete, and read by no one else
	if !strings.Contains(s.logs.String(), "blob failed verification") {
		t.Fatalf("server log does not report the bad blob:\n%s", s.logs)
	}
}
