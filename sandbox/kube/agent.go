package kube

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/triadhq/triad/sandbox"
)

// agentProgram is the file agent, shipped over stdin of every session.
//
//go:embed agent.py
var agentProgram []byte

// agentBootstrap is the session's command line: it reads the program's
// length and the program from stdin and runs it, so the image needs no
// copy of it (docs/DECISIONS.md, "Kubernetes").
const agentBootstrap = `import sys; n = int(sys.stdin.buffer.readline()); exec(compile(sys.stdin.buffer.read(n), "triad-agent", "exec"))`

// maxFrame bounds one frame from the agent. The agent's stdout is a pipe a
// cell in the pod could write into (the pod shares one process namespace),
// so nothing it sends is trusted to be small.
const maxFrame = 1 << 20

// maxScanFrames bounds a Scan's reply: 4096 frames of at most 1 MiB, far
// past any directory a disk quota lets a cell fill with names.
const maxScanFrames = 4096

// errAgentDead means the agent's session ended; the next call opens a new
// one.
var errAgentDead = errors.New("kube: the pod's file agent session ended")

// agent is one long-lived exec session into a pod's agent container,
// speaking the framed protocol of agent.py. One request runs at a time;
// a request whose ctx ends, or that reads something malformed, ends the
// session, since where the stream stands is then unknown.
type agent struct {
	mu     sync.Mutex // held for a whole request, replies included
	stdin  *io.PipeWriter
	out    *bufio.Reader
	cancel context.CancelFunc
	once   sync.Once     // for close
	done   chan struct{} // closed when the exec stream ends
	err    error         // why it ended, set before done closes
}

// startAgent opens a session into the agent container of pod and waits
// for the agent's greeting. When that fails (the agent container is gone:
// a cell killed every process its uid may signal, the agent's sleep with
// them) the session runs in the kernel container instead, which mounts the
// same working directory: the pod stays usable while its kernel lives, as
// a Docker kernel does when a cell kills every other process. (The
// runtimes word a missing container too many ways to match on.)
func (b *Backend) startAgent(ctx context.Context, pod string) (*agent, error) {
	a, err := b.startAgentIn(ctx, pod, agentContainer)
	if err != nil && ctx.Err() == nil {
		var err2 error
		if a, err2 = b.startAgentIn(ctx, pod, kernelContainer); err2 == nil {
			b.log.InfoContext(ctx, "the pod's agent container is gone; reaching the working directory through the kernel container", "pod", pod, "err", err)
			return a, nil
		}
	}
	return a, err
}

func (b *Backend) startAgentIn(ctx context.Context, pod, container string) (*agent, error) {
	req := b.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(b.cfg.Namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   []string{"python3", "-c", agentBootstrap},
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := b.executor(req.URL())
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	a := &agent{stdin: inW, out: bufio.NewReaderSize(outR, 64<<10), cancel: cancel, done: make(chan struct{})}
	stderr := &tailBuffer{max: 4 << 10}
	go func() {
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		if err == nil {
			err = errAgentDead
		}
		if s := stderr.String(); s != "" {
			err = fmt.Errorf("%w (agent stderr: %s)", err, s)
		}
		a.err = err
		outW.CloseWithError(fmt.Errorf("%w: %w", errAgentDead, err))
		inR.CloseWithError(errAgentDead)
		close(a.done)
	}()
	stop := context.AfterFunc(ctx, a.close)
	defer stop()
	if _, err := fmt.Fprintf(inW, "%d\n", len(agentProgram)); err != nil {
		a.close()
		return nil, a.failure(ctx, err)
	}
	if _, err := inW.Write(agentProgram); err != nil {
		a.close()
		return nil, a.failure(ctx, err)
	}
	var hello struct {
		OK    bool
		Agent int
	}
	if err := a.readJSON(&hello); err != nil || !hello.OK {
		a.close()
		return nil, a.failure(ctx, fmt.Errorf("agent greeting: %v", err))
	}
	return a, nil
}

// errSession marks a failure of the session itself (it ended, or its
// stream is out of step), as opposed to a request the agent refused.
var errSession = errors.New("session failed")

// failure explains why a session could not be used.
func (a *agent) failure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("pod file agent: %w", context.Cause(ctx))
	}
	select {
	case <-a.done:
		return fmt.Errorf("pod file agent: %w (%w)", a.err, errSession)
	default:
	}
	return fmt.Errorf("pod file agent: %w (%w)", err, errSession)
}

