package api_test

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// A snapshot keeps a run's files by reference and never changes; a fork
// of the run or of the snapshot is a run of the caller's whose first step
// says where it came from and that kernel memory is not kept. Another
// tenant gets 404 for both; bad input gets the error body.
func TestSnapshotAndFork(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	a := apiServer(t, api.Config{Orchestrator: s.Orch, Keys: s.Keys})
	b := a.as(a.newKey("globex", auth.Runs))
	const run = "r-fork-source"
	src := a.write(run, "data/a.csv", "x\n1\n")
	if ex, ans := a.exec(run, map[string]any{"code": "v = 41\nopen('b.txt','w').write('from a cell')"}); ans.status != 200 || !ex.OK {
		t.Fatalf("exec: %d %s", ans.status, ans.body)
	}

	// The snapshot: a step of the source's journal.
	var sn wire.Snapshot
	if ans := a.post("/runs/"+run+"/snapshots", "", map[string]any{"name": "before-change"}); ans.status != 201 {
		t.Fatalf("snapshot: got %d %s, want 201", ans.status, ans.body)
	} else {
		ans.json(t, &sn)
	}
	if sn.Of != run || sn.Files != 2 || sn.MemoryKept || sn.Step != 3 || sn.Name != "before-change" {
		t.Errorf("snapshot: got %+v, want 2 files of %s at step 3, memory not kept", sn, run)
	}
	cel := string(a.do("GET", "/cel", run, nil).body)
	if !strings.Contains(cel, "run.snapshot") || !strings.Contains(cel, "Kernel memory is not kept") {
		t.Errorf("the source's journal does not record the snapshot and what it does not keep:\n%s", cel)
	}
	// The source moves on; the snapshot does not.
	a.write(run, "data/a.csv", "x\n2\n")
	// A snapshot takes no tool call.
	wantErr(t, a.post("/tmp/write", sn.ID, map[string]string{"path": "c.txt", "text": "no"}), 409, "conflict")

	for _, tc := range []struct {
		from, want string
		step       int
	}{{run, "x\n2\n", 4}, {sn.ID, "x\n1\n", 0}} {
		var f wire.Fork
		if ans := a.do("POST", "/runs/"+tc.from+"/fork", "", nil); ans.status != 201 {
			t.Fatalf("fork %s: got %d %s, want 201", tc.from, ans.status, ans.body)
		} else {
			ans.json(t, &f)
		}
		if f.From != tc.from || f.Files != 2 || f.MemoryKept || f.Step != tc.step {
			t.Errorf("fork of %s: got %+v, want 2 files at step %d", tc.from, f, tc.step)
		}
		var rd wire.ReadResponse
		a.do("GET", "/tmp/read?path=data/a.csv", f.RunID, nil).json(t, &rd)
		if rd.Text == nil || *rd.Text != tc.want {
			t.Errorf("fork of %s: data/a.csv is %v, want %q", tc.from, rd.Text, tc.want)
		}
		if tc.from == sn.ID && rd.SHA256 != src.SHA256 {
			t.Errorf("fork of the snapshot: data/a.csv is blob %s, want the source's %s (no bytes copied)", rd.SHA256, src.SHA256)
		}
		// The kernel is fresh: the source's variable is not there; its file is.
		ex, _ := a.exec(f.RunID, map[string]any{"code": "print(open('b.txt').read()); print('v' in globals())"})
		if !ex.OK || !strings.Contains(ex.Stdout, "from a cell\nFalse") {
			t.Errorf("fork of %s: a cell got %+v, want the file and no variable", tc.from, ex)
		}
		var v wire.RunView
		a.do("GET", "/runs/"+f.RunID, "", nil).json(t, &v)
		if len(v.Steps) == 0 || v.Steps[0].Tool != "run.fork" {
			t.Errorf("fork of %s: first step %+v, want run.fork", tc.from, v.Steps)
		}
		cel := string(a.do("GET", "/cel", f.RunID, nil).body)
		if !strings.Contains(cel, "Forked from") || !strings.Contains(cel, "Kernel memory is not kept") {
			t.Errorf("fork of %s: its journal does not say where it came from and what it did not keep:\n%s", tc.from, cel)
		}
	}

	// Another tenant: not found, for the run and for the snapshot.
	for _, from := range []string{run, sn.ID} {
		wantErr(t, b.do("POST", "/runs/"+from+"/fork", "", nil), 404, "not_found")
		wantErr(t, b.do("POST", "/runs/"+from+"/snapshots", "", nil), 404, "not_found")
	}
	// Bad input.
	wantErr(t, a.post("/runs/"+run+"/snapshots", "", map[string]any{"name": "no spaces"}), 400, "bad_input")
	wantErr(t, a.post("/runs/"+run+"/fork", "", map[string]any{"run_id": "../x"}), 400, "invalid_run_id")
	wantErr(t, a.post("/runs/"+run+"/fork", "", map[string]any{"run_id": run}), 409, "conflict")
	wantErr(t, a.post("/runs/"+run+"/fork", "", map[string]any{"run_id": sn.ID}), 409, "conflict")
	wantErr(t, a.do("POST", "/runs/r-nothing-here/fork", "", nil), 404, "not_found")
	raw := a.do("POST", "/runs/"+run+"/fork", "", strings.NewReader("{"), "Content-Type", "application/json")
	wantErr(t, raw, 400, "bad_input")
}
