package orchestrator_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// BenchmarkJournalOverhead measures what the journal and the evaluator add
// to a call: the same tool call on an orchestrator without a journal (the
// bare call) and on one with the journal and the WASI evaluator, in the
// same run of the benchmark. It reports the p50 of each and the p50
// overhead per call in ms; the goal is overhead_p50_ms <= 25.
//
//	go test -run XXX -bench JournalOverhead -benchtime 200x ./orchestrator
func BenchmarkJournalOverhead(b *testing.B) {
	for _, tool := range []string{"tmp.write", "sandbox.exec"} {
		b.Run(tool, func(b *testing.B) {
			sb := "docker"
			if tool == "tmp.write" {
				sb = ""
			}
			full := orchestratortest.New(b, orchestratortest.Options{Sandbox: sb, Warm: 1})
			bare := orchestrator.New(orchestrator.Config{Store: full.Store, Kernels: full.Kernels})
			runBare, runFull := runid.New(), runid.New()
			call := func(o *orchestrator.Orchestrator, run runid.ID, i int) {
				var err error
				switch tool {
				case "tmp.write":
					_, err = o.Write(b.Context(), run, wire.WriteRequest{Path: fmt.Sprintf("f/%d.csv", i), Text: text(fmt.Sprintf("a,b\n%d,2\n", i))})
				default:
					var out wire.ExecResponse
					out, err = o.Exec(b.Context(), run, wire.ExecRequest{Code: "1+1"})
					if err == nil && !out.OK {
						err = fmt.Errorf("%+v", out.Error)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			// Warm both (kernel start, evaluator interpreter start).
			call(bare, runBare, -1)
			call(full.Orch, runFull, -1)
			var tb, tf []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				call(bare, runBare, i)
				tb = append(tb, time.Since(t0))
				t0 = time.Now()
				call(full.Orch, runFull, i)
				tf = append(tf, time.Since(t0))
			}
			b.StopTimer()
			pb, pf := p50(tb), p50(tf)
			b.ReportMetric(float64(pb.Microseconds())/1000, "bare_p50_ms")
			b.ReportMetric(float64(pf.Microseconds())/1000, "journaled_p50_ms")
			b.ReportMetric(float64((pf-pb).Microseconds())/1000, "overhead_p50_ms")
			b.ReportMetric(float64(pf)/float64(pb), "ratio")
		})
	}
}

func p50(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
