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
// Two more rows put the read in context: the same bytes read by hash
// (GET /blobs/{sha}, which records no journal step), and the same bytes
// served over loopback HTTP by a bare Go server with no Triad in it
// (http.ServeContent of the plain file, which uses sendfile; for s3 a proxy
// that copies GetObject to the response without hashing), the most any
// HTTP server on this machine can do. Then it starts a real `triad serve`
// per backend, streams 1 GiB to PUT /tmp/files and reports the server's
// peak RSS.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
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
	"github.com/triadhq/triad/internal/procmem"
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
	plain := filepath.Join(dir, "plain.bin")
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(plain)
		check(err)
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", time.Time{}, f)
	}))
	report("local", *n, serve(tmpfs.New(lb, lx, nil)), payload, baseline{
		raw: func(int) (time.Duration, time.Duration) {
			t0 := time.Now()
			f, err := os.Create(plain)
			check(err)
			_, err = f.Write(payload)
			check(err)
			check(f.Sync())
			check(f.Close())
			w := time.Since(t0)
			t0 = time.Now()
			f, err = os.Open(plain)
			check(err)
			_, err = io.Copy(io.Discard, f)
			check(err)
			f.Close()
			return w, time.Since(t0)
		},
		bare: func(int) string { return bare.URL },
		what: "a plain file read (page cache)", bareWhat: "http.ServeContent of the plain file (sendfile)",
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
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			o, err := mc.GetObject(r.Context(), "raw", strings.TrimPrefix(r.URL.Path, "/"), minio.GetObjectOptions{})
			check(err)
			defer o.Close()
			st, err := o.Stat()
			check(err)
			w.Header().Set("Content-Length", strconv.FormatInt(st.Size, 10))
			io.Copy(w, o)
		}))
		report("s3", *n, serve(tmpfs.New(sb, sx, nil)), payload, baseline{
			raw: func(i int) (time.Duration, time.Duration) {
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
			},
			bare: func(i int) string { return fmt.Sprintf("%s/raw-%d", proxy.URL, i) },
			what: "minio-go PutObject/GetObject", bareWhat: "a Go proxy copying GetObject to the response (no hashing)",
		})
		if *rss {
			measureRSS(dir, "s3", "--store", "s3", "--s3-endpoint", endpoint, "--s3-bucket", "rss",
				"--s3-access-key", "bench", "--s3-secret-key", "bench-secret-key")
		}
	}
	if *rss {
		measureRSS(dir, "local")
	}
}

func serve(store *tmpfs.Store) string {
	orch := orchestrator.New(orchestrator.Config{Store: store})
	return httptest.NewServer(api.New(api.Config{Orchestrator: orch})).URL
}

// baseline is what the API is measured against in each round.
type baseline struct {
	// raw writes and reads round i's payload without Triad.
	raw func(i int) (write, read time.Duration)
	// bare is the URL of round i's payload on a bare HTTP server.
	bare           func(i int) string
	what, bareWhat string
}

// report measures n rounds of a fresh payload (so dedup never short-cuts a
// write) through the API and through the baselines, interleaved so that
// load on the machine falls on all of them alike.
func report(name string, n int, url string, payload []byte, b baseline) {
	var aw, ar, ah, rw, rr, br []time.Duration
	for i := 0; i < n; i++ {
		payload[0], payload[1] = byte(i), byte(i>>8) // a new blob each round
		t0 := time.Now()
		req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/tmp/files/bench/%d.bin", url, i), bytes.NewReader(payload))
		req.Header.Set("X-Run-Id", "bench")
		resp, err := http.DefaultClient.Do(req)
		check(err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			panic(fmt.Sprintf("PUT: %d %s", resp.StatusCode, body))
		}
		aw = append(aw, time.Since(t0))
		var ref struct {
			SHA256 string `json:"sha256"`
		}
		check(json.Unmarshal(body, &ref))
		ar = append(ar, get(fmt.Sprintf("%s/tmp/files/bench/%d.bin", url, i), len(payload)))
		ah = append(ah, get(url+"/blobs/"+ref.SHA256, len(payload)))
		w, r := b.raw(i)
		rw, rr = append(rw, w), append(rr, r)
		br = append(br, get(b.bare(i), len(payload)))
	}
	mb := float64(len(payload)) / (1 << 20)
	rate := func(d []time.Duration) string { return fmt.Sprintf("%v (%.0f MiB/s)", med(d), mb/med(d).Seconds()) }
	ratio := func(base, x []time.Duration) float64 { return med(base).Seconds() / med(x).Seconds() }
	fmt.Printf("%s write: api %s  raw %s  ratio %.2f\n", name, rate(aw), rate(rw), ratio(rw, aw))
	fmt.Printf("%s read:  api %s  raw %s  ratio %.2f\n", name, rate(ar), rate(rr), ratio(rr, ar))
	fmt.Printf("%s read by hash (GET /blobs, no journal step): %s  ratio to raw %.2f\n", name, rate(ah), ratio(rr, ah))
	fmt.Printf("%s read by a bare HTTP server (%s): %s  ratio to raw %.2f; the api reaches %.2f of it\n",
		name, b.bareWhat, rate(br), ratio(rr, br), ratio(br, ar))
	fmt.Printf("%s raw baseline: %s\n", name, b.what)
}

// get downloads url (as run "bench") and returns how long it took.
func get(url string, size int) time.Duration {
	t0 := time.Now()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Run-Id", "bench")
	resp, err := http.DefaultClient.Do(req)
	check(err)
	got, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got != int64(size) || resp.StatusCode != 200 {
		panic(fmt.Sprintf("GET %s: %d, %d of %d bytes", url, resp.StatusCode, got, size))
	}
	return time.Since(t0)
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

// measureRSS streams 1 GiB into a real triad serve process over the given
// store and reads its RSS from /proc while the upload runs.
func measureRSS(dir, name string, store ...string) {
	bin := filepath.Join(dir, "triad")
	if _, err := os.Stat(bin); err != nil {
		build := exec.Command("go", "build", "-o", bin, "./cmd/triad")
		build.Stderr = os.Stderr
		check(build.Run())
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort())
	args := append([]string{"serve", "--addr", addr, "--data", filepath.Join(dir, "rss-"+name), "--sandbox", "none", "--log-level", "warn"}, store...)
	srv := exec.Command(bin, args...)
	srv.Stderr = os.Stderr
	check(srv.Start())
	defer func() { srv.Process.Kill(); srv.Wait() }()
	// Startup takes seconds on a loaded machine; wait for it, boundedly.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			r.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			panic("triad serve did not answer: " + err.Error())
		}
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
	// The call is recorded (and graded) after its answer: wait for that
	// (GET /cel settles the run), so that its share, the evaluator's
	// interpreter included when its rubric needs it, is in the base and
	// not in the upload's peak.
	settle, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/cel", nil)
	settle.Header.Set("X-Run-Id", "rss")
	if r, err := http.DefaultClient.Do(settle); err == nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	base := procStatus(srv.Process.Pid, "VmRSS")
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
			if v := procStatus(srv.Process.Pid, "VmRSS"); v > peak {
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
	fmt.Printf("%s: 1 GiB streamed upload: HTTP %d in %v; server RSS before %d MiB, peak during the upload %d MiB (+%d MiB)\n",
		name, resp.StatusCode, time.Since(t0).Round(time.Millisecond), base>>10, peak>>10, (peak-base)>>10)
}

// procStatus returns a field of a process's /proc status, in KiB.
func procStatus(pid int, field string) int64 {
	f, err := procmem.Status(pid)
	check(err)
	return f[field] >> 10
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
