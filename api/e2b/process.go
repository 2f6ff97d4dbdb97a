package e2b

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	procpb "github.com/triadhq/triad/api/e2b/envd/process"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

// processService is envd's process.Process. A command runs in the run's
// kernel container, under the same jail as every cell, started by the
// orchestrator (StartCommand): the start is a step of the run's journal,
// the command runs without holding the run (the SDK cannot say whether it
// waits: background is client-side), its output streams to the client as
// it is printed, and its end is a step of its own (DECISIONS.md, "Contexts
// and commands at the seam").
type processService struct {
	s *Server
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// command is one commands.run in flight. Its output goes to every
// attached stream (the one that started it, and any commands.connect)
// under mu, in order, from the command's goroutine; a stream that fails is
// dropped. A stream attaches by sending the start event under mu, so it
// never sees output before its start.
type command struct {
	pid uint32
	cfg *procpb.ProcessConfig
	tag string
	c   *orchestrator.Command

	mu      sync.Mutex
	streams map[*attached]struct{}
}

// attached is a stream a command's events go to.
type attached struct {
	send func(*procpb.ProcessEvent) error
	dead bool
}

// deliver sends e to every attached stream.
func (c *command) deliver(e *procpb.ProcessEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a := range c.streams {
		if a.dead {
			continue
		}
		if err := a.send(e); err != nil {
			a.dead = true
		}
	}
}

// attach adds a stream, sending it the start event first.
func (c *command) attach(send func(*procpb.ProcessEvent) error) (*attached, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := &attached{send: send}
	if err := send(startEvent(c.pid)); err != nil {
		return nil, err
	}
	c.streams[a] = struct{}{}
	return a, nil
}

func (c *command) detach(a *attached) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.streams, a)
}

// sendTo sends a keepalive (or any event) to one stream, in order with
// the command's output.
func (c *command) sendTo(a *attached, e *procpb.ProcessEvent) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.dead {
		return errors.New("stream closed")
	}
	return a.send(e)
}

// processes tracks each sandbox's commands in flight.
type processes struct {
	mu   sync.Mutex
	next map[runid.ID]uint32
	m    map[runid.ID]map[uint32]*command
}

func newProcesses() *processes {
	return &processes{next: map[runid.ID]uint32{}, m: map[runid.ID]map[uint32]*command{}}
}

// pid numbers the sandbox's next command.
func (p *processes) pid(run runid.ID) uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next[run]++
	return p.next[run]
}

// add makes a started command findable.
func (p *processes) add(run runid.ID, c *command) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[run] == nil {
		p.m[run] = map[uint32]*command{}
	}
	p.m[run][c.pid] = c
}

func (p *processes) remove(run runid.ID, pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m[run], pid)
	if len(p.m[run]) == 0 {
		delete(p.m, run)
	}
}

func (p *processes) find(run runid.ID, sel *procpb.ProcessSelector) *command {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.m[run] {
		switch {
		case sel.GetSelector() == nil:
		case sel.GetTag() != "" && c.tag == sel.GetTag():
			return c
		case sel.GetTag() == "" && c.pid == sel.GetPid():
			return c
		}
	}
	return nil
}

func (p *processes) list(run runid.ID) []*command {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*command, 0, len(p.m[run]))
	for _, c := range p.m[run] {
		out = append(out, c)
	}
	return out
}

// killAll kills every command of the sandbox: it was killed or paused.
func (p *processes) killAll(run runid.ID) {
	for _, c := range p.list(run) {
		c.c.Kill()
	}
}

