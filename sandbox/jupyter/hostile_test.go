package jupyter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox/jupyter/jupytertest"
	"github.com/triadhq/triad/sandbox/jupyter/zmtp"
)

// TestHostileCell has a cell write each attack to the kernel's end of each
// connection it can reach, and checks that the client reports the kernel
// dead with a protocol violation naming that socket, instead of panicking,
// hanging or buffering the attack.
func TestHostileCell(t *testing.T) {
	t.Parallel()
	const frame = 4 << 20
	for _, sock := range []string{"shell", "control", "iopub", "hb"} {
		for _, a := range jupytertest.Attacks {
			t.Run(sock+"/"+string(a), func(t *testing.T) {
				t.Parallel()
				// Only the truncated message is caught by the stall
				// limit, which it always trips: for the other attacks a
				// short one would be a deadline a busy machine (or the
				// race detector) misses, with several 4 MiB frames in
				// flight, and the stall would be reported instead of the
				// violation under test.
				lim := zmtp.Limits{MaxMessage: 2*frame + 1<<20, Stall: time.Minute}
				if a == jupytertest.Truncated {
					lim.Stall = 300 * time.Millisecond
				}
				k, c := startKernel(t, Options{Limits: lim})
				port := map[string]int{"shell": k.info.ShellPort, "control": k.info.ControlPort, "iopub": k.info.IOPubPort, "hb": k.info.HBPort}[sock]
				path := fmt.Sprintf("%s-%d", k.info.IP, port)
				ex, err := c.Execute(t.Context(), jupytertest.Cell(a, path, frame), ExecOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				out, err := ex.Wait(ctx)
				if !errors.Is(err, ErrKernelDead) {
					t.Fatalf("got %v (output %+v), want ErrKernelDead", err, out)
				}
				var v *zmtp.ViolationError
				if !errors.As(err, &v) || v.Conn != sock {
					t.Fatalf("got %v, want a protocol violation on %s", err, sock)
				}
				want := map[jupytertest.Attack]string{
					jupytertest.HugeFrame:  "frame of 4611686018427387904 bytes over the",
					jupytertest.Garbage:    "reserved bits",
					jupytertest.Truncated:  "nothing received for 300ms inside a message",
					jupytertest.ManyFrames: "message over the 9437184-byte limit: frame 3 of 4194304 bytes",
				}[a]
				if sock == "hb" && a == jupytertest.ManyFrames {
					want = "frame of 4194304 bytes over the 1024-byte limit"
				}
				if !strings.Contains(v.Reason, want) {
					t.Errorf("got reason %q, want it to contain %q", v.Reason, want)
				}
				if _, err := c.Execute(t.Context(), "1", ExecOptions{}); !errors.Is(err, ErrKernelDead) {
					t.Errorf("Execute after the violation: got %v, want ErrKernelDead", err)
				}
			})
		}
	}
}

// panickyConn is a connection whose reads panic once told to.
type panickyConn struct {
	net.Conn
	panicky *atomic.Bool
}

func (r panickyConn) Read(p []byte) (int, error) {
	if r.panicky.Load() {
		panic("injected read panic")
	}
	return r.Conn.Read(p)
}

// TestDialSeam dials every socket through Options.Dial, checks it is asked
// for each channel with its port, and that a panic inside a socket's reader
// (here injected by the connection itself) kills that client as a protocol
// violation instead of the process.
func TestDialSeam(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		dialed []string
	)
	panicky := map[string]*atomic.Bool{}
	for _, ch := range []string{"shell", "control", "iopub", "hb"} {
		panicky[ch] = &atomic.Bool{}
	}
	k, c := startKernelWith(t, func(prefix string) Options {
		return Options{Dial: func(ctx context.Context, channel string, port int) (net.Conn, error) {
			mu.Lock()
			dialed = append(dialed, fmt.Sprintf("%s:%d", channel, port))
			mu.Unlock()
			var d net.Dialer
			for {
				nc, err := d.DialContext(ctx, "unix", fmt.Sprintf("%s-%d", prefix, port))
				if err == nil {
					return panickyConn{nc, panicky[channel]}, nil
				}
				select {
				case <-ctx.Done():
					return nil, err
				case <-time.After(10 * time.Millisecond):
				}
			}
		}}
	})
	slices.Sort(dialed)
	want := []string{
		fmt.Sprintf("control:%d", k.info.ControlPort), fmt.Sprintf("hb:%d", k.info.HBPort),
		fmt.Sprintf("iopub:%d", k.info.IOPubPort), fmt.Sprintf("shell:%d", k.info.ShellPort),
	}
	if !slices.Equal(dialed, want) {
		t.Errorf("dialed %v, want %v", dialed, want)
	}
	if out := run(t, c, "print('through the seam')"); out.Stdout != "through the seam\n" {
		t.Fatalf("got %q", out.Stdout)
	}

	panicky["iopub"].Store(true)
	ex, err := c.Execute(t.Context(), "print('boom')", ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ex.Wait(t.Context())
	var v *zmtp.ViolationError
	if !errors.Is(err, ErrKernelDead) || !errors.As(err, &v) || !strings.Contains(v.Reason, "reading it panicked: injected read panic") {
		t.Fatalf("got %v, want ErrKernelDead with the recovered panic", err)
	}
}
