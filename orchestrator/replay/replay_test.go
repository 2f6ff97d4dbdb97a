package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
	"github.com/triadhq/triad/wire"
)

// Cells of the manual session. The first draws from NumPy's global
// generator and Python's random (seeded by Triad's kernel setup) and writes
// a set in hash order (PYTHONHASHSEED); the second reads the search's saved
// answer and draws from a generator seeded with TRIAD_SEED; the third plots,
// to files (PNG, SVG, PDF) and inline (a display image under outputs/).
const (
	cellDraws = `import os, random, numpy as np, pandas as pd
os.makedirs("work", exist_ok=True)
df = pd.read_csv("data/sales.csv")
df["noise"] = np.random.normal(size=len(df)).round(12)
df["pick"] = [random.random() for _ in range(len(df))]
df.to_csv("work/noisy.csv", index=False)
open("work/set.txt", "w").write(",".join({"alpha", "beta", "gamma", "delta", "epsilon"}))
print(df["noise"].sum())`
	cellSources = `import json, os, numpy as np
ans = json.load(open("evidence/search.json"))
os.makedirs("artifacts", exist_ok=True)
open("artifacts/sources.md", "w").write("\n".join(f"- {r['url']}" for r in ans["results"]) + "\n")
rng = np.random.default_rng(TRIAD_SEED)
np.savetxt("artifacts/draws.csv", rng.normal(size=5))
print(len(ans["results"]), os.environ["TRIAD_SEED"], TRIAD_AS_OF, os.environ["SOURCE_DATE_EPOCH"])`
	cellPlot = `import matplotlib.pyplot as plt, pandas as pd
df = pd.read_csv("work/noisy.csv")
fig, ax = plt.subplots(figsize=(4, 3))
ax.plot(df["units"], df["noise"], marker="o")
ax.set_title("units against noise")
for ext in ("png", "svg", "pdf"):
    fig.savefig("artifacts/chart." + ext)
plt.show()`
)

const salesCSV = "month,units\n2025-01,10\n2025-02,12\n2025-03,9\n2025-04,15\n"

// manualSession makes the calls an agent would: tmp.write, three cells, a
// search and a plot.
func manualSession(t testing.TB, o *orchestrator.Orchestrator, run runid.ID) {
	t.Helper()
	ctx := t.Context()
	text := salesCSV
	if _, err := o.Write(ctx, run, wire.WriteRequest{Path: "data/sales.csv", Text: &text}); err != nil {
		t.Fatal(err)
	}
	exec(t, o, run, cellDraws)
	if _, err := o.Search(ctx, run, wire.SearchRequest{Query: "B2B analytics pricing"}, orchestrator.SearchOptions{SaveAs: "evidence/search.json"}); err != nil {
		t.Fatal(err)
	}
	exec(t, o, run, cellSources)
	out := exec(t, o, run, cellPlot)
	if len(out.Display) == 0 {
		t.Fatalf("the plot cell displayed nothing: %+v", out)
	}
}

