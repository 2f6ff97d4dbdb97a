package api_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// A blob damaged behind the store's back is never served: ranges, HEAD
// and (on local disk, where the file is checked before a byte is sent)
// whole reads answer 500 corrupt with a suggestion; a whole S3 read, which
// verifies as it streams, breaks off before the end. Once fsck has
// quarantined it, every read answers corrupt, by path and by hash, and
// writing the same bytes again restores it.
func TestCorruptBlobIsRefused(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			c := newServer(t, store, orchestrator.Limits{})
			run := "r-corrupt-" + b.name
			data := make([]byte, 3<<20)
			rand.Read(data)
			a := c.do(http.MethodPut, "/tmp/files/c.bin", run, bytes.NewReader(data))
			if a.status != 200 {
				t.Fatalf("PUT: got %d %s", a.status, a.body)
			}
			var ref wire.FileRef
			a.json(t, &ref)
			if a := c.do(http.MethodGet, "/tmp/files/c.bin", run, nil); a.status != 200 || !bytes.Equal(a.body, data) {
				t.Fatalf("GET before damage: got %d, %d bytes", a.status, len(a.body))
			}
			b.corrupt(t, ref.SHA256)

			corrupt := func(what string, a answer) {
				t.Helper()
				if a.status != 500 || a.errKind(t) != "corrupt" {
					t.Fatalf("%s: got %d %s, want 500 corrupt", what, a.status, a.body)
				}
			}
			corrupt("range", c.do(http.MethodGet, "/tmp/files/c.bin", run, nil, "Range", "bytes=0-99"))
			corrupt("range by hash", c.do(http.MethodGet, "/blobs/"+ref.SHA256.String(), run, nil, "Range", "bytes=100-199"))
			if a := c.do(http.MethodHead, "/tmp/files/c.bin", run, nil); a.status != 500 {
				t.Fatalf("HEAD: got %d, want 500", a.status)
			}
			if b.name == "local" {
				corrupt("GET", c.do(http.MethodGet, "/tmp/files/c.bin", run, nil))
			} else if got, err := rawGet(c, "/tmp/files/c.bin", run); err == nil || len(got) >= len(data) {
				t.Fatalf("GET of a damaged S3 blob: got %d of %d bytes (equal %v), %v, want the transfer cut short", len(got), len(data), bytes.Equal(got, data), err)
			}

			rep, err := store.Fsck(t.Context(), tmpfs.FsckOptions{})
			if err != nil || len(rep.Bad) != 1 || !rep.Bad[0].Quarantined || rep.Bad[0].SHA256 != ref.SHA256 {
				t.Fatalf("fsck: got %+v, %v, want the blob quarantined", rep, err)
			}
			a = c.do(http.MethodGet, "/tmp/files/c.bin", run, nil)
			corrupt("GET after quarantine", a)
			if !strings.Contains(string(a.body), "quarantined") {
				t.Fatalf("GET after quarantine: got %s, want a message that says quarantined", a.body)
			}
			corrupt("GET by hash after quarantine", c.do(http.MethodGet, "/blobs/"+ref.SHA256.String(), run, nil))
			corrupt("tmp.read after quarantine", c.do(http.MethodGet, "/tmp/read?path=c.bin", run, nil))
			if a := c.do(http.MethodHead, "/tmp/files/c.bin", run, nil); a.status != 500 {
				t.Fatalf("HEAD after quarantine: got %d, want 500", a.status)
			}

			if a := c.do(http.MethodPut, "/tmp/files/again.bin", run, bytes.NewReader(data)); a.status != 200 {
				t.Fatalf("PUT again: got %d %s", a.status, a.body)
			}
			if a := c.do(http.MethodGet, "/tmp/files/c.bin", run, nil); a.status != 200 || !bytes.Equal(a.body, data) {
				t.Fatalf("GET after the bytes were written again: got %d, %d bytes", a.status, len(a.body))
			}
			if a := c.do(http.MethodGet, "/tmp/files/c.bin", run, nil, "Range", "bytes=10-19"); a.status != 206 || !bytes.Equal(a.body, data[10:20]) {
				t.Fatalf("range after the bytes were written again: got %d %q", a.status, a.body)
			}
		})
	}
}

// rawGet reads a download to its end or its failure, which c.do would
// treat as fatal.
func rawGet(c *client, path, run string) ([]byte, error) {
	req, _ := http.NewRequest(http.MethodGet, c.url+path, nil)
	req.Header.Set(api.RunHeader, run)
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
