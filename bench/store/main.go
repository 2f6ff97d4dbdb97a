// Command store measures the file API's throughput against raw baselines in the same run, and the server's memory during a 1 GiB streamed upload.
//
// Usage (from the repository root; needs the MinIO binary, see scripts/minio.sh):
//
//	go run ./bench/store [-size 64MiB] [-n 5] [-minio PATH]
//
// It prints, for each backend, the median time to write and to read the
// payload through triad's HTTP API and through the raw baseline (plain file
// write+fsync and read for local; minio-go PutObject/GetObject on the same
// MinIO for s3), and their ratio as throughput: baseline time / API time.
// Then it starts a real `triad serve`, streams 1 GiB to PUT /tmp/files and
// reports the server's peak RSS (VmHWM).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/s3"
)

func main() {
	size := flag.Int64("size", 64<<20, "payload bytes")
	n := flag.Int("n", 5, "repetitions (median reported)")
	minioBin := flag.String("minio", os.Getenv("TRIAD_MINIO_BIN"), "MinIO server binary")
	rss := flag.Bool("rss", true, "also measure the server's RSS during a 1 GiB streamed upload")
	flag.Parse()
	ctx := context.Background()
	payload := make([]byte, *size)
	rand.Read(payload)
	dir, err := os.MkdirTemp("", "triad-bench-")
	check(err)
	defer os.RemoveAll(dir)

	// Local: API vs plain file write (with fsync, as the store does) and read.
	ld := filepath.Join(dir, "local")
	lb, err := local.NewBlobs(ld)
	check(err)
	lx, err := local.NewIndex(ld)
	check(err)
	report("local", *n, serve(tmpfs.New(lb, lx, nil)), payload, func() (time.Duration, time.Duration) {
		p := filepath.Join(dir, "plain.bin")
		t0 := time.Now()
		f, err := os.Create(p)
		check(err)
		_, err = f.Write(payload)
		check(err)
		check(f.Sync())
		check(f.Close())
		w := time.Since(t0)
		t0 = time.Now()
		f, err = os.Open(p)
		check(err)
		_, err = io.Copy(io.Discard, f)
		check(err)
		f.Close()
		return w, time.Since(t0)
	})

	if *minioBin == "" {
		fmt.Println("s3: skipped (no -minio / TRIAD_MINIO_BIN)")
	} else {
		endpoint, stop := startMinio(*minioBin, filepath.Join(dir, "minio"))
		defer stop()
		mc, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4("bench", "bench-secret-key", "")})
		check(err)
		check(mc.MakeBucket(ctx, "raw", minio.MakeBucketOptions{}))
		sb, sx, err := s3.New(ctx, s3.Config{Endpoint: endpoint, Bucket: "triad", AccessKey: "bench", SecretKey: "bench-secret-key"})
		check(err)
		i := 0
		report("s3", *n, serve(tmpfs.New(sb, sx, nil)), payload, func() (time.Duration, time.Duration) {
			i++
			key := fmt.Sprintf("raw-%d", i)
			t0 := time.Now()
			_, err := mc.PutObject(ctx, "raw", key, bytes.NewReader(payload), int64(len(payload)), minio.PutObjectOptions{ContentType: "application/octet-stream"})
			check(err)
			w := time.Since(t0)
			t0 = time.Now()
			o, err := mc.GetObject(ctx, "raw", key, minio.GetObjectOptions{})
			check(err)
			_, err = io.Copy(io.Discard, o)
			check(err)
			o.Close()
			return w, time.Since(t0)
		})
	}
	if *rss {
		measureRSS(dir)
	}
}

func serve(store *tmpfs.Store) string {
	orch := orchestrator.New(orchestrator.Config{Store: store})
	return httptest.NewServer(api.New(api.Config{Orchestrator: orch})).URL
}

