package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/wire"
)

// deliverables returns a run's deliverables (artifacts/ but the index,
// which names the run) by path, as sha256 hex.
func deliverables(t *testing.T, s *orchestratortest.Stack, run runid.ID) map[string]string {
	t.Helper()
	files, err := s.Store.List(t.Context(), run, runfiles.ArtifactsDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		if runfiles.IsDeliverable(f.Path) {
			out[f.Path] = f.SHA256.String()
		}
	}
	return out
}

func runRecipe(t *testing.T, r *runner.Runner, s *orchestratortest.Stack, name string, params map[string]any) (runid.ID, time.Duration) {
	t.Helper()
	ctx := t.Context()
	t0 := time.Now()
	st, err := r.Run(ctx, runner.Request{Recipe: name, Params: params}, nil, nil)
	took := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	run := runid.Must(st.RunID)
	if st.Status != runner.Succeeded {
		cel, _ := s.Orch.Journal(ctx, run)
		t.Fatalf("%s: status %s: %s\n%s", name, st.Status, st.Error, cel)
	}
	return run, took
}

// Twice, identical: each standard recipe run twice on its bundled data
// (searches from the Tavily stand-in) gives the same seed and as_of and
// byte-identical deliverables. Replay: `triad replay` of each run reports
// every file identical. Seed: another seed changes the bootstrap bands of
// sales-reallocation and nothing that is not drawn at random, and a replay
// with it says why its files differ.
func TestRecipesAreReproducible(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "docker", Search: true, Warm: 1})
	r := newRunner(t, s)
	firsts := map[string]runid.ID{}
	for _, rc := range recipes.Standard() {
		t.Run(rc.Name, func(t *testing.T) {
			ctx := t.Context()
			a, took := runRecipe(t, r, s, rc.Name, nil)
			b, _ := runRecipe(t, r, s, rc.Name, nil)
			firsts[rc.Name] = a
			sa, _, err := runSetup(ctx, s.Orch, a)
			if err != nil {
				t.Fatal(err)
			}
			sb, _, _ := runSetup(ctx, s.Orch, b)
			if sa.Seed != sb.Seed || sa.AsOf != sb.AsOf || !strings.HasPrefix(sa.SeedFrom, "derived") {
				t.Errorf("setups differ or the seed was not derived: %+v and %+v", sa, sb)
			}
			da, db := deliverables(t, s, a), deliverables(t, s, b)
			for _, o := range rc.Outputs {
				if runfiles.IsDeliverable(o.Path) && da[o.Path] == "" {
					t.Errorf("declared deliverable %s is missing", o.Path)
				}
			}
			if diff := cmp.Diff(da, db); diff != "" {
				t.Errorf("deliverables of two runs on the same inputs differ (-first +second):\n%s", diff)
			}

			t0 := time.Now()
			rep, err := replay.Run(ctx, s.Orch, a, replay.Options{})
			replayed := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			compared := map[string]bool{}
			for _, f := range rep.Files {
				compared[f.Path] = true
				if f.Status != wire.ReplayIdentical {
					t.Errorf("replay: %s is %s (%s, replay %s, diverged at step %d)", f.Path, f.Status, f.Original.Short(), f.Replay.Short(), f.DivergedAt)
				}
			}
			for p := range da {
				if !compared[p] {
					t.Errorf("replay did not compare deliverable %s", p)
				}
			}
			if !rep.Identical {
				t.Errorf("replay of %s: not identical; why: %q", rc.Name, rep.Why)
			}
			t.Logf("figures: %s: run %.1f s, replay %.1f s (%.2fx the run); %d files compared, %d deliverables; seed %d, as_of %q (%s)",
				rc.Name, took.Seconds(), replayed.Seconds(), replayed.Seconds()/took.Seconds(), len(rep.Files), len(da), sa.Seed, sa.AsOf, sa.AsOfFrom)
		})
	}
	t.Run("seed", func(t *testing.T) {
		ctx := t.Context()
		a, ok := firsts["sales-reallocation"]
		if !ok {
			t.Fatal("sales-reallocation did not run")
		}
		sa, _, _ := runSetup(ctx, s.Orch, a)
		seed := sa.Seed + 1
		c, _ := runRecipe(t, r, s, "sales-reallocation", map[string]any{"seed": seed})
		if sc, _, _ := runSetup(ctx, s.Orch, c); sc.Seed != seed || sc.SeedFrom != "param" {
			t.Errorf("run with seed %d: setup %+v", seed, sc)
		}
		da, dc := deliverables(t, s, a), deliverables(t, s, c)
		// The bootstrap bands (p10, p90, P(>0)) are drawn; the KPIs and the
		// plan are not.
		for p, differ := range map[string]bool{"artifacts/sensitivity.csv": true, "artifacts/channel_kpis.csv": false,
			"artifacts/reallocation_plan.csv": false, "artifacts/data_profile.md": false} {
			if got := da[p] != dc[p]; got != differ {
				t.Errorf("seed %d against %d: %s differs: got %v, want %v", seed, sa.Seed, p, got, differ)
			}
		}
		rep, err := replay.Run(ctx, s.Orch, a, replay.Options{Seed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		status := map[string]string{}
		for _, f := range rep.Files {
			status[f.Path] = f.Status
		}
		if status["artifacts/sensitivity.csv"] != wire.ReplayDifferent || status["artifacts/channel_kpis.csv"] != wire.ReplayIdentical {
			t.Errorf("replay with seed %d: sensitivity.csv %s, channel_kpis.csv %s; want different and identical", seed,
				status["artifacts/sensitivity.csv"], status["artifacts/channel_kpis.csv"])
		}
		if rep.Identical || len(rep.Why) == 0 || !strings.Contains(rep.Why[0], "seed") {
			t.Errorf("replay with seed %d: identical=%v why %q; want it to differ and say the seed changed", seed, rep.Identical, rep.Why)
		}
	})
}

// runSetup reads a run's recorded setup, as its caller.
func runSetup(ctx context.Context, o *orchestrator.Orchestrator, run runid.ID) (wire.RunSetup, bool, error) {
	rr, err := o.ReadRun(ctx, run)
	if err != nil {
		return wire.RunSetup{}, false, err
	}
	return rr.Setup(ctx)
}
