// Package miniotest runs a real MinIO server process for a test, so S3 code is tested against the real thing.
//
// New starts a server that belongs to one test and can be stopped and started
// again on the same port and data directory, to prove that data survives a
// restart and that clients fail fast while it is down. Shared returns one
// server started once per test binary, because MinIO takes a second or two to
// start; every call still gets its own bucket name.
//
// The binary comes from TRIAD_MINIO_BIN, else `minio` on PATH, else the cache
// that scripts/minio.sh install fills. Without one the test is skipped
// locally and fails under CI (see internal/testenv).
package miniotest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/triadhq/triad/internal/testenv"
)

// Version is the pinned MinIO module version, the one scripts/minio.sh
// builds and caches. Keep the two in sync (TestScriptPinsSameVersion checks).
const Version = "v0.0.0-20260212201848-7aac2a2c5b7c"

// The fixed credentials every server started here accepts. They are test
// credentials for a server that only listens on loopback.
const (
	AccessKey = "triad-test"
	SecretKey = "triad-test-secret"
)

// Bounds on process lifecycle. Startup is normally well under two seconds;
// the bound only turns a wedged server into a clear failure.
const (
	startTimeout = 60 * time.Second
	stopTimeout  = 15 * time.Second
)

// Server is a running (or stopped) MinIO server as one test sees it.
type Server struct {
	// Endpoint is the server's URL, http://127.0.0.1:PORT.
	Endpoint string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// Bucket is a bucket name unique to this call. The bucket is not
	// created, so code under test can prove it creates missing buckets.
	Bucket string

	t      testing.TB
	p      *proc
	shared bool
}

// New starts a MinIO server for t alone, on a free loopback port with its
// own data directory. It is stopped and its data removed when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	p := &proc{bin: bin, dir: dir}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("stop MinIO: %v", err)
		}
	})
	if err := p.startFreePort(); err != nil {
		t.Fatalf("start MinIO: %v", err)
	}
	return p.server(t, false)
}

var shared struct {
	mu  sync.Mutex
	p   *proc
	err error
}

// Shared returns the test binary's shared MinIO server, starting it on first
// use, with a fresh bucket name for this call. Stop and Start refuse to act
// on it (other tests are using it). It stops when the test binary exits, or
// earlier if TestMain calls StopShared.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.p == nil && shared.err == nil {
		sweepStale()
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", sharedPrefix, os.Getpid()))
		if err != nil {
			shared.err = err
		} else {
			p := &proc{bin: bin, dir: dir}
			if err := p.startFreePort(); err != nil {
				os.RemoveAll(dir)
				shared.err = err
			} else {
				shared.p = p
			}
		}
	}
	if shared.err != nil {
		t.Fatalf("start shared MinIO: %v", shared.err)
	}
	return shared.p.server(t, true)
}

// StopShared stops the shared server, if one was started, and removes its
// data. Call it from TestMain after m.Run; without it the server is stopped
// when the test binary exits (on Linux) and its data swept by the next run.
func StopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.p == nil {
		return nil
	}
	err := shared.p.stop()
	os.RemoveAll(shared.p.dir)
	shared.p = nil
	shared.err = errors.New("the shared MinIO server was stopped by StopShared")
	return err
}

// Stop stops the server (SIGTERM, then wait) as if it crashed or was taken
// down for maintenance. Its port and data are kept for Start.
func (s *Server) Stop() {
	s.t.Helper()
	if s.shared {
		s.t.Fatal("miniotest: cannot stop the shared MinIO server; use miniotest.New for a server of your own")
	}
	if err := s.p.stop(); err != nil {
		s.t.Fatalf("stop MinIO: %v", err)
	}
}

// Start starts a stopped server again on the same port and data directory.
func (s *Server) Start() {
	s.t.Helper()
	if s.shared {
		s.t.Fatal("miniotest: cannot restart the shared MinIO server; use miniotest.New for a server of your own")
	}
	if err := s.p.start(); err != nil {
		s.t.Fatalf("restart MinIO: %v", err)
	}
}

// Freeze suspends the server process (SIGSTOP): it keeps its port and
// accepts connections but answers nothing, like a hung or overloaded
// service. Thaw resumes it; Stop thaws first. Not available on Windows.
func (s *Server) Freeze() {
	s.t.Helper()
	if s.shared {
		s.t.Fatal("miniotest: cannot freeze the shared MinIO server; use miniotest.New for a server of your own")
	}
	if err := s.p.signal(true); err != nil {
		s.t.Fatalf("freeze MinIO: %v", err)
	}
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() {
	s.t.Helper()
	if err := s.p.signal(false); err != nil {
		s.t.Fatalf("thaw MinIO: %v", err)
	}
}

// Client returns a minio-go client for the server with root credentials,
// for tests that inspect or tamper with the bucket directly. It retries a
// failed request once, so a call to a stopped server fails at once.
func (s *Server) Client() *minio.Client {
	s.t.Helper()
	c, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds:      credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:     "us-east-1",
		MaxRetries: 2,
	})
	if err != nil {
		s.t.Fatalf("minio client: %v", err)
	}
	return c
}

// Binary returns the MinIO server binary to run: TRIAD_MINIO_BIN, else
// `minio` on PATH, else the pinned build cached by scripts/minio.sh. If there
// is none, the test is skipped locally and fails under CI.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("TRIAD_MINIO_BIN"); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			t.Fatalf("TRIAD_MINIO_BIN=%s is not an executable file", p)
		}
		return p
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p
	}
	if p := CachedBinary(); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testenv.Missing(t, "the MinIO server binary (TRIAD_MINIO_BIN; scripts/minio.sh install builds it)")
	return ""
}

