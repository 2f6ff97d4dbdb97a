package evaluator_test

import (
	"context"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// mute is an interpreter that takes requests and never answers until
// closed: an evaluator starved of CPU, as the tests' fault hook.
type mute struct {
	r    *io.PipeReader
	w    *io.PipeWriter
	once sync.Once
}

func (m *mute) Stdin() io.Writer  { return io.Discard }
func (m *mute) Stdout() io.Reader { return m.r }
func (m *mute) Close() error {
	m.once.Do(func() { m.w.Close() })
	return nil
}

// The deadline is sized from measurement: a lane that missed its deadline
// gets DeadlineFactor times its recent p99 next time (here the one miss,
// so exactly four times the floor), never less than the floor and never
// more than MaxTimeout.
func TestDeadlineFollowsLatency(t *testing.T) {
	const floor = 50 * time.Millisecond
	e, err := evaluator.New(evaluator.Config{
		Interpreter: evaluator.InterpreterFunc(func(context.Context, []byte, string) (evaluator.Process, error) {
			r, w := io.Pipe()
			return &mute{r: r, w: w}, nil
		}),
		Dir: t.TempDir(), Timeout: floor, MaxTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if light, heavy, _, _ := e.Deadlines(); light != floor || heavy != floor {
		t.Fatalf("deadlines before any evaluation: got %v and %v, want the floor %v", light, heavy, floor)
	}
	// A CSV the rubric must read: the interpreter's lane, not Grade. Its
	// blob is absent, so nothing is staged and it takes the light lane.
	req := evaluator.Request{Tool: "tmp.write", OK: true, Artifacts: []evaluator.Artifact{{Path: "a.csv", Size: 4, SHA256: wire.FileRef{}.SHA256}}}
	if _, err := e.Evaluate(t.Context(), runid.New(), req); err == nil {
		t.Fatal("an interpreter that never answers gave a verdict")
	}
	light, heavy, p99, _ := e.Deadlines()
	if p99 != floor || light != 4*floor || heavy != floor {
		t.Fatalf("after one miss: got light %v (p99 %v), heavy %v; want light %v (p99 %v), heavy %v", light, p99, heavy, 4*floor, floor, floor)
	}
}

// BenchmarkRubricLatency grades a small CSV step by the real rubric, one
// after another, and reports the light lane's p99 and the deadline it
// gives: the measurement behind Config.Timeout and DeadlineFactor (see
// docs/DECISIONS.md, "Ungraded steps and the regrade").
func BenchmarkRubricLatency(b *testing.B) {
	e, s := newEvaluatorWith(b, nil)
	run := runid.New()
	f, err := s.WriteBytes(b.Context(), run, "kpis.csv", []byte("channel,cac\nads,12\nseo,8\n"))
	if err != nil {
		b.Fatal(err)
	}
	req := evaluator.Request{Tool: "tmp.write", OK: true, Artifacts: []evaluator.Artifact{wire.Ref(f)}}
	t0 := time.Now()
	if _, err := e.Evaluate(b.Context(), run, req); err != nil { // with the interpreter's start
		b.Fatal(err)
	}
	first := time.Since(t0)
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := e.Evaluate(b.Context(), run, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	light, _, p99, _ := e.Deadlines()
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99+99)/100-1].Microseconds())/1e3, "p99-ms")
	b.ReportMetric(float64(p99.Microseconds())/1e3, "window-p99-ms")
	b.ReportMetric(light.Seconds(), "deadline-s")
	b.ReportMetric(float64(first.Microseconds())/1e3, "first-ms")
}