// Start is commands.run: the command starts (a journaled call), the start
// event goes out, its output follows as it is printed, and its end when
// it ends. A client that goes away leaves the command running (as envd
// does: commands.connect attaches again); it ends by itself, by
// commands.kill, or at its deadline: the request's Connect timeout
// (timeoutMs), capped by the server's maximum.
func (ps *processService) Start(ctx context.Context, req *connect.Request[procpb.StartRequest], stream *connect.ServerStream[procpb.StartResponse]) error {
	sb := sandboxOf(ctx)
	cfg := req.Msg.GetProcess()
	switch {
	case cfg.GetCmd() == "":
		return connectErr(fault.New(fault.BadInput, "process.cmd is empty", "commands.run sends /bin/bash -l -c <cmd>; send a command"))
	case req.Msg.Pty != nil:
		return connect.NewError(connect.CodeUnimplemented, errors.New("pty is not supported on Triad yet: commands run without a terminal"))
	case req.Msg.GetStdin():
		return connect.NewError(connect.CodeUnimplemented, errors.New("stdin is not supported on Triad yet: run the command with stdin: false (the default)"))
	}
	in, err := commandRequest(sb, cfg)
	if err != nil {
		return connectErr(err)
	}
	timeout := 24 * time.Hour // capped by the server's maximum cell time
	if dl, ok := ctx.Deadline(); ok {
		// End the command a moment before the client's deadline, so the
		// client hears the end instead of its own deadline_exceeded.
		timeout = max(time.Until(dl)-time.Second, time.Second)
	}
	in.TimeoutS = seconds(timeout)
	send := func(e *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: e}) }
	c := &command{pid: ps.s.procs.pid(sb.ID), cfg: cfg, tag: req.Msg.GetTag(), streams: map[*attached]struct{}{}}
	// Output is delivered under c.mu: holding it until the start event is
	// out keeps the command's first output behind it.
	c.mu.Lock()
	oc, err := ps.s.c.Core.StartCommand(ctx, sb.ID, in, func(e orchestrator.ExecEvent) { c.deliver(dataEvent(e)) })
	if err != nil {
		c.mu.Unlock()
		return connectErr(err)
	}
	c.c = oc
	ps.s.procs.add(sb.ID, c)
	go func() {
		<-oc.Done()
		ps.s.procs.remove(sb.ID, c.pid)
	}()
	self := &attached{send: send}
	if err := send(startEvent(c.pid)); err != nil {
		self.dead = true
	}
	c.streams[self] = struct{}{}
	c.mu.Unlock()
	defer c.detach(self)
	return ps.follow(ctx, req.Header(), c, self)
}

// follow keeps a stream attached to a command until the command ends (then
// it sends the end event) or the client goes away.
func (ps *processService) follow(ctx context.Context, h http.Header, c *command, a *attached) error {
	var keep <-chan time.Time
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		t := time.NewTicker(time.Duration(n) * time.Second)
		defer t.Stop()
		keep = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keep:
			if err := c.sendTo(a, &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Keepalive{Keepalive: &procpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-c.c.Done():
			out, err := c.c.Wait(ctx)
			return c.sendTo(a, endEvent(out, err))
		}
	}
}

// Connect attaches to a command in flight: its start event now, then its
// output as it is printed from now on, and its end.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[procpb.ConnectRequest], stream *connect.ServerStream[procpb.ConnectResponse]) error {
	sb := sandboxOf(ctx)
	c := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if c == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("no such process in flight (commands.list shows them)"))
	}
	a, err := c.attach(func(e *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: e}) })
	if err != nil {
		return err
	}
	defer c.detach(a)
	return ps.follow(ctx, req.Header(), c, a)
}

