package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/wire"
)

// BenchmarkHTTPOverhead measures what the HTTP surface adds to a warm
// sandbox.exec: the same journaled call made on the orchestrator directly
// (as the in-process operator, and as the API key's principal, so that
// tenancy's share shows apart) and through POST /sandbox/exec
// (authentication, metrics, decoding and encoding, loopback TCP),
// interleaved in one run on one stack, each on a run of its own. Each
// call is preceded by an untimed read of the run's journal, which waits
// for every answered call's recording, so no timed call overlaps another's
// recording. It reports each p50, HTTP's addition over the direct call and
// their ratio.
//
//	CI=true go test -run '^$' -bench HTTPOverhead -benchtime 200x ./api
func BenchmarkHTTPOverhead(b *testing.B) {
	s := orchestratortest.New(b, orchestratortest.Options{Sandbox: "docker", Warm: 2})
	c := apiServer(b, api.Config{Orchestrator: s.Orch})
	direct, asKey, viaHTTP := runid.New(), runid.New(), runid.New()
	// The key's principal: the direct call made as the HTTP caller is,
	// so tenancy's cost (run ownership, quotas) shows apart from HTTP's.
	p, err := c.keys.Authenticate(context.Background(), c.key)
	if err != nil {
		b.Fatal(err)
	}
	keyCtx := auth.With(context.Background(), p)
	body, _ := json.Marshal(wire.ExecRequest{Code: "1+1"})
	ctx := context.Background()
	// Reading the journal waits for every answered call's recording.
	settleDirect := func(ctx context.Context, run runid.ID) {
		rr, err := s.Orch.ReadRun(ctx, run)
		if err != nil {
			b.Fatal(err)
		}
		_, r, err := rr.OpenJournal(ctx)
		if err != nil {
			b.Fatal(err)
		}
		r.Close()
	}
	settleHTTP := func() {
		req, _ := http.NewRequest(http.MethodGet, c.url+"/cel", nil)
		req.Header.Set(api.RunHeader, viaHTTP.String())
		req.Header.Set("Authorization", "Bearer "+c.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET /cel: %d", resp.StatusCode)
		}
	}
	callDirect := func(ctx context.Context, run runid.ID) {
		out, err := s.Orch.Exec(ctx, run, wire.ExecRequest{Code: "1+1"})
		if err != nil || !out.OK {
			b.Fatalf("direct: %+v, %v", out.Error, err)
		}
	}
	callHTTP := func() {
		req, _ := http.NewRequest(http.MethodPost, c.url+"/sandbox/exec", bytes.NewReader(body))
		req.Header.Set(api.RunHeader, viaHTTP.String())
		req.Header.Set("Authorization", "Bearer "+c.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"ok":true`)) {
			panic(string(b))
		}
	}
	callDirect(ctx, direct)
	callDirect(keyCtx, asKey)
	callHTTP()
	var td, tk, th []time.Duration
	for b.Loop() {
		settleDirect(ctx, direct)
		t0 := time.Now()
		callDirect(ctx, direct)
		td = append(td, time.Since(t0))
		settleDirect(keyCtx, asKey)
		t0 = time.Now()
		callDirect(keyCtx, asKey)
		tk = append(tk, time.Since(t0))
		settleHTTP()
		t0 = time.Now()
		callHTTP()
		th = append(th, time.Since(t0))
	}
	pd, pk, ph := p50(td), p50(tk), p50(th)
	b.ReportMetric(float64(pd.Microseconds())/1000, "direct_p50_ms")
	b.ReportMetric(float64(pk.Microseconds())/1000, "direct_as_key_p50_ms")
	b.ReportMetric(float64(ph.Microseconds())/1000, "http_p50_ms")
	b.ReportMetric(float64((ph-pd).Microseconds())/1000, "http_adds_ms")
	b.ReportMetric(float64(ph)/float64(pd), "ratio")
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
