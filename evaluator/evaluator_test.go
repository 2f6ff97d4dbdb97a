package evaluator_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

var (
	backendOnce sync.Once
	backend     *wasm.Backend
	backendErr  error
)

// newEvaluator runs the real rubric on the embedded WASI interpreter.
func newEvaluator(t *testing.T) (*evaluator.Evaluator, *tmpfs.Store) {
	t.Helper()
	return newEvaluatorWith(t, nil)
}

// newEvaluatorWith is newEvaluator with the config adjusted by edit, if
// not nil, before New.
func newEvaluatorWith(t *testing.T, edit func(*evaluator.Config)) (*evaluator.Evaluator, *tmpfs.Store) {
	t.Helper()
	backendOnce.Do(func() {
		backend, backendErr = wasm.New(context.Background(), wasm.Config{CacheDir: "/tmp/triad-test-wazero-cache"})
	})
	if backendErr != nil {
		t.Fatal(backendErr)
	}
	dir := t.TempDir()
	b, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	store := tmpfs.New(b, x, nil)
	c := evaluator.Config{
		Interpreter: evaluator.InterpreterFunc(func(ctx context.Context, script []byte, d string) (evaluator.Process, error) {
			return backend.StartProgram(ctx, script, d)
		}),
		Store: store, Dir: t.TempDir(),
	}
	if edit != nil {
		edit(&c)
	}
	e, err := evaluator.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, store
}

func artifact(t *testing.T, s *tmpfs.Store, run runid.ID, path, content string) evaluator.Artifact {
	f, err := s.WriteBytes(t.Context(), run, path, []byte(content))
	if err != nil {
		t.Fatal(err)
	}
	return wire.Ref(f)
}

func TestVerdicts(t *testing.T) {
	e, s := newEvaluator(t)
	run := runid.New()
	good := artifact(t, s, run, "kpis.csv", "channel,cac\nads,12\nseo,8\n")
	report := artifact(t, s, run, "facts.md", "# Facts\nThe market grew 12% ([source](https://example.com/a)).\n")
	badCSV := artifact(t, s, run, "broken.json", "{not json")
	uncited := artifact(t, s, run, "claims.md", "Revenue will triple to 4.2M next year.\n")
	named := artifact(t, s, run, "named.md", "Revenue will triple to 4.2M next year (from data/revenue.csv).\n")
	fetched := artifact(t, s, run, "fetched.md", "Rates rose 2% ([data](https://allowed.test/rates.csv), [api](http://plain.test/v1/rates)).\n")
	cases := []struct {
		name string
		req  evaluator.Request
		pass bool
		// check inspects the verdict further.
		check func(v evaluator.Verdict) string
	}{
		{"clean exec", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{good, report},
			CitationURLs: []string{"https://example.com/a"}}, true, nil},
		{"failing cell that warns", evaluator.Request{Tool: "sandbox.exec", OK: false, Error: "ZeroDivisionError: division by zero",
			Stderr: "<stdin>:1: DeprecationWarning: old api\n"}, false, func(v evaluator.Verdict) string {
			if v.Hygiene >= 1 || v.Completeness != 0 {
				return "want hygiene < 1 and completeness 0"
			}
			return ""
		}},
		{"unparseable artifact", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{badCSV}}, false,
			func(v evaluator.Verdict) string {
				if v.Correctness != 0 || !strings.Contains(v.Critique, "broken.json") {
					return "want correctness 0 and a critique naming broken.json"
				}
				return ""
			}},
		{"claims without sources", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{uncited}}, false,
			func(v evaluator.Verdict) string {
				if v.Evidence != 0 {
					return "want evidence 0"
				}
				return ""
			}},
		{"claims naming a dataset", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{named},
			Datasets: []string{"data/revenue.csv"}}, true, func(v evaluator.Verdict) string {
			if v.Evidence != 1 {
				return "want evidence 1 (the report names a dataset in the run)"
			}
			return ""
		}},
		{"claims citing fetched URLs", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{fetched},
			FetchedURLs: []string{"http://plain.test/v1/rates", "https://allowed.test/"}}, true, func(v evaluator.Verdict) string {
			if v.Evidence != 1 {
				return "want evidence 1 (a URL fetched whole, and one of an origin passed through)"
			}
			return ""
		}},
		{"claims citing URLs not fetched", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{fetched},
			FetchedURLs: []string{"http://plain.test/other", "https://allowed.test/elsewhere"}}, false, func(v evaluator.Verdict) string {
			if v.Evidence != 0 {
				return "want evidence 0 (neither URL was fetched, nor its origin passed through)"
			}
			return ""
		}},
		{"missing expected artifact", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{good},
			Expected: []evaluator.Expect{{Path: "kpis.csv", Columns: []string{"channel"}}, {Path: "forecast.csv"}}}, false,
			func(v evaluator.Verdict) string {
				if v.Completeness != 0.5 || !strings.Contains(v.Critique, "forecast.csv") {
					return "want completeness 0.5 and a critique naming forecast.csv"
				}
				return ""
			}},
		{"declared column missing", evaluator.Request{Tool: "sandbox.exec", OK: true, Artifacts: []evaluator.Artifact{good},
			Expected: []evaluator.Expect{{Path: "kpis.csv", Columns: []string{"roi"}}}}, false, func(v evaluator.Verdict) string {
			if v.Correctness == 1 {
				return "want correctness < 1 for a CSV lacking a declared column"
			}
			return ""
		}},
		{"tampered journal", evaluator.Request{Tool: "sandbox.exec", OK: true, Tampered: []string{"CEL.md"}}, true,
			func(v evaluator.Verdict) string {
				if v.Hygiene >= 1 {
					return "want hygiene < 1"
				}
				return ""
			}},
		{"empty search", evaluator.Request{Tool: "browser.search", OK: true, Results: 0}, true, func(v evaluator.Verdict) string {
			if v.Evidence >= 1 {
				return "want evidence < 1"
			}
			return ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := e.Evaluate(t.Context(), run, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if v.Pass != tc.pass {
				t.Fatalf("got pass=%v, want %v: %+v", v.Pass, tc.pass, v)
			}
			if tc.check != nil {
				if msg := tc.check(v); msg != "" {
					t.Fatalf("%s: got %+v", msg, v)
				}
			}
			if v.Critique == "" {
				t.Fatal("empty critique")
			}
		})
	}
}
