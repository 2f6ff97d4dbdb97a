package evaluator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox/wasm"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/wire"
)

// rubric returns an Evaluator whose interpret runs the real evaluator.py
// on the embedded WASI CPython.
func rubric(t testing.TB) *Evaluator {
	t.Helper()
	b, err := wasm.New(t.Context(), wasm.Config{CacheDir: "/tmp/triad-test-wazero-cache"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	dir := t.TempDir()
	blobs, _ := local.NewBlobs(dir)
	x, _ := local.NewIndex(dir)
	t.Cleanup(func() { x.Close() })
	e, err := New(Config{
		Interpreter: InterpreterFunc(func(ctx context.Context, script []byte, d string) (Process, error) {
			return b.StartProgram(ctx, script, d)
		}),
		Store: tmpfs.New(blobs, x, nil), Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func art(path string, size int64) Artifact {
	return wire.FileRef{Path: path, Size: size, SHA256: tmpfs.DigestOf([]byte(path))}
}

// Grade gives, for every request it takes, the verdict evaluator.py gives:
// a table of the rubric's branches, then random requests built from them.
func TestGradeMatchesRubric(t *testing.T) {
	e := rubric(t)
	run := runid.New()
	cases := map[string]Request{
		"clean exec":           {Tool: "sandbox.exec", OK: true, ElapsedMs: 3, BudgetMs: 60000},
		"failed exec":          {Tool: "sandbox.exec", OK: false, Error: "ZeroDivisionError: division by zero", Stderr: "Traceback (most recent call last):\n"},
		"failed, no reason":    {Tool: "tmp.read", OK: false},
		"stderr error word":    {Tool: "sandbox.exec", OK: true, Stderr: "ValueError: bad"},
		"stderr Errors":        {Tool: "sandbox.exec", OK: true, Stderr: "Errors happen"},
		"stderr Error_":        {Tool: "sandbox.exec", OK: true, Stderr: "Error_x"},
		"stderr Erroré":        {Tool: "sandbox.exec", OK: true, Stderr: "Erroré"},
		"stderr Error日":        {Tool: "sandbox.exec", OK: true, Stderr: "Error日"},
		"stderr Error½":        {Tool: "sandbox.exec", OK: true, Stderr: "Error½ and more"},
		"stderr Error.":        {Tool: "sandbox.exec", OK: true, Stderr: "an Error."},
		"stderr Exception":     {Tool: "sandbox.exec", OK: true, Stderr: "Exception"},
		"stderr warning":       {Tool: "sandbox.exec", OK: true, Stderr: "<stdin>:1: DeprecationWarning: old api\n"},
		"stderr warnings":      {Tool: "sandbox.exec", OK: true, Stderr: "warnings were raised"},
		"stderr noise":         {Tool: "sandbox.exec", OK: true, Stderr: "loading...\n"},
		"stderr separators":    {Tool: "sandbox.exec", OK: true, Stderr: "\x1c\x1d\x1e\x1f \t\n"},
		"stderr nbsp":          {Tool: "sandbox.exec", OK: true, Stderr: "\u00a0\u2003\u3000"},
		"stderr zero width":    {Tool: "sandbox.exec", OK: true, Stderr: "\u200b"},
		"restarted":            {Tool: "sandbox.exec", OK: true, Restarted: true},
		"tampered":             {Tool: "sandbox.exec", OK: true, Tampered: []string{"CEL.md", "trace.jsonl"}},
		"over budget":          {Tool: "sandbox.exec", OK: true, ElapsedMs: 61000, BudgetMs: 60000},
		"everything wrong":     {Tool: "sandbox.exec", OK: false, Error: "x", Stderr: "Traceback", Restarted: true, Tampered: []string{"CEL.md"}, ElapsedMs: 9, BudgetMs: 1},
		"write":                {Tool: "tmp.write", OK: true, Artifacts: []Artifact{art("a.bin", 3)}},
		"empty write":          {Tool: "tmp.write", OK: true, Artifacts: []Artifact{art("a.bin", 0)}},
		"write, no artifact":   {Tool: "tmp.write", OK: true},
		"search, results":      {Tool: "browser.search", OK: true, Results: 5},
		"search, none":         {Tool: "browser.search", OK: true},
		"search failed":        {Tool: "browser.search", OK: false, Error: "upstream: 502"},
		"expected, all there":  {Tool: "sandbox.exec", OK: true, Artifacts: []Artifact{art("model.pkl", 10)}, Expected: []Expect{{Path: "model.pkl"}}},
		"expected, one of two": {Tool: "sandbox.exec", OK: true, Artifacts: []Artifact{art("model.pkl", 10)}, Expected: []Expect{{Path: "model.pkl"}, {Path: "b.pkl"}}},
		"expected, one of three from run files": {Tool: "sandbox.exec", OK: true, Expected: []Expect{{Path: "x.bin"}, {Path: "y.bin"}, {Path: "z.bin"}},
			RunFiles: map[string]Artifact{"y.bin": art("y.bin", 4), "z.bin": art("z.bin", 0)}},
		"expected, empty artifact wins over run file": {Tool: "sandbox.exec", OK: true, Artifacts: []Artifact{art("m.bin", 0)},
			Expected: []Expect{{Path: "m.bin"}}, RunFiles: map[string]Artifact{"m.bin": art("m.bin", 9)}},
		"many notes": {Tool: "sandbox.exec", OK: true, Stderr: "Error", Restarted: true, Tampered: []string{"a"}, ElapsedMs: 5, BudgetMs: 1,
			Expected: []Expect{{Path: "q"}}},
		"dotfiles and no ext": {Tool: "sandbox.exec", OK: true, Artifacts: []Artifact{art(".md", 1), art("dir.md/file", 1), art("..csv", 1), art("a.CSV.gz", 1)}},
	}
	check := func(name string, req Request) {
		t.Helper()
		want, err := e.interpret(t.Context(), run, req)
		if err != nil {
			t.Fatalf("%s: the rubric: %v", name, err)
		}
		got, ok := Grade(req)
		if !ok {
			t.Fatalf("%s: Grade refused a request with nothing to parse: %+v", name, req)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: Grade differs from the rubric (-rubric +Grade):\n%s", name, d)
		}
	}
	for name, req := range cases {
		check(name, req)
	}
	// Random requests, from the same parts.
	r := rand.New(rand.NewPCG(1, 2))
	tools := []string{"sandbox.exec", "tmp.write", "tmp.read", "tmp.list", "tmp.delete", "browser.search", "triad.replay"}
	stderrs := []string{"", " ", "\n", "Error", "Errors", "Error:", "Exception", "Exceptional", "Traceback", "warning", "Warning:", "Warnings",
		"ok", "é", "Error\u0301", "Error\u00b2", "Error\x1c", "\x1f", "Ошибка Error", "日本"}
	for i := range 200 {
		req := Request{Tool: tools[r.IntN(len(tools))], OK: r.IntN(4) > 0, Results: r.IntN(3), Restarted: r.IntN(5) == 0,
			ElapsedMs: int64(r.IntN(100)), BudgetMs: int64(r.IntN(3) * 40)}
		var st strings.Builder
		for range r.IntN(4) {
			st.WriteString(stderrs[r.IntN(len(stderrs))])
		}
		req.Stderr = st.String()
		if !req.OK && r.IntN(2) == 0 {
			req.Error = "kind: message " + fmt.Sprint(i)
		}
		if r.IntN(6) == 0 {
			req.Tampered = []string{"CEL.md"}
		}
		for range r.IntN(3) {
			req.Artifacts = append(req.Artifacts, art(fmt.Sprintf("f%d.bin", r.IntN(4)), int64(r.IntN(3))))
		}
		for range r.IntN(4) {
			req.Expected = append(req.Expected, Expect{Path: fmt.Sprintf("f%d.bin", r.IntN(5))})
		}
		if r.IntN(2) == 0 {
			req.RunFiles = map[string]Artifact{"f4.bin": art("f4.bin", int64(r.IntN(2)))}
		}
		check(fmt.Sprintf("random %d", i), req)
	}
}

// Requests with an artifact the rubric parses are left to the rubric.
func TestGradeLeavesFilesToRubric(t *testing.T) {
	for _, p := range []string{"a.csv", "r/report.MD", "x.json", "p.png", "i.html", "n.ipynb", "t.txt", "d.pdf", "l.jsonl", "h.htm"} {
		if _, ok := Grade(Request{Tool: "sandbox.exec", OK: true, Artifacts: []Artifact{art("z.bin", 1), art(p, 3)}}); ok {
			t.Errorf("Grade took a request with %s", p)
		}
	}
}

// BenchmarkGrade: where a light step is graded. The same clean
// sandbox.exec request (a cell with no files, as most steps are) graded by
// Grade in Go, and by evaluator.py on its warm WASI interpreter (the
// light lane, as before Grade). The ratio is the reason recording stays
// after the answer but needs no evaluator of its own to keep up: see
// docs/DECISIONS.md, "When the evaluator runs".
//
//	go test -run '^$' -bench Grade -benchtime 2000x ./evaluator
func BenchmarkGrade(b *testing.B) {
	req := Request{Tool: "sandbox.exec", OK: true, ElapsedMs: 3, BudgetMs: 60000}
	b.Run("go", func(b *testing.B) {
		for range b.N {
			if v, ok := Grade(req); !ok || !v.Pass {
				b.Fatalf("got %+v, %v, want a PASS", v, ok)
			}
		}
	})
	b.Run("wasi", func(b *testing.B) {
		e := rubric(b)
		run := runid.New()
		ctx := context.Background()
		if _, err := e.interpret(ctx, run, req); err != nil { // warm the interpreter
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if v, err := e.interpret(ctx, run, req); err != nil || !v.Pass {
				b.Fatalf("got %+v, %v, want a PASS", v, err)
			}
		}
	})
}
