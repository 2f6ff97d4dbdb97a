package orchestrator_test

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/miniotest"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
	"github.com/triadhq/triad/wire"
)

// longRunSteps is the length of the long run: the 5,000 steps.
const longRunSteps = 5000

// longRunStores are the stores a long run is made on: the local store and
// S3 (a real MinIO server).
func longRunStores(t testing.TB) []struct {
	name string
	open func(t testing.TB) *tmpfs.Store
} {
	return []struct {
		name string
		open func(t testing.TB) *tmpfs.Store
	}{
		{"local", func(t testing.TB) *tmpfs.Store { return nil }}, // orchestratortest's own
		{"s3", func(t testing.TB) *tmpfs.Store {
			srv := miniotest.Shared(t)
			b, x, err := s3.New(context.Background(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket,
				AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close(); x.Close() })
			return tmpfs.New(b, x, nil)
		}},
	}
}

// longRun makes a run of n tmp.write calls on the real stack and returns,
// per step, the time from the call to its recording being done (answer,
// Step Block, verdict, trace) and to its answer.
func longRun(t testing.TB, st *orchestratortest.Stack, run runid.ID, n int) (step, answer []time.Duration) {
	ctx := st.Ctx(t)
	for i := 1; i <= n; i++ {
		text := fmt.Sprintf("step %d\n", i)
		t0 := time.Now()
		if _, err := st.Orch.Write(ctx, run, wire.WriteRequest{Path: fmt.Sprintf("f/%05d.txt", i), Text: &text}); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		answer = append(answer, time.Since(t0))
		if _, err := st.Orch.ReadRun(ctx, run); err != nil {
			t.Fatal(err)
		}
		step = append(step, time.Since(t0))
	}
	return step, answer
}

// A 5,000-step run's journal, appended one Step Block at a time on each
// store, is still content-addressed: CEL.md's recorded sha256 is the
// sha256 of the bytes GET /cel streams, every checkpoint's is the sha256
// of its own bytes and is a prefix of the journal, and the journal has
// every step once.
func TestLongRunJournalIsContentAddressed(t *testing.T) {
	for _, store := range longRunStores(t) {
		t.Run(store.name, func(t *testing.T) {
			st := orchestratortest.New(t, orchestratortest.Options{Store: store.open(t)})
			ctx := st.Ctx(t)
			run := runid.New()
			longRun(t, st, run, longRunSteps)
			rr, err := st.Orch.ReadRun(ctx, run)
			if err != nil {
				t.Fatal(err)
			}
			f, r, err := rr.OpenJournal(ctx)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got := tmpfs.DigestOf(body); got != f.SHA256 || int64(len(body)) != f.Size {
				t.Fatalf("CEL.md is recorded as %s (%d bytes), its bytes hash to %s (%d bytes)", f.SHA256, f.Size, got, len(body))
			}
			if n := strings.Count(string(body), "\n## Step "); n != longRunSteps {
				t.Fatalf("CEL.md has %d Step Blocks, want %d", n, longRunSteps)
			}
			for _, n := range []int{1, 2, 10, 33, 64, 65, 1000, 4096, longRunSteps} {
				cb, cf, err := st.Store.ReadAll(ctx, run, runfiles.Checkpoint(n))
				if err != nil {
					t.Fatalf("checkpoint %d: %v", n, err)
				}
				if tmpfs.DigestOf(cb) != cf.SHA256 || !strings.HasPrefix(string(body), string(cb)) ||
					strings.Count(string(cb), "\n## Step ") != n-1 {
					t.Fatalf("checkpoint %d (%d bytes) is not the journal before step %d", n, len(cb), n)
				}
			}
			for _, p := range []string{runfiles.Trace, runfiles.Evaluations} {
				b, f, err := st.Store.ReadAll(ctx, run, p)
				if err != nil || tmpfs.DigestOf(b) != f.SHA256 || strings.Count(string(b), "\n") != longRunSteps {
					t.Fatalf("%s: %d lines, %v", p, strings.Count(string(b), "\n"), err)
				}
			}
		})
	}
}

// BenchmarkLongRun measures whether a step costs the same late in a long
// run as early: one run of 5,000 tmp.write calls on the real stack (the
// journal, the WASI evaluator, the run's records), on the local store and
// on S3 (a real MinIO). It reports the p50 of a step's whole cost (its
// answer and its recording) over steps 10-59 and over the last 50 steps,
// and their ratio (the goal is <= 1.5), the same for the answer alone, and
// each window's mean.
//
//	go test -run '^$' -bench LongRun -benchtime 1x -timeout 60m ./orchestrator
func BenchmarkLongRun(b *testing.B) {
	const window = 50
	for _, store := range longRunStores(b) {
		b.Run(store.name, func(b *testing.B) {
			for range b.N {
				st := orchestratortest.New(b, orchestratortest.Options{Store: store.open(b)})
				step, answer := longRun(b, st, runid.New(), longRunSteps)
				early, late := p50(step[9:9+window]), p50(step[len(step)-window:])
				ea, la := p50(answer[9:9+window]), p50(answer[len(answer)-window:])
				b.ReportMetric(ms(early), "step10_p50_ms")
				b.ReportMetric(ms(late), "step5000_p50_ms")
				b.ReportMetric(float64(late)/float64(early), "ratio")
				b.ReportMetric(ms(ea), "answer10_p50_ms")
				b.ReportMetric(ms(la), "answer5000_p50_ms")
				b.ReportMetric(float64(la)/float64(ea), "answer_ratio")
				b.ReportMetric(ms(p90(step[len(step)-window:])), "step5000_p90_ms")
				// The mean counts what a p50 leaves out: the S3 layout
				// uploads the whole file every 32nd append.
				b.ReportMetric(ms(mean(step[9:9+window])), "step10_mean_ms")
				b.ReportMetric(ms(mean(step[len(step)-window:])), "step5000_mean_ms")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func p90(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)*9/10]
}