// report measures n rounds of a fresh payload (so dedup never short-cuts a
// write) through the API and through the raw baseline.
func report(name string, n int, url string, payload []byte, raw func() (time.Duration, time.Duration)) {
	var aw, ar, rw, rr []time.Duration
	for i := 0; i < n; i++ {
		payload[0], payload[1] = byte(i), byte(i>>8) // a new blob each round
		t0 := time.Now()
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/tmp/files/bench/%d.bin", url, i), bytes.NewReader(payload))
		req.Header.Set("X-Run-Id", "bench")
		resp, err := http.DefaultClient.Do(req)
		check(err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			panic(fmt.Sprintf("PUT: %d", resp.StatusCode))
		}
		aw = append(aw, time.Since(t0))
		t0 = time.Now()
		req, _ = http.NewRequest(http.MethodGet, fmt.Sprintf("%s/tmp/files/bench/%d.bin", url, i), nil)
		req.Header.Set("X-Run-Id", "bench")
		resp, err = http.DefaultClient.Do(req)
		check(err)
		got, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got != int64(len(payload)) {
			panic("short read")
		}
		ar = append(ar, time.Since(t0))
		w, r := raw()
		rw, rr = append(rw, w), append(rr, r)
	}
	mb := float64(len(payload)) / (1 << 20)
	fmt.Printf("%s write: api %v (%.0f MiB/s)  raw %v (%.0f MiB/s)  ratio %.2f\n", name, med(aw), mb/med(aw).Seconds(), med(rw), mb/med(rw).Seconds(), med(rw).Seconds()/med(aw).Seconds())
	fmt.Printf("%s read:  api %v (%.0f MiB/s)  raw %v (%.0f MiB/s)  ratio %.2f\n", name, med(ar), mb/med(ar).Seconds(), med(rr), mb/med(rr).Seconds(), med(rr).Seconds()/med(ar).Seconds())
}

func med(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func startMinio(bin, dir string) (string, func()) {
	port := freePort()
	cmd := exec.Command(bin, "server", dir, "--address", "127.0.0.1:"+strconv.Itoa(port), "--console-address", "127.0.0.1:"+strconv.Itoa(freePort()))
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER=bench", "MINIO_ROOT_PASSWORD=bench-secret-key")
	check(cmd.Start())
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	for i := 0; i < 300; i++ {
		if r, err := http.Get(url + "/minio/health/ready"); err == nil && r.StatusCode == 200 {
			r.Body.Close()
			return url, func() { cmd.Process.Kill(); cmd.Wait() }
		}
		time.Sleep(100 * time.Millisecond)
	}
	panic("minio did not start")
}

// measureRSS streams 1 GiB into a real triad serve process and reads its
// peak RSS from /proc.
func measureRSS(dir string) {
	bin := filepath.Join(dir, "triad")
	build := exec.Command("go", "build", "-o", bin, "./cmd/triad")
	build.Stderr = os.Stderr
	check(build.Run())
	addr := "127.0.0.1:" + strconv.Itoa(freePort())
	srv := exec.Command(bin, "serve", "--addr", addr, "--data", filepath.Join(dir, "rss"), "--sandbox", "none", "--log-level", "warn")
	check(srv.Start())
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for i := 0; i < 100; i++ {
		if r, err := http.Get("http://" + addr + "/healthz"); err == nil {
			r.Body.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The server's own footprint first (the embedded interpreters, the
	// journal), after one small journaled call, so that the upload's share
	// of the peak can be told apart.
	small, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/tmp/files/small.txt", strings.NewReader("hello"))
	small.Header.Set("X-Run-Id", "rss")
	if r, err := http.DefaultClient.Do(small); err == nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	base := procStatus(srv.Process.Pid, "VmRSS:")
	const gib = 1 << 30
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/tmp/files/one-gib.bin", io.LimitReader(rand.Reader, gib))
	req.ContentLength = gib
	req.Header.Set("X-Run-Id", "rss")
	// VmHWM is a lifetime mark (startup included), so sample VmRSS while
	// the upload runs.
	stop := make(chan struct{})
	peakc := make(chan int64)
	go func() {
		peak := base
		for {
			if v := procStatus(srv.Process.Pid, "VmRSS:"); v > peak {
				peak = v
			}
			select {
			case <-stop:
				peakc <- peak
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	check(err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(stop)
	peak := <-peakc
	fmt.Printf("1 GiB streamed upload: HTTP %d in %v; server RSS before %d MiB, peak during the upload %d MiB (+%d MiB)\n",
		resp.StatusCode, time.Since(t0).Round(time.Millisecond), base>>10, peak>>10, (peak-base)>>10)
}

// procStatus reads a kB field of /proc/PID/status.
func procStatus(pid int, field string) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, field) {
			kb, _ := strconv.ParseInt(strings.Fields(strings.TrimPrefix(l, field))[0], 10, 64)
			return kb
		}
	}
	return 0
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
