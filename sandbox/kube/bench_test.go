package kube_test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/kube"
)

// firstExec starts a kernel for a new run and runs 1+1 in it: what a run's
// first sandbox.exec costs the backend. The kernel is closed untimed.
func firstExec(b *testing.B, be sandbox.Backend, run string) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	k, err := be.Start(ctx, sandbox.Spec{Owner: run})
	if err != nil {
		b.Fatal(err)
	}
	res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute})
	d := time.Since(t0)
	if err != nil || !res.OK {
		b.Fatalf("1+1: %+v %v", res, err)
	}
	b.StopTimer()
	k.Close()
	b.StartTimer()
	return d
}

// median returns the middle of ds.
func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkFirstExec: a new run's first 1+1 with a warm pod from the pool
// (claimed by relabelling, its kernel already connected) against one
// without a pool (a pod created, scheduled, started and connected). The
// two alternate, so load from elsewhere on the machine hits both alike;
// the pool is refilled between iterations, untimed. Reported: each
// median in ms and the ratio cold/warm.
func BenchmarkFirstExec(b *testing.B) {
	c := needCluster(b)
	warm := c.newBackend(b, kube.Config{Warm: 1})
	cold := c.newBackend(b, kube.Config{})
	var tw, tc []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		deadline := time.Now().Add(3 * time.Minute)
		for warm.Pooled() < 1 {
			if time.Now().After(deadline) {
				b.Fatal("the warm pool did not refill in 3 minutes")
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.StartTimer()
		tw = append(tw, firstExec(b, warm, "bench-warm"))
		tc = append(tc, firstExec(b, cold, "bench-cold"))
	}
	mw, mc := median(tw), median(tc)
	b.ReportMetric(float64(mw.Microseconds())/1000, "warm-ms")
	b.ReportMetric(float64(mc.Microseconds())/1000, "cold-ms")
	b.ReportMetric(float64(mc)/float64(mw), "cold/warm")
}

// BenchmarkExec: 1+1 in a warm kube kernel (Jupyter over port-forward
// streams through the API server) against a warm Docker kernel of the
// same image (ipc sockets on the host), alternating in batches of ten.
// Reported: each median in µs and the ratio kube/docker.
func BenchmarkExec(b *testing.B) {
	c := needCluster(b)
	kb := c.newBackend(b, kube.Config{})
	ctx := context.Background()
	db, err := docker.New(ctx, docker.Config{Image: c.image, WorkRoot: filepath.Join(b.TempDir(), "work"), Runtime: testenv.DockerRuntime()})
	if err != nil {
		b.Fatalf("docker backend (the Docker engine and the sandbox image are needed for the baseline): %v", err)
	}
	b.Cleanup(func() { db.Close() })
	kk := startKernel(b, kb, sandbox.Spec{Owner: "bench-kube"})
	dk := startKernel(b, db, sandbox.Spec{Owner: "bench-docker"})
	one := func(k sandbox.Kernel) time.Duration {
		t0 := time.Now()
		res, err := k.Execute(ctx, sandbox.Cell{Code: "1+1", Timeout: time.Minute})
		d := time.Since(t0)
		if err != nil || !res.OK {
			b.Fatalf("1+1: %+v %v", res, err)
		}
		return d
	}
	for range 20 { // warm both up
		one(kk)
		one(dk)
	}
	var tk, td []time.Duration
	for i := 0; b.Loop(); i++ {
		if i/10%2 == 0 {
			tk = append(tk, one(kk))
		} else {
			td = append(td, one(dk))
		}
	}
	if len(tk) == 0 || len(td) == 0 {
		return // too few iterations for both; -benchtime decides
	}
	mk, md := median(tk), median(td)
	b.ReportMetric(float64(mk.Microseconds()), "kube-µs")
	b.ReportMetric(float64(md.Microseconds()), "docker-µs")
	b.ReportMetric(float64(mk)/float64(md), "kube/docker")
}