// List is commands.list: the commands in flight.
func (ps *processService) List(ctx context.Context, _ *connect.Request[procpb.ListRequest]) (*connect.Response[procpb.ListResponse], error) {
	sb := sandboxOf(ctx)
	out := &procpb.ListResponse{}
	for _, c := range ps.s.procs.list(sb.ID) {
		info := &procpb.ProcessInfo{Pid: c.pid, Config: c.cfg}
		if c.tag != "" {
			info.Tag = &c.tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// SendSignal is commands.kill: the command and everything it started are
// killed (whatever the signal), and its end is journaled.
func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[procpb.SendSignalRequest]) (*connect.Response[procpb.SendSignalResponse], error) {
	sb := sandboxOf(ctx)
	c := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if c == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process in flight (commands.list shows them)"))
	}
	c.c.Kill()
	return connect.NewResponse(&procpb.SendSignalResponse{}), nil
}

var errStdin = errors.New("stdin and terminal resizing are not supported on Triad yet: commands run with stdin closed")

// SendInput: see errStdin.
func (ps *processService) SendInput(context.Context, *connect.Request[procpb.SendInputRequest]) (*connect.Response[procpb.SendInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errStdin)
}

// StreamInput: see errStdin.
func (ps *processService) StreamInput(context.Context, *connect.ClientStream[procpb.StreamInputRequest]) (*connect.Response[procpb.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errStdin)
}

// CloseStdin: see errStdin.
func (ps *processService) CloseStdin(context.Context, *connect.Request[procpb.CloseStdinRequest]) (*connect.Response[procpb.CloseStdinResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errStdin)
}

// Update: see errStdin.
func (ps *processService) Update(context.Context, *connect.Request[procpb.UpdateRequest]) (*connect.Response[procpb.UpdateResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errStdin)
}

func startEvent(pid uint32) *procpb.ProcessEvent {
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: pid}}}
}

// dataEvent is a command's stdout or stderr chunk as envd sends it.
func dataEvent(e orchestrator.ExecEvent) *procpb.ProcessEvent {
	b := []byte(e.Text)
	d := &procpb.ProcessEvent_DataEvent{Output: &procpb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
	if e.Type == wire.EventStderr {
		d.Output = &procpb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	}
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: d}}
}

// endEvent is a command's end as envd sends it: the exit code, and why it
// did not exit by itself. A killed command ends as envd's does, with
// "signal: killed".
func endEvent(out wire.ExecResponse, err error) *procpb.ProcessEvent {
	end := func(code int32, exited bool, status, msg string) *procpb.ProcessEvent {
		e := &procpb.ProcessEvent_EndEvent{ExitCode: code, Exited: exited, Status: status}
		if msg != "" {
			e.Error = &msg
		}
		return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: e}}
	}
	if err != nil {
		fe, _ := classify(err)
		return end(-1, false, "error", sdkMessage(fe))
	}
	code := int32(-1)
	if out.ExitCode != nil {
		code = int32(*out.ExitCode)
	}
	if e := out.Error; e != nil && e.Kind != wire.CellExitCode {
		return end(code, false, "signal: killed", e.Message+" ("+e.Suggestion+")")
	}
	return end(code, true, fmt.Sprintf("exit status %d", code), "")
}

// commandRequest is the sandbox.exec request of commands.run: bash runs the
// command (E2B's /bin/bash -l -c <cmd> is passed on as it is; any other
// argv is quoted for bash), with the sandbox's and the call's environment
// variables, in cwd.
func commandRequest(sb Sandbox, cfg *procpb.ProcessConfig) (wire.ExecRequest, error) {
	envs := maps.Clone(sb.Envs)
	if envs == nil {
		envs = map[string]string{}
	}
	maps.Copy(envs, cfg.GetEnvs())
	if err := validEnvs(envs); err != nil {
		return wire.ExecRequest{}, err
	}
	in := wire.ExecRequest{Language: wire.LanguageBash, Env: envs}
	if len(in.Env) == 0 {
		in.Env = nil
	}
	if cfg.Cwd != nil {
		p, err := runPath(cfg.GetCwd())
		if err != nil {
			return in, err
		}
		in.Cwd = p
	}
	args := cfg.GetArgs()
	if (cfg.GetCmd() == "/bin/bash" || cfg.GetCmd() == "bash") && len(args) == 3 && args[0] == "-l" && args[1] == "-c" {
		in.Code = args[2] // commands.run's /bin/bash -l -c <cmd>
	} else {
		q := make([]string, 0, 1+len(args))
		for _, a := range append([]string{cfg.GetCmd()}, args...) {
			q = append(q, shellQuote(a))
		}
		in.Code = "exec " + strings.Join(q, " ")
	}
	if strings.TrimSpace(in.Code) == "" {
		return in, fault.New(fault.BadInput, "the command is empty", "send a command to run")
	}
	return in, nil
}

// shellQuote quotes s as one bash word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
