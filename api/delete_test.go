package api_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// deleteServer serves store with a core the test can run keeper passes
// on, share links wired into deletions as triad serve wires them, and
// hook (if set) as one more deletion hook.
func deleteServer(t *testing.T, store *tmpfs.Store, hook orchestrator.DeleteHook) (*client, *orchestrator.Orchestrator) {
	t.Helper()
	orch := orchestrator.New(orchestrator.Config{Store: store})
	sh, err := share.Open(context.Background(), store.Meta(), share.Config{})
	if err != nil {
		t.Fatal(err)
	}
	orch.OnDelete(sh.RevokeRun)
	if hook != nil {
		orch.OnDelete(hook)
	}
	return apiServer(t, api.Config{Orchestrator: orch, Keys: keys.New(store.Meta(), keys.Config{}), Shares: sh}), orch
}

// DELETE /runs/{id}: only the run's tenant may (another's is not found, a
// read-only key is forbidden); afterwards the run answers 404 on every
// route, its id is never a run again, its share links are gone, and the
// next collection removes the blobs only it held, while a blob another
// run of the tenant and a run of another tenant hold stays.
func TestDeleteRunAndCollect(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			c, orch := deleteServer(t, store, nil)
			other := c.as(c.newKey("globex", auth.Runs))
			reader := c.as(c.newKey("acme", auth.Read))
			runA, runB, runG := "r-del-a-"+b.name, "r-del-b-"+b.name, "r-del-g-"+b.name
			only := c.write(runA, "only.txt", "only run A holds these bytes "+b.name)
			shared := c.write(runA, "shared.txt", "bytes three runs hold "+b.name)
			c.write(runB, "shared.txt", "bytes three runs hold "+b.name)
			other.write(runG, "shared.txt", "bytes three runs hold "+b.name)
			var link wire.Share
			if a := c.post("/runs/"+runA+"/share", "", map[string]any{"path": "only.txt"}); a.status != 201 {
				t.Fatalf("share: %d %s", a.status, a.body)
			} else {
				a.json(t, &link)
			}
			linkPath := link.URL[strings.Index(link.URL, "/share/"):]
			if a := c.as("").do("GET", linkPath, "", nil); a.status != 200 {
				t.Fatalf("share link before: %d %s", a.status, a.body)
			}

			for name, tc := range map[string]struct {
				c      *client
				path   string
				status int
				kind   string
			}{
				"another tenant": {other, "/runs/" + runA, 404, "not_found"},
				"read-only key":  {reader, "/runs/" + runA, 403, "forbidden"},
				"no such run":    {c, "/runs/r-never-made", 404, "not_found"},
				"bad id":         {c, "/runs/bad%20id", 400, ""},
			} {
				a := tc.c.do(http.MethodDelete, tc.path, "", nil)
				if a.status != tc.status || tc.kind != "" && a.errKind(t) != tc.kind {
					t.Errorf("%s: got %d %s, want %d %s", name, a.status, a.body, tc.status, tc.kind)
				}
			}
			if a := c.do(http.MethodDelete, "/runs/"+runA, "", nil); a.status != 200 {
				t.Fatalf("delete: %d %s", a.status, a.body)
			}
			for name, a := range map[string]answer{
				"GET /runs/{id}":       c.do("GET", "/runs/"+runA, "", nil),
				"GET /runs/{id}/files": c.do("GET", "/runs/"+runA+"/files", "", nil),
				"GET /tmp/files":       c.do("GET", "/tmp/files/only.txt", runA, nil),
				"tmp.write":            c.post("/tmp/write", runA, map[string]string{"path": "again.txt", "text": "x"}),
				"PUT /tmp/files":       c.do(http.MethodPut, "/tmp/files/again.txt", runA, strings.NewReader("x")),
				"GET /blobs":           c.do("GET", "/blobs/"+only.SHA256.String(), runA, nil),
				"DELETE again":         c.do(http.MethodDelete, "/runs/"+runA, "", nil),
				"share link":           c.as("").do("GET", linkPath, "", nil),
			} {
				if a.status != 404 {
					t.Errorf("%s after delete: got %d %s, want 404", name, a.status, a.body)
				}
			}
			var list wire.RunList
			c.do("GET", "/runs", "", nil).json(t, &list)
			for _, r := range list.Runs {
				if r.RunID == runA {
					t.Errorf("GET /runs still lists the deleted run: %+v", r)
				}
			}
			if _, err := store.Blobs().Stat(t.Context(), only.SHA256); err != nil {
				t.Fatalf("before the collection the blob is still stored: %v", err)
			}

			rep, err := orch.Keep(t.Context(), orchestrator.KeepConfig{Grace: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Removed == 0 {
				t.Errorf("keeper pass: got %+v, want blobs removed", rep)
			}
			if _, err := store.Blobs().Stat(t.Context(), only.SHA256); !errors.Is(err, tmpfs.ErrNotFound) {
				t.Errorf("the deleted run's own blob: got %v, want not found", err)
			}
			if _, err := store.Blobs().Stat(t.Context(), shared.SHA256); err != nil {
				t.Errorf("the shared blob: got %v, want it kept", err)
			}
			for _, r := range []struct {
				c   *client
				run string
			}{{c, runB}, {other, runG}} {
				if a := r.c.do("GET", "/tmp/files/shared.txt", r.run, nil); a.status != 200 {
					t.Errorf("%s's shared file after the collection: %d %s", r.run, a.status, a.body)
				}
			}
		})
	}
}