// close ends the session: stdin's end makes the agent exit, which ends
// the stream cleanly; a session that does not end by itself (the agent
// blocked writing a reply nobody reads) is cut after a moment.
func (a *agent) close() {
	a.once.Do(func() {
		_ = a.stdin.Close() // EOF, not an error: client-go logs a copy that fails
		go func() {
			select {
			case <-a.done:
			case <-time.After(2 * time.Second):
			}
			a.cancel()
		}()
	})
}

// alive reports whether the session still runs.
func (a *agent) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// agentReply is the head of every reply.
type agentReply struct {
	OK    bool    `json:"ok"`
	Err   string  `json:"err"`
	Msg   string  `json:"msg"`
	Stamp []int64 `json:"stamp"`
	Conn  string  `json:"conn"`
	End   bool    `json:"end"`
	Short int64   `json:"short"`
}

// error turns a refusal into the WorkDir's errors.
func (r agentReply) error(op, path string) error {
	switch r.Err {
	case "notexist":
		return fmt.Errorf("%s %s: %s: %w", op, path, r.Msg, errNotExist)
	case "notregular":
		return fmt.Errorf("%s %s: %s: %w", op, path, r.Msg, sandbox.ErrNotRegular)
	}
	return fmt.Errorf("%s %s in the pod: %s", op, path, r.Msg)
}

// begin takes the session for one request bounded by ctx: when ctx ends
// first, the session is closed, which unblocks every read and write. The
// returned func releases it.
func (a *agent) begin(ctx context.Context) (func(), error) {
	a.mu.Lock()
	if !a.alive() {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: %v", errAgentDead, a.err)
	}
	if err := ctx.Err(); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	stop := context.AfterFunc(ctx, a.close)
	return func() { stop(); a.mu.Unlock() }, nil
}

// request sends one JSON request.
func (a *agent) request(req any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return a.writeFrame(b)
}

func (a *agent) writeFrame(b []byte) error {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(b)))
	if _, err := a.stdin.Write(h[:]); err != nil {
		return err
	}
	if len(b) > 0 {
		if _, err := a.stdin.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// readFrame reads one frame into buf (grown as needed) and returns it.
func (a *agent) readFrame(buf []byte) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(a.out, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > maxFrame {
		a.close()
		return nil, fmt.Errorf("pod file agent sent a %d-byte frame, over the %d-byte bound", n, maxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(a.out, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

func (a *agent) readJSON(v any) error {
	b, err := a.readFrame(nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		a.close()
		return fmt.Errorf("pod file agent sent a malformed reply: %v", err)
	}
	return nil
}

// call sends a request and reads its one-frame reply.
func (a *agent) call(ctx context.Context, req any) (agentReply, error) {
	release, err := a.begin(ctx)
	if err != nil {
		return agentReply{}, err
	}
	defer release()
	var r agentReply
	if err := a.request(req); err != nil {
		return r, a.failure(ctx, err)
	}
	if err := a.readJSON(&r); err != nil {
		return r, a.failure(ctx, err)
	}
	return r, nil
}

// conn returns the kernel's connection file once the kernel listens,
// waiting up to wait seconds.
func (a *agent) conn(ctx context.Context, wait float64) ([]byte, error) {
	r, err := a.call(ctx, map[string]any{"op": "conn", "wait": wait})
	if err != nil {
		return nil, err
	}
	if !r.OK {
		return nil, fmt.Errorf("read the kernel's connection file: %s", r.Msg)
	}
	return []byte(r.Conn), nil
}

// kill SIGKILLs the kernel container's processes.
func (a *agent) kill(ctx context.Context) error {
	r, err := a.call(ctx, map[string]any{"op": "kill"})
	if err != nil {
		return err
	}
	if !r.OK {
		return fmt.Errorf("kill the kernel: %s", r.Msg)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strconv.Quote(string(t.b))[1 : len(strconv.Quote(string(t.b)))-1]
}