func exec(t testing.TB, o *orchestrator.Orchestrator, run runid.ID, code string) wire.ExecResponse {
	t.Helper()
	out, err := o.Exec(t.Context(), run, wire.ExecRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	if !out.OK {
		t.Fatalf("cell failed: %+v\n%s", out.Error, code)
	}
	return out
}

// checkIdentical asserts that a replay reproduced every file and that the
// report it wrote in the replay run is the one returned.
func checkIdentical(t *testing.T, o *orchestrator.Orchestrator, rep *wire.ReplayReport, want []string) {
	t.Helper()
	ctx := t.Context()
	var paths []string
	for _, f := range rep.Files {
		paths = append(paths, f.Path)
		if f.Status != wire.ReplayIdentical || f.Original.IsZero() || f.Original != f.Replay {
			t.Errorf("file %s: got %+v, want identical with equal, non-zero hashes", f.Path, f)
		}
	}
	for _, p := range want {
		if !slices.Contains(paths, p) {
			t.Errorf("the report does not compare %s; it compares %v", p, paths)
		}
	}
	if !rep.Identical || rep.Different != 0 || rep.FirstDivergence != 0 || rep.Same != len(rep.Files) {
		t.Errorf("got identical=%v same=%d different=%d first divergence %d, want every file identical; why: %q",
			rep.Identical, rep.Same, rep.Different, rep.FirstDivergence, rep.Why)
	}
	run := runid.Must(rep.RunID)
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := rr.ReadAll(ctx, runfiles.Reproducibility)
	if err != nil {
		t.Fatal(err)
	}
	var stored wire.ReplayReport
	if err := json.Unmarshal(b, &stored); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*rep, stored, cmpopts.EquateComparable(tmpfs.Digest{})); diff != "" {
		t.Errorf("artifacts/reproducibility.json differs from the report returned (-returned +stored):\n%s", diff)
	}
	cel, err := o.Journal(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if got := replayVerdict(t, cel); !strings.HasPrefix(got, "PASS") {
		t.Errorf("the triad.replay step's evaluation: got %q, want PASS", got)
	}
	for _, s := range []string{"- **Replay of:** " + rep.Original, fmt.Sprintf("all %d file(s) it produced are identical", len(rep.Files))} {
		if !strings.Contains(string(cel), s) {
			t.Errorf("the replay's CEL.md lacks %q:\n%s", s, cel)
		}
	}
}

// replayVerdict returns the Evaluation line of the triad.replay Step Block.
func replayVerdict(t *testing.T, cel []byte) string {
	t.Helper()
	_, block, ok := strings.Cut(string(cel), ": triad.replay\n")
	if !ok {
		t.Fatalf("no triad.replay Step Block in\n%s", cel)
	}
	_, line, _ := strings.Cut(block, "**Evaluation (by Evaluator):** ")
	line, _, _ = strings.Cut(line, "\n")
	return line
}

// The manual session replays to identical files on Docker, and a replay
// with another seed changes exactly the seeded files and says why.
func TestManualSession(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Search: true, Warm: 1})
	ctx := t.Context()
	orig := runid.New()
	manualSession(t, s.Orch, orig)

	rep, err := replay.Run(ctx, s.Orch, orig, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkIdentical(t, s.Orch, rep, []string{"data/sales.csv", "work/noisy.csv", "work/set.txt", "evidence/search.json",
		"artifacts/sources.md", "artifacts/draws.csv", "artifacts/chart.png", "artifacts/chart.svg", "artifacts/chart.pdf",
		"outputs/exec-0003-display-1.png"})
	if len(rep.Steps) != 5 {
		t.Errorf("got %d steps, want 5 (a write, three cells, a search)", len(rep.Steps))
	}
	for _, st := range rep.Steps {
		if st.Replay == 0 || st.Diverged || st.Skipped != "" {
			t.Errorf("step %+v: want replayed, not diverged", st)
		}
	}
	if st, _, _ := runSetup(ctx, s.Orch, runid.Must(rep.RunID)); st.Seed != rep.Setup.Original.Seed || st.ReplayOf != orig.String() {
		t.Errorf("replay setup %+v: want the original's seed %d and replay_of %s", st, rep.Setup.Original.Seed, orig)
	}

	seed := rep.Setup.Original.Seed + 1
	other, err := replay.Run(ctx, s.Orch, orig, replay.Options{Seed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, f := range other.Files {
		status[f.Path] = f.Status
	}
	for p, want := range map[string]string{
		"data/sales.csv": wire.ReplayIdentical, "work/set.txt": wire.ReplayIdentical, "evidence/search.json": wire.ReplayIdentical,
		"work/noisy.csv": wire.ReplayDifferent, "artifacts/draws.csv": wire.ReplayDifferent, "artifacts/chart.png": wire.ReplayDifferent,
	} {
		if status[p] != want {
			t.Errorf("with seed %d, %s: got %q, want %q", seed, p, status[p], want)
		}
	}
	if other.Identical || other.FirstDivergence != 2 {
		t.Errorf("got identical=%v first divergence %d, want the first cell (step 2) to diverge", other.Identical, other.FirstDivergence)
	}
	if len(other.Why) == 0 || !strings.Contains(other.Why[0], fmt.Sprintf("seed %d", seed)) {
		t.Errorf("got why %q, want it to name the changed seed", other.Why)
	}
}

// A cell that prints time.time() into a file: the replay reports that file
// different, names the step, and says the cell reads the clock.
func TestDivergenceIsNamed(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	orig := runid.New()
	text := "a,b\n1,2\n"
	if _, err := s.Orch.Write(ctx, orig, wire.WriteRequest{Path: "in.csv", Text: &text}); err != nil {
		t.Fatal(err)
	}
	exec(t, s.Orch, orig, "import random\nopen('fixed.txt', 'w').write(open('in.csv').read().upper() + str(random.random()))")
	exec(t, s.Orch, orig, "import time\nopen('stamp.txt', 'w').write(repr(time.time()))")
	exec(t, s.Orch, orig, "print(open('fixed.txt').read())")

	rep, err := replay.Run(ctx, s.Orch, orig, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]wire.ReplayFile{}
	for _, f := range rep.Files {
		got[f.Path] = f
	}
	if f := got["stamp.txt"]; f.Status != wire.ReplayDifferent || f.DivergedAt != 3 || f.Original == f.Replay {
		t.Errorf("stamp.txt: got %+v, want different, diverged at step 3", f)
	}
	for _, p := range []string{"in.csv", "fixed.txt"} {
		if f := got[p]; f.Status != wire.ReplayIdentical {
			t.Errorf("%s: got %+v, want identical", p, f)
		}
	}
	if rep.Identical || rep.Different != 1 || rep.FirstDivergence != 3 {
		t.Errorf("got identical=%v different=%d first divergence %d, want 1 file different from step 3", rep.Identical, rep.Different, rep.FirstDivergence)
	}
	if want := "step 3's cell reads the clock (time.time(), which a replay cannot repeat"; len(rep.Why) == 0 || !strings.HasPrefix(rep.Why[0], "step 3's cell reads the clock (time.time()") {
		t.Errorf("got why %q, want it to start with %q", rep.Why, want)
	}
	cel, err := s.Orch.Journal(ctx, runid.Must(rep.RunID))
	if err != nil {
		t.Fatal(err)
	}
	if got := replayVerdict(t, cel); !strings.HasPrefix(got, "FAIL") {
		t.Errorf("the triad.replay step's evaluation: got %q, want FAIL", got)
	}
	for _, want := range []string{"1 of 3 file(s) differ (stamp.txt); the first divergence is at original step 3", "the replay diverged"} {
		if !strings.Contains(string(cel), want) {
			t.Errorf("the replay's CEL.md lacks %q:\n%s", want, cel)
		}
	}
}

// After the original's kernel is stopped and Triad restarted (a new
// orchestrator over the same store, with no search provider), a replay
// still reproduces every file: local store on Docker, S3 on wasm.
func TestReplayAfterRestart(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		dir := t.TempDir()
		a := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Search: true, Dir: dir})
		orig := runid.New()
		manualSession(t, a.Orch, orig)
		a.Close() // kernels stopped, backend and store closed: the server is gone
		b := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Dir: dir})
		rep, err := replay.Run(t.Context(), b.Orch, orig, replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkIdentical(t, b.Orch, rep, []string{"work/noisy.csv", "artifacts/chart.png", "evidence/search.json"})
	})
	t.Run("s3", func(t *testing.T) {
		srv := miniotest.Shared(t)
		open := func() *tmpfs.Store {
			b, x, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket,
				AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { x.Close(); b.Close() })
			return tmpfs.New(b, x, nil)
		}
		a := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true, Store: open(), Dir: t.TempDir()})
		orig := runid.New()
		ctx := t.Context()
		text := "x\n1\n2\n"
		if _, err := a.Orch.Write(ctx, orig, wire.WriteRequest{Path: "data/x.csv", Text: &text}); err != nil {
			t.Fatal(err)
		}
		exec(t, a.Orch, orig, "import random, os\nvals = [random.random() for _ in range(3)]\nopen('work.txt', 'w').write(repr(vals) + os.environ['TRIAD_SEED'])")
		if _, err := a.Orch.Search(ctx, orig, wire.SearchRequest{Query: "analytics market size"}, orchestrator.SearchOptions{SaveAs: "evidence/market.json"}); err != nil {
			t.Fatal(err)
		}
		exec(t, a.Orch, orig, "import json\nopen('n.txt', 'w').write(str(len(json.load(open('evidence/market.json'))['results'])))")
		a.Close()
		b := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Store: open(), Dir: t.TempDir()})
		rep, err := replay.Run(ctx, b.Orch, orig, replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkIdentical(t, b.Orch, rep, []string{"data/x.csv", "work.txt", "evidence/market.json", "n.txt"})
	})
}