// --retain deletes runs whose last activity is older than it, through
// the same deletion; a deletion that stops midway (a crash after the
// run became not found) is finished by the next keeper pass.
func TestRetentionAndInterruptedDelete(t *testing.T) {
	store := localBackend(t).open(t)
	var fail atomic.Bool
	crash := errors.New("crash injected")
	c, orch := deleteServer(t, store, func(ctx context.Context, run runid.ID) error {
		if fail.Load() {
			return crash
		}
		return nil
	})
	old, cut := "r-retain-old", "r-retain-cut"
	c.write(old, "a.txt", "old run")
	c.write(cut, "b.txt", "interrupted")

	fail.Store(true)
	if a := c.do(http.MethodDelete, "/runs/"+cut, "", nil); a.status != 500 {
		t.Fatalf("delete with a crash injected: got %d %s, want 500", a.status, a.body)
	}
	if a := c.do("GET", "/runs/"+cut, "", nil); a.status != 404 {
		t.Errorf("a run whose deletion was interrupted: got %d, want 404", a.status)
	}
	fail.Store(false)

	rep, err := orch.Keep(t.Context(), orchestrator.KeepConfig{Retain: time.Hour, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resumed != 1 || rep.Retired != 0 {
		t.Errorf("a pass with a day's retention: got %+v, want the interrupted deletion finished and nothing retired", rep)
	}
	if files, err := store.List(t.Context(), mustRun(t, cut), ""); err != nil || len(files) != 0 {
		t.Errorf("files of the run whose deletion was finished: got %v, %v, want none", files, err)
	}
	if a := c.do("GET", "/runs/"+old, "", nil); a.status != 200 {
		t.Fatalf("a recent run under retention: got %d, want 200", a.status)
	}

	rep, err = orch.Keep(t.Context(), orchestrator.KeepConfig{Retain: time.Nanosecond, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Retired != 1 || rep.Resumed != 0 {
		t.Errorf("a pass with 1ns retention: got %+v, want the old run retired", rep)
	}
	if a := c.do("GET", "/runs/"+old, "", nil); a.status != 404 {
		t.Errorf("a run past retention: got %d, want 404", a.status)
	}
}

func mustRun(t *testing.T, s string) runid.ID {
	t.Helper()
	id, err := runid.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
