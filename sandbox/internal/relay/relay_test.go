package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox"
)

// forwarderProc runs the forwarder on this host, as a sandbox would, with
// its host endpoint in a temporary directory and its proxy port free.
type forwarderProc struct {
	sock  string
	proxy string
	cmd   *exec.Cmd
}

func startForwarder(t *testing.T, sock, proxy string) *forwarderProc {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3")
	}
	cmd := exec.Command("python3", "-I", "-S", "-c", Script(), "unix:"+sock, proxy)
	stderr := &testenv.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &forwarderProc{sock: sock, proxy: proxy, cmd: cmd}
	t.Cleanup(func() {
		f.stop()
		if t.Failed() {
			t.Logf("forwarder stderr:\n%s", stderr)
		}
	})
	return f
}

func (f *forwarderProc) stop() {
	if f.cmd.Process != nil {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func unixDial(path string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// dialProxy connects to the forwarder's proxy port as a process in the
// sandbox would, waiting for it to listen.
func dialProxy(t *testing.T, addr string) net.Conn {
	t.Helper()
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			return c
		}
		if !strings.Contains(err.Error(), "refused") {
			t.Fatal(err)
		}
	}
}

// echo serves every connection the link hands over: it echoes until EOF,
// then half-closes.
func echo(ctx context.Context, l *Link, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_, _ = io.Copy(c, c)
			_ = c.(*net.UnixConn).CloseWrite()
		}()
	}
}

func TestScriptQuotable(t *testing.T) {
	t.Parallel()
	if strings.Contains(Script(), "'") {
		t.Error("the forwarder's source holds a single quote; it is quoted for sh")
	}
	if !strings.Contains(Script(), `PROXY = ("127.0.0.1", 3128)`) {
		t.Error("the forwarder does not listen at sandbox.EgressAddr")
	}
}

// TestNoLink: with no host connection, a process is refused at once, with
// a message that says why.
func TestNoLink(t *testing.T) {
	t.Parallel()
	f := startForwarder(t, filepath.Join(t.TempDir(), "egress"), freePort(t))
	c := dialProxy(t, f.proxy)
	defer c.Close()
	io.WriteString(c, "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 403 Triad egress denied: this run has no egress policy")) {
		t.Errorf("got %q, want the forwarder's refusal", b)
	}
}

// TestRelay: once Ready, each connection reaches Accept and its bytes go
// both ways, intact, with half-closes passed on, for many connections at
// once.
func TestRelay(t *testing.T) {
	t.Parallel()
	f := startForwarder(t, filepath.Join(t.TempDir(), "egress"), freePort(t))
	l := NewLink(unixDial(f.sock), nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go echo(ctx, l, &wg)
	defer func() {
		cancel()
		l.Close()
		wg.Wait()
	}()
	if err := l.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	var cw sync.WaitGroup
	for i := range 12 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			size := 1 << 10
			if i == 0 {
				size = 10 << 20
			}
			payload := make([]byte, size)
			rand.Read(payload)
			c := dialProxy(t, f.proxy)
			defer c.Close()
			go func() {
				c.Write(payload)
				c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil || sha256.Sum256(got) != sha256.Sum256(payload) {
				t.Errorf("connection %d: %d bytes back (%v), want the %d sent", i, len(got), err, len(payload))
			}
		}()
	}
	cw.Wait()
}

// TestForwarderRestart: a forwarder that goes away and comes back (its
// kernel restarted) is dialled again, and Ready says when.
func TestForwarderRestart(t *testing.T) {
	t.Parallel()
	sock, proxy := filepath.Join(t.TempDir(), "egress"), freePort(t)
	f := startForwarder(t, sock, proxy)
	l := NewLink(unixDial(sock), nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go echo(ctx, l, &wg)
	defer func() {
		cancel()
		l.Close()
		wg.Wait()
	}()
	if err := l.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.stop()
	f = startForwarder(t, sock, proxy)
	if err := l.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := dialProxy(t, proxy)
	defer c.Close()
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	if got, _ := io.ReadAll(c); string(got) != "ping" {
		t.Errorf("after the restart got %q, want the echo", got)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	l := NewLink(func(ctx context.Context) (net.Conn, error) { return nil, errors.New("nothing there") }, nil)
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		done <- err
	}()
	l.Close()
	if err := <-done; !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Accept after Close: %v, want ErrClosed", err)
	}
	if err := l.Ready(context.Background()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Ready after Close: %v, want ErrClosed", err)
	}
	l.Close()
}

// TestDialPort: the host reaches a port on the sandbox's loopback through
// the forwarder's ports socket, bytes both ways, with the half-close passed
// on; a port nothing listens on, and a request that is no port, fail with
// ErrNoListener and a reason.
func TestDialPort(t *testing.T) {
	t.Parallel()
	f := startForwarder(t, filepath.Join(t.TempDir(), "egress"), freePort(t))
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	port := srv.Addr().(*net.TCPAddr).Port
	dial := unixDial(f.sock + PortsSuffix)
	// The forwarder listens once it has started: wait for its socket.
	dialProxy(t, f.proxy).Close()
	c, err := DialPort(t.Context(), dial, port)
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("getHost "), 1<<14)
	go func() {
		c.Write(msg)
		c.(*net.UnixConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || !bytes.Equal(got, msg) {
		t.Errorf("echo through the ports socket: got %d bytes (%v), want %d", len(got), err, len(msg))
	}
	closed := freePort(t)
	_, p, _ := net.SplitHostPort(closed)
	var n int
	fmt.Sscan(p, &n)
	for _, port := range []int{n, 0, 70000} {
		if _, err := DialPort(t.Context(), dial, port); !errors.Is(err, sandbox.ErrNoListener) {
			t.Errorf("port %d: got %v, want ErrNoListener", port, err)
		}
	}
}
