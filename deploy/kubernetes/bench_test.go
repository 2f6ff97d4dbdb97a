package kubernetes_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The figures behind the kube backend's transport (docs/DECISIONS.md,
// "Kubernetes"). Run with
//
//	eval "$(scripts/kube.sh up)"; go test -run '^$' -bench . -benchtime 20x ./deploy/kubernetes/
//
// BenchmarkLoopbackEcho is the baseline of BenchmarkPortForwardEcho: the
// same exchange over a plain loopback TCP connection on Triad's host.

// BenchmarkPodReady creates a kernel pod and waits for Ready; deleting it
// is not timed.
func BenchmarkPodReady(b *testing.B) {
	c := needCluster(b)
	for b.Loop() {
		ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
		p, err := c.triadClient.CoreV1().Pods(c.namespace).Create(ctx, c.kernelPod("sleep", "infinity"), metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		_, err = c.waitReady(ctx, p)
		cancel()
		b.StopTimer()
		c.deletePod(p.Name)
		b.StartTimer()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// loopbackServer runs a pod serving /tmp on 127.0.0.1:8000 and returns it
// and a port-forward connection to it once the server answers.
func loopbackServer(b *testing.B, c *cluster) (*corev1.Pod, *forwarder) {
	pod := c.runPod(b, c.kernelPod("python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp"))
	if _, stderr, err := execIn(b.Context(), c.triad, pod, false, strings.NewReader("ok\n"), "sh", "-c", "cat > /tmp/ok.txt"); err != nil {
		b.Fatalf("exec: %v %s", err, stderr)
	}
	fw, err := forward(c.triad, pod)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fw.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := httpGet(fw, 8000, "/ok.txt"); err == nil {
			return pod, fw
		} else if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkPortForwardConnect opens (and closes) the port-forward
// connection itself: the API server and kubelet upgrade, once per pod.
func BenchmarkPortForwardConnect(b *testing.B) {
	c := needCluster(b)
	pod, _ := loopbackServer(b, c) // its connection stays open meanwhile, as Triad's would
	for b.Loop() {
		f, err := forward(c.triad, pod)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkPortForwardGET opens a new TCP connection in the pod over an
// open port-forward connection and does one HTTP/1.0 GET on it: what a ZMQ
// socket's dial costs, plus one exchange.
func BenchmarkPortForwardGET(b *testing.B) {
	c := needCluster(b)
	_, fw := loopbackServer(b, c)
	for b.Loop() {
		if resp, err := httpGet(fw, 8000, "/ok.txt"); err != nil || !strings.HasSuffix(resp, "\r\n\r\nok\n") {
			b.Fatalf("got %q, %v", resp, err)
		}
	}
}

// echoServer answers every TCP connection on 127.0.0.1:9000 with what it
// reads.
const echoServer = `import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9000))
s.listen()
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while d := c.recv(65536):
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// BenchmarkPortForwardEcho sends a 64-byte message over one forwarded TCP
// connection that stays open, and reads the echo: the per-message cost a
// kernel's ZMQ traffic pays. BenchmarkLoopbackEcho is its baseline.
func BenchmarkPortForwardEcho(b *testing.B) {
	c := needCluster(b)
	pod := c.runPod(b, c.kernelPod("python3", "-c", echoServer))
	fw, err := forward(c.triad, pod)
	if err != nil {
		b.Fatal(err)
	}
	defer fw.Close()
	var s *stream
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err = fw.Dial(9000)
		if err != nil {
			b.Fatal(err)
		}
		if err = echoOnce(s); err == nil {
			break
		}
		s.Release()
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer s.Release()
	for b.Loop() {
		if err := echoOnce(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoopbackEcho(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	for b.Loop() {
		if err := echoOnce(conn); err != nil {
			b.Fatal(err)
		}
	}
}

var echoMsg = []byte(strings.Repeat("x", 63) + "\n")

func echoOnce(rw io.ReadWriter) error {
	if _, err := rw.Write(echoMsg); err != nil {
		return err
	}
	buf := make([]byte, len(echoMsg))
	if _, err := io.ReadFull(rw, buf); err != nil {
		return err
	}
	if string(buf) != string(echoMsg) {
		return fmt.Errorf("got %q back", buf)
	}
	return nil
}

// BenchmarkExecNew runs `true` in a new exec session each time: the cost
// of one exec round trip.
func BenchmarkExecNew(b *testing.B) {
	c := needCluster(b)
	pod := c.runPod(b, c.kernelPod("sleep", "infinity"))
	for b.Loop() {
		if _, stderr, err := execIn(b.Context(), c.triad, pod, false, nil, "true"); err != nil {
			b.Fatalf("exec: %v %s", err, stderr)
		}
	}
}

// BenchmarkExecSessionEcho sends a line through one long-lived exec of cat
// and reads it back: the per-message cost of the file agent's session.
func BenchmarkExecSessionEcho(b *testing.B) {
	c := needCluster(b)
	pod := c.runPod(b, c.kernelPod("sleep", "infinity"))
	s := c.echo(b.Context(), pod)
	if err := s.roundTrip("warm-up"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := s.roundTrip("ping"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := s.close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkExecStdout reads 16 MiB from a command's stdout over exec: the
// file agent's download direction (open).
func BenchmarkExecStdout(b *testing.B) {
	c := needCluster(b)
	pod := c.runPod(b, c.kernelPod("sleep", "infinity"))
	const n = 16 << 20
	for _, proto := range []struct {
		name      string
		websocket bool
	}{{"SPDY", false}, {"WebSocket", true}} {
		b.Run(proto.name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				var got countWriter
				if err := execStream(b.Context(), c.triad, pod, proto.websocket, nil, &got, io.Discard, "head", "-c", fmt.Sprint(n), "/dev/zero"); err != nil || got != n {
					b.Fatalf("got %d bytes, %v", got, err)
				}
			}
		})
	}
}

// BenchmarkPortForwardRead reads 16 MiB from a server in the pod over one
// forwarded connection.
func BenchmarkPortForwardRead(b *testing.B) {
	c := needCluster(b)
	const n = 16 << 20
	pod := c.runPod(b, c.kernelPod("python3", "-c", fmt.Sprintf(`import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9001))
s.listen()
zeros = bytes(%d)
while True:
    c, _ = s.accept()
    c.sendall(zeros)
    c.close()
`, n)))
	fw, err := forward(c.triad, pod)
	if err != nil {
		b.Fatal(err)
	}
	defer fw.Close()
	read := func() (int64, error) {
		s, err := fw.Dial(9001)
		if err != nil {
			return 0, err
		}
		defer s.Release()
		s.Close()
		return io.Copy(io.Discard, s)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got, _ := read(); got == n {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("no server in the pod: read %d bytes", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.SetBytes(n)
	for b.Loop() {
		if got, err := read(); err != nil || got != n {
			b.Fatalf("got %d bytes, %v", got, err)
		}
	}
}

// BenchmarkExecStdin writes 16 MiB to a command's stdin over exec: the file
// agent's upload direction (put).
func BenchmarkExecStdin(b *testing.B) {
	c := needCluster(b)
	pod := c.runPod(b, c.kernelPod("sleep", "infinity"))
	const n = 16 << 20
	b.SetBytes(n)
	for b.Loop() {
		var out strings.Builder
		if err := execStream(b.Context(), c.triad, pod, false, io.LimitReader(zeros{}, n), &out, io.Discard, "wc", "-c"); err != nil || strings.TrimSpace(out.String()) != fmt.Sprint(n) {
			b.Fatalf("got %q, %v", out.String(), err)
		}
	}
}

type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) { *w += countWriter(len(p)); return len(p), nil }

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