// CachedBinary is where scripts/minio.sh install puts the pinned build:
// ${TRIAD_CACHE:-$HOME/.cache/triad}/minio/<Version>/bin/minio. It returns ""
// when neither TRIAD_CACHE nor a home directory is known.
func CachedBinary() string {
	cache := os.Getenv("TRIAD_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache", "triad")
	}
	return filepath.Join(cache, "minio", Version, "bin", "minio")
}

func (p *proc) server(t testing.TB, shared bool) *Server {
	return &Server{
		Endpoint:  "http://" + p.addr(),
		AccessKey: AccessKey,
		SecretKey: SecretKey,
		Bucket:    bucketName(t),
		t:         t,
		p:         p,
		shared:    shared,
	}
}

// bucketName builds a valid S3 bucket name (3-63 of [a-z0-9-]) from the
// test's name and random bytes, so a bucket in a listing names its test.
func bucketName(t testing.TB) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == "" {
		name = "t"
	}
	var rnd [5]byte
	rand.Read(rnd[:])
	return name + "-" + hex.EncodeToString(rnd[:])
}

// proc is one MinIO process slot: a binary, a data directory and a port that
// stays fixed across restarts.
type proc struct {
	bin  string
	dir  string // holds data/ and minio.log
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// startFreePort picks a free loopback port and starts there. Another process
// can take the port between the probe and MinIO's bind, so it tries a few.
func (p *proc) startFreePort() error {
	var err error
	for range 3 {
		var port int
		port, err = freePort()
		if err != nil {
			return err
		}
		p.port = port
		if err = p.start(); err == nil {
			return nil
		}
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start launches MinIO and waits until it is ready for S3 requests.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return errors.New("MinIO is already running")
		}
	}
	data := filepath.Join(p.dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(p.dir, "minio.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, "server", data, "--address", p.addr(), "--quiet")
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off", // no console listener on a random port
		"MINIO_UPDATE=off",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// With a parent-death signal (Linux), the child is killed when the
		// OS thread that forked it exits, not when the process does. This
		// goroutine holds that thread until the child exits, so the signal
		// fires exactly when the test binary dies.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return fmt.Errorf("run %s: %w", p.bin, err)
	}
	p.cmd, p.done = cmd, done

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	client, err := minio.New(p.addr(), &minio.Options{
		Creds:      credentials.NewStaticV4(AccessKey, SecretKey, ""),
		Region:     "us-east-1",
		MaxRetries: 1,
	})
	if err != nil {
		p.kill()
		return err
	}
	for {
		if p.ready(ctx, client) {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("MinIO exited during startup on %s: %s", p.addr(), tail(logPath))
		case <-ctx.Done():
			p.kill()
			return fmt.Errorf("MinIO was not live on %s after %s: %s", p.addr(), startTimeout, tail(logPath))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ready reports whether the server answers S3 requests. MinIO's liveness
// check answers 200 before its object layer is up (it only adds an
// "X-Minio-Server-Status: unavailable" header), and requests made then fail
// with 503 XMinioServerNotInitialized, so readiness is a live check without
// that header followed by a signed ListBuckets that succeeds.
func (p *proc) ready(ctx context.Context, c *minio.Client) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr()+"/minio/health/live", nil)
	if err != nil {
		return false
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("X-Minio-Server-Status") != "" {
		return false
	}
	_, err = c.ListBuckets(ctx)
	return err == nil
}

// stop sends SIGTERM and waits for the process to exit, killing it if it
// takes longer than stopTimeout. Stopping a stopped server does nothing.
func (p *proc) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	// A frozen process would hold SIGTERM until resumed.
	if err := suspend(p.cmd.Process, false); err != nil {
		return err
	}
	if err := terminate(p.cmd.Process); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		p.kill()
		return fmt.Errorf("MinIO ignored SIGTERM for %s and was killed", stopTimeout)
	}
}

// signal suspends (stop) or resumes the running process.
func (p *proc) signal(stop bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("MinIO is not running")
	}
	select {
	case <-p.done:
		return errors.New("MinIO is not running")
	default:
	}
	return suspend(p.cmd.Process, stop)
}

// kill ends the process hard and waits for it. Called with p.mu held.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// tail returns the end of MinIO's log, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(empty log)"
	}
	return "log tail:\n" + s
}

// CorruptBlob damages the stored bytes of the tmpfs/s3 blob whose sha256
// is hexDigest, as damage below the store would: the bytes its name leads
// to (its object, or the upload its manifest names) are rewritten with the
// middle one flipped and the object's metadata kept.
func (s *Server) CorruptBlob(t testing.TB, hexDigest string) {
	t.Helper()
	key := "blobs/sha256/" + hexDigest
	info, err := s.Client().StatObject(t.Context(), s.Bucket, key, minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if data := info.Metadata.Get("X-Amz-Meta-Triad-Data"); data != "" {
		key = data
	}
	s.FlipByte(t, key, -1)
}

// FlipByte rewrites object key with its byte at off (-1: the middle one)
// flipped, keeping the object's metadata.
func (s *Server) FlipByte(t testing.TB, key string, off int64) {
	t.Helper()
	ctx, mc := t.Context(), s.Client()
	o, err := mc.GetObject(ctx, s.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := o.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(o)
	o.Close()
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off = int64(len(b) / 2)
	}
	b[off] ^= 0x20
	if _, err := mc.PutObject(ctx, s.Bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{UserMetadata: info.UserMetadata}); err != nil {
		t.Fatal(err)
	}
}