// A run that does not exist, or has no calls, is not found; a replay of a
// replay skips the report step and reproduces the rest.
func TestReplayRefusesAndReplaysReplays(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm"})
	ctx := t.Context()
	if _, err := replay.Run(ctx, s.Orch, runid.New(), replay.Options{}); fault.As(err) == nil || fault.As(err).Kind != fault.NotFound {
		t.Fatalf("replay of an unknown run: got %v, want not found", err)
	}
	orig := runid.New()
	exec(t, s.Orch, orig, "open('a.txt', 'w').write('a')")
	first, err := replay.Run(ctx, s.Orch, orig, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := replay.Run(ctx, s.Orch, runid.Must(first.RunID), replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Identical || len(second.Steps) != 2 || second.Steps[1].Tool != orchestrator.ToolReplay || second.Steps[1].Skipped == "" {
		t.Errorf("replay of a replay: got %+v, want identical with the report step skipped", second)
	}
}

// BenchmarkReplay replays the manual session (Docker) right after making
// it, in each iteration, and reports the replay's time as a ratio of the
// session's, measured in the same run.
func BenchmarkReplay(b *testing.B) {
	s := orchestratortest.New(b, orchestratortest.Options{Sandbox: "docker", Search: true, Warm: 1})
	var orig, again time.Duration
	for b.Loop() {
		run := runid.New()
		t0 := time.Now()
		manualSession(b, s.Orch, run)
		t1 := time.Now()
		rep, err := replay.Run(b.Context(), s.Orch, run, replay.Options{})
		again += time.Since(t1)
		orig += t1.Sub(t0)
		if err != nil || !rep.Identical {
			b.Fatalf("replay: %v %+v", err, rep)
		}
	}
	b.ReportMetric(float64(again)/float64(orig), "replay/original")
}

func TestReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code string
		want []string
	}{
		{"import time\nx = time.time()", []string{"the clock (time.time()"}},
		{"from datetime import datetime\nd = datetime.now().isoformat()", []string{"the clock (datetime.now()"}},
		{"import datetime\nd = datetime.date.today()", []string{"the clock (date.today()"}},
		{"rng = np.random.default_rng()", []string{"entropy (default_rng())"}},
		{"import uuid; u = uuid.uuid4()", []string{"entropy (uuid.uuid4()"}},
		{"import urllib.request\nurllib.request.urlopen('http://x')", []string{"the network (urllib.request)"}},
		{"t = time.strftime('%Y')", []string{"the clock (time.strftime('%Y'))"}},
		{"text = open('CEL.md').read()", []string{"the journal (CEL.md)"}},
		// Seeded or data-dated code reads nothing a replay cannot repeat.
		{"rng = np.random.default_rng(TRIAD_SEED)\nx = time.strftime('%Y', t)\nd = datetime.date.fromisoformat(as_of)", nil},
	} {
		if got := replay.Reads(tc.code); !slices.Equal(got, tc.want) {
			t.Errorf("Reads(%q): got %q, want %q", tc.code, got, tc.want)
		}
	}
}

// runSetup reads a run's recorded setup, as its caller.
func runSetup(ctx context.Context, o *orchestrator.Orchestrator, run runid.ID) (wire.RunSetup, bool, error) {
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		return wire.RunSetup{}, false, err
	}
	return rr.Setup(ctx)
}
