package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/internal/testenv"
)

// pair returns the two ends of a connected unix socket pair.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int, name string) net.Conn {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0], "client"), conn(fds[1], "server")
}

// peer is the far end of a connection, played by the test.
type peer struct {
	t  *testing.T
	nc net.Conn
	fr *frameReader
}

func newPeer(t *testing.T, nc net.Conn) *peer {
	return &peer{t: t, nc: nc, fr: &frameReader{r: bufio.NewReader(nc), lim: Limits{}.withDefaults(), name: "peer"}}
}

func (p *peer) write(b []byte) {
	if _, err := p.nc.Write(b); err != nil {
		p.t.Errorf("peer write: %v", err)
	}
}

// greet reads the client's greeting and sends one of version major.minor.
func (p *peer) greet(major, minor byte, mechanism string) []byte {
	got := make([]byte, 64)
	if _, err := io.ReadFull(p.fr.r, got); err != nil {
		p.t.Errorf("peer read greeting: %v", err)
	}
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, major, minor
	copy(g[12:], mechanism)
	p.write(g)
	return got
}

// ready reads the client's READY and answers with one of sockType.
func (p *peer) ready(sockType string) map[string]string {
	frames, command, err := p.fr.readMessage()
	if err != nil || !command {
		p.t.Errorf("peer read READY: %v (command %v)", err, command)
		return nil
	}
	name, data, _ := parseCommand(frames[0])
	md, err := parseProperties(data)
	if name != "READY" || err != nil {
		p.t.Errorf("peer got command %q (%v), want READY", name, err)
	}
	p.write(appendCommand(nil, "READY", appendProperty(nil, "Socket-Type", []byte(sockType))))
	return md
}

// handshake runs Handshake against a peer goroutine doing play, and
// returns the client end and the peer once both are done.
func handshake(t *testing.T, typ SocketType, o Options, play func(p *peer)) (*Conn, *peer, error) {
	t.Helper()
	cn, sn := pair(t)
	p := newPeer(t, sn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		play(p)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := Handshake(ctx, cn, typ, o)
	if err != nil {
		sn.Close() // unblock a peer still waiting
	}
	<-done
	return c, p, err
}

func TestHandshake(t *testing.T) {
	t.Parallel()
	var sent []byte
	var md map[string]string
	c, p, err := handshake(t, Dealer, Options{Identity: []byte("me")}, func(p *peer) {
		sent = p.greet(3, 1, "NULL")
		md = p.ready("ROUTER")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0}, "NULL"...)
	want = append(want, make([]byte, 64-len(want))...)
	if !bytes.Equal(sent, want) {
		t.Errorf("greeting: got %x, want %x", sent, want)
	}
	if diff := cmp.Diff(map[string]string{"socket-type": "DEALER", "identity": "me"}, md); diff != "" {
		t.Errorf("READY properties (-want +got):\n%s", diff)
	}

	// Messages both ways, short and long frames.
	big := bytes.Repeat([]byte("z"), 70<<10)
	go p.write(appendMessage(nil, [][]byte{[]byte("<IDS|MSG>"), {}, big}))
	got, err := c.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0]) != "<IDS|MSG>" || len(got[1]) != 0 || !bytes.Equal(got[2], big) {
		t.Errorf("got %d frames, want the 3 sent", len(got))
	}
	for _, msg := range [][][]byte{{[]byte("a"), []byte("bc")}, {big, []byte("tail")}} {
		errc := make(chan error, 1)
		go func() { errc <- c.WriteMessage(msg...) }()
		back, command, err := p.fr.readMessage()
		if err != nil || command {
			t.Fatalf("peer read: %v (command %v)", err, command)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !cmp.Equal(back, msg) {
			t.Errorf("peer got %d frames, want %d unchanged", len(back), len(msg))
		}
	}
}

func TestHandshakeRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		typ     SocketType
		play    func(p *peer)
		want    string
		violate bool
	}{
		{"no signature", Dealer, func(p *peer) {
			io.ReadFull(p.fr.r, make([]byte, 64))
			p.write(bytes.Repeat([]byte{'G'}, 64))
		}, "no ZMTP signature", true},
		{"ZMTP 2", Dealer, func(p *peer) { p.greet(2, 0, "NULL") }, "speaks ZMTP 2.0", true},
		{"CURVE", Dealer, func(p *peer) { p.greet(3, 0, "CURVE") }, `mechanism is "CURVE"`, false},
		{"incompatible peer", Dealer, func(p *peer) { p.greet(3, 1, "NULL"); p.ready("PUB") }, `peer socket type "PUB" cannot talk to DEALER`, false},
		{"SUB to a ROUTER", Sub, func(p *peer) { p.greet(3, 1, "NULL"); p.ready("ROUTER") }, "cannot talk to SUB", false},
		{"ERROR instead of READY", Req, func(p *peer) {
			p.greet(3, 1, "NULL")
			p.write(appendCommand(nil, "ERROR", append([]byte{6}, "denied"...)))
		}, `refused the connection: "denied"`, false},
		{"message instead of READY", Dealer, func(p *peer) { p.greet(3, 1, "NULL"); p.write([]byte{0, 1, 'x'}) }, "a message before", true},
		{"huge READY", Dealer, func(p *peer) { p.greet(3, 1, "NULL"); p.write(long(flagCommand, 1<<62)) }, "command of 4611686018427387904 bytes", true},
		{"truncated property", Dealer, func(p *peer) {
			p.greet(3, 1, "NULL")
			p.write(appendCommand(nil, "READY", []byte{11, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e', 0, 0, 1, 0, 'R'}))
		}, "READY: property", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := handshake(t, tc.typ, Options{}, tc.play)
			if err == nil {
				c.Close()
				t.Fatal("got a connection, want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			var v *ViolationError
			if errors.As(err, &v) != tc.violate {
				t.Errorf("got violation %v, want %v", errors.As(err, &v), tc.violate)
			}
		})
	}
}

// TestHandshakeSilentPeer: a peer that accepts but never greets fails the
// handshake when ctx ends instead of hanging.
func TestHandshakeSilentPeer(t *testing.T) {
	t.Parallel()
	cn, _ := pair(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := Handshake(ctx, cn, Dealer, Options{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
}

// connected returns a DEALER connection whose handshake is done, and its
// peer.
func connected(t *testing.T, lim Limits) (*Conn, *peer) {
	t.Helper()
	c, p, err := handshake(t, Dealer, Options{Name: "shell", Limits: lim}, func(p *peer) { p.greet(3, 1, "NULL"); p.ready("ROUTER") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p
}

// TestPingPong: a PING between messages is answered with PONG echoing its
// context, and the message after it is delivered.
func TestPingPong(t *testing.T) {
	t.Parallel()
	c, p := connected(t, Limits{})
	go func() {
		p.write(appendCommand(nil, "PING", []byte{0, 10, 'c', 't', 'x'}))
		p.write(appendCommand(nil, "SUBSCRIBE", []byte("ignored")))
		p.write([]byte{0, 2, 'h', 'i'})
	}()
	got, err := c.ReadMessage()
	if err != nil || len(got) != 1 || string(got[0]) != "hi" {
		t.Fatalf("got %q, %v; want [hi]", got, err)
	}
	frames, command, err := p.fr.readMessage()
	if err != nil || !command || string(frames[0]) != "\x04PONGctx" {
		t.Errorf("peer got %q (command %v, %v), want PONG ctx", frames, command, err)
	}
}

// TestViolationClosesConnection: after a violation the connection is
// closed, so the peer's next write fails instead of filling a buffer nobody
// reads, and the error names the connection.
func TestViolationClosesConnection(t *testing.T) {
	t.Parallel()
	c, p := connected(t, Limits{MaxMessage: 80 << 20})
	p.write(long(0, 1<<62))
	_, err := c.ReadMessage()
	var v *ViolationError
	if !errors.As(err, &v) || v.Conn != "shell" {
		t.Fatalf("got %v, want a violation on shell", err)
	}
	if want := "protocol violation on the shell socket: frame of 4611686018427387904 bytes over the 83886080-byte limit"; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
	if _, err := p.nc.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("peer read after the violation: got %v, want EOF", err)
	}
}

// TestStall: a message that stops arriving part-way is a violation once
// Stall passes without a byte, while an idle connection between messages
// is not.
func TestStall(t *testing.T) {
	t.Parallel()
	// The stall is a second and the slow sender's gaps a hundredth of it,
	// so a loaded machine delaying the sender's wake-ups does not turn
	// steady bytes into a stall.
	const stall = time.Second
	c, p := connected(t, Limits{Stall: stall})

	// Idle for longer than the stall between messages, then a message
	// whose bytes come slowly but steadily: both are fine.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		time.Sleep(stall + stall/2)
		p.write([]byte{0, 4})
		for _, b := range []byte("slow") {
			time.Sleep(stall / 100)
			p.write([]byte{b})
		}
	}()
	got, err := c.ReadMessage()
	<-sent
	if err != nil || string(got[0]) != "slow" {
		t.Fatalf("got %q, %v; want [slow]", got, err)
	}

	// A frame announced as 100 bytes that stops after 10.
	p.write(append([]byte{0, 100}, "0123456789"...))
	_, err = c.ReadMessage()
	var v *ViolationError
	if !errors.As(err, &v) || !strings.Contains(err.Error(), "nothing received for 1s inside a message") {
		t.Fatalf("got %v, want a stall violation", err)
	}
}

// TestLibzmq talks to real libzmq sockets (pyzmq's ROUTER, PUB and REP,
// which is what ipykernel binds) over ipc: handshake, multipart messages
// with long frames both ways, a subscription and a REQ envelope.
func TestLibzmq(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq").Run(); err != nil {
		testenv.Missing(t, "Debian's python3-zmq")
	}
	dir, err := os.MkdirTemp("", "zq") // short: unix socket paths are capped
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const script = `import sys, threading, zmq
d = sys.argv[1]
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER); router.bind("ipc://" + d + "/r")
pub = ctx.socket(zmq.PUB); pub.bind("ipc://" + d + "/p")
rep = ctx.socket(zmq.REP); rep.bind("ipc://" + d + "/q")
print("ready", flush=True)
stop = threading.Event()
def publish():
    n = 0
    while not stop.is_set():
        pub.send_multipart([b"stream.stdout", b"tick", str(n).encode()]); n += 1
        stop.wait(0.02)
threading.Thread(target=publish, daemon=True).start()
ident, *frames = router.recv_multipart()
router.send_multipart([ident, b"echo"] + frames[::-1])
rep.send_multipart(rep.recv_multipart()[::-1])
sys.stdin.read()
stop.set()
`
	py := exec.CommandContext(t.Context(), python, "-c", script, dir)
	stdin, err := py.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := py.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.Buffer
	py.Stderr = &stderr
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = py.Wait()
		if t.Failed() {
			t.Logf("python stderr:\n%s", stderr.String())
		}
	})
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("python did not start: %q", line)
	}
	// No deadline of its own: a dial and a handshake with a listening
	// libzmq do not hang, and 30 s for all of them, the big messages
	// between, was missed under the race detector on a busy machine. The
	// test's timeout bounds a hang.
	ctx := t.Context()
	dial := func(name string, typ SocketType) *Conn {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		c, err := Handshake(ctx, nc, typ, Options{Name: name})
		if err != nil {
			t.Fatalf("handshake with libzmq (%s): %v", typ, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	dealer := dial("r", Dealer)
	big := bytes.Repeat([]byte("0123456789"), 100_000)
	if err := dealer.WriteMessage([]byte("first"), big, []byte{}); err != nil {
		t.Fatal(err)
	}
	got, err := dealer.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{[]byte("echo"), {}, big, []byte("first")}, got); diff != "" {
		t.Errorf("ROUTER echo (-want +got):\n%s", diff)
	}

	sub := dial("p", Sub)
	if err := sub.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	got, err = sub.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0]) != "stream.stdout" || string(got[1]) != "tick" {
		t.Errorf("got %q, want a published tick", got)
	}

	req := dial("q", Req)
	if err := req.WriteMessage([]byte{}, []byte("ping"), []byte("2")); err != nil {
		t.Fatal(err)
	}
	got, err = req.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]byte{{}, []byte("2"), []byte("ping")}; !cmp.Equal(got, want) {
		t.Errorf("REP answer: got %q, want %q", got, want)
	}
}
