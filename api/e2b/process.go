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
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	procpb "github.com/triadhq/triad/api/e2b/envd/process"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox"
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
	pty bool
	// gone is set when the sandbox was killed or paused under the command.
	gone atomic.Bool
	cfg  *procpb.ProcessConfig
	tag  string
	c    *orchestrator.Command

	mu      sync.Mutex
	streams map[*attached]struct{}
	// early holds output that came before the start event went out: the
	// engine may deliver a command's first output before the pid line
	// its supervisor wrote ahead of it, and the start (which carries the
	// pid) must come first. Nil once started.
	early   []*procpb.ProcessEvent
	started bool
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
	if !c.started {
		c.early = append(c.early, e)
		return
	}
	c.sendLocked(e)
}

// sendLocked sends e to every attached stream; c.mu is held.
func (c *command) sendLocked(e *procpb.ProcessEvent) {
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

// processes tracks each sandbox's commands and runCode executions in
// flight, so a kill or a pause ends them all.
type processes struct {
	mu    sync.Mutex
	next  map[runid.ID]uint32
	m     map[runid.ID]map[uint32]*command
	execs map[runid.ID]map[*execution]struct{}
}

func newProcesses() *processes {
	return &processes{next: map[runid.ID]uint32{}, m: map[runid.ID]map[uint32]*command{}, execs: map[runid.ID]map[*execution]struct{}{}}
}

// execution is one runCode (POST /execute) in flight.
type execution struct {
	cancel context.CancelFunc // ends the call, which interrupts its cell
	// gone is set when the sandbox was killed or paused under it.
	gone atomic.Bool
}

// addExec makes a runCode in flight endable by killAll; cancel ends its
// call. Call the returned func when it has ended.
func (p *processes) addExec(run runid.ID, cancel context.CancelFunc) (*execution, func()) {
	e := &execution{cancel: cancel}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.execs[run] == nil {
		p.execs[run] = map[*execution]struct{}{}
	}
	p.execs[run][e] = struct{}{}
	return e, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.execs[run], e)
		if len(p.execs[run]) == 0 {
			delete(p.execs, run)
		}
	}
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

// killAll kills every command of the sandbox and ends every runCode in
// flight (interrupting its cell): the sandbox was killed or paused.
func (p *processes) killAll(run runid.ID) {
	for _, c := range p.list(run) {
		c.gone.Store(true)
		c.c.Kill()
	}
	p.mu.Lock()
	var execs []*execution
	for e := range p.execs[run] {
		execs = append(execs, e)
	}
	p.mu.Unlock()
	for _, e := range execs {
		e.gone.Store(true)
		e.cancel()
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
	}
	in, err := commandRequest(sb, cfg)
	if err != nil {
		return connectErr(err)
	}
	var opts []orchestrator.CallOption
	pty := req.Msg.GetPty() != nil
	if pty {
		size := req.Msg.GetPty().GetSize()
		opts = append(opts, orchestrator.WithPty(sandbox.TermSize{Rows: clampTerm(size.GetRows(), 24), Cols: clampTerm(size.GetCols(), 80)}))
	} else if req.Msg.GetStdin() {
		opts = append(opts, orchestrator.WithStdin())
	}
	timeout := 24 * time.Hour // capped by the server's maximum cell time
	if dl, ok := ctx.Deadline(); ok {
		// End the command a moment before the client's deadline, so the
		// client hears the end instead of its own deadline_exceeded.
		timeout = max(time.Until(dl)-time.Second, time.Second)
	}
	in.TimeoutS = seconds(timeout)
	send := func(e *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: e}) }
	c := &command{cfg: cfg, tag: req.Msg.GetTag(), pty: pty, streams: map[*attached]struct{}{}}
	// Output that comes before the start event is held (command.early)
	// and sent right after it, so the start always comes first, without
	// the pid wait ever waiting on the command's output: the engine may
	// deliver a command's first output before its supervisor's pid line.
	oc, err := ps.s.c.Core.StartCommand(ctx, sb.ID, in, func(e orchestrator.ExecEvent) { c.deliver(dataEvent(e, c.pty)) }, opts...)
	if err != nil {
		return connectErr(err)
	}
	pid, ran := oc.Pid(ctx)
	c.mu.Lock()
	c.c = oc
	if ran {
		c.pid = uint32(pid) // the command's own pid in the sandbox
	} else {
		c.pid = ps.s.procs.pid(sb.ID) // it never ran: a number for its events
	}
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
	c.started = true
	for _, e := range c.early {
		c.sendLocked(e)
	}
	c.early = nil
	c.mu.Unlock()
	defer c.detach(self)
	return ps.follow(ctx, req.Header(), c, self)
}

// pingTicker ticks at the interval, in seconds, the Connect client asks
// for in Keepalive-Ping-Interval, for a server stream's keepalive events;
// without one it never ticks. stop releases the ticker.
func pingTicker(h http.Header) (ticks <-chan time.Time, stop func()) {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(time.Duration(n) * time.Second)
	return t.C, t.Stop
}

// follow keeps a stream attached to a command until the command ends (then
// it sends the end event) or the client goes away.
func (ps *processService) follow(ctx context.Context, h http.Header, c *command, a *attached) error {
	keep, stop := pingTicker(h)
	defer stop()
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
			if c.gone.Load() {
				// The sandbox was killed or paused under the command:
				// the stream breaks off, as envd's does when its
				// sandbox goes, and the SDK's health check then finds
				// the sandbox gone (TimeoutError).
				panic(http.ErrAbortHandler)
			}
			if err == nil && out.Error != nil && out.Error.Kind == wire.CellTimeout {
				// Its timeoutMs ran out: envd's deadline_exceeded, the
				// SDK's TimeoutError.
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New(out.Error.Message))
			}
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
	// Answer once it is gone, so that what the caller does next (kill -0
	// <pid>) sees it gone.
	select {
	case <-c.c.Done():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return connect.NewResponse(&procpb.SendSignalResponse{}), nil
}

// SendInput is commands.sendStdin and pty.sendInput: the bytes go to the
// command's stdin, or are typed into its terminal.
func (ps *processService) SendInput(ctx context.Context, req *connect.Request[procpb.SendInputRequest]) (*connect.Response[procpb.SendInputResponse], error) {
	c, err := ps.running(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.input(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.SendInputResponse{}), nil
}

// StreamInput is SendInput as a stream: a start event names the process,
// data events follow.
func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[procpb.StreamInputRequest]) (*connect.Response[procpb.StreamInputResponse], error) {
	var c *command
	for stream.Receive() {
		switch {
		case stream.Msg().GetStart() != nil:
			var err error
			if c, err = ps.running(ctx, stream.Msg().GetStart().GetProcess()); err != nil {
				return nil, err
			}
		case stream.Msg().GetData() != nil:
			if c == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send the start event (the process) before data"))
			}
			if err := c.input(stream.Msg().GetData().GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.StreamInputResponse{}), nil
}

// CloseStdin is commands.closeStdin: the command reads end of file.
func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[procpb.CloseStdinRequest]) (*connect.Response[procpb.CloseStdinResponse], error) {
	c, err := ps.running(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := c.c.CloseStdin(); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&procpb.CloseStdinResponse{}), nil
}

// Update is pty.resize.
func (ps *processService) Update(ctx context.Context, req *connect.Request[procpb.UpdateRequest]) (*connect.Response[procpb.UpdateResponse], error) {
	c, err := ps.running(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if err := c.c.Resize(sandbox.TermSize{Rows: clampTerm(size.GetRows(), 24), Cols: clampTerm(size.GetCols(), 80)}); err != nil {
			return nil, connectErr(err)
		}
	}
	return connect.NewResponse(&procpb.UpdateResponse{}), nil
}

// running finds a command in flight of the request's sandbox.
func (ps *processService) running(ctx context.Context, sel *procpb.ProcessSelector) (*command, error) {
	c := ps.s.procs.find(sandboxOf(ctx).ID, sel)
	if c == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process in flight (commands.list shows them)"))
	}
	return c, nil
}

// input sends a command its stdin or terminal input.
func (c *command) input(in *procpb.ProcessInput) error {
	b := in.GetStdin()
	if c.pty {
		b = append(b, in.GetPty()...)
	}
	if len(b) == 0 {
		return nil
	}
	if err := c.c.Input(b); err != nil {
		return connectErr(err)
	}
	return nil
}

// clampTerm is a terminal dimension: def when absent, at most 1000.
func clampTerm(n uint32, def uint16) uint16 {
	switch {
	case n == 0:
		return def
	case n > 1000:
		return 1000
	}
	return uint16(n)
}

func startEvent(pid uint32) *procpb.ProcessEvent {
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: pid}}}
}

// dataEvent is a command's stdout or stderr chunk as envd sends it; a
// terminal's output is pty data.
func dataEvent(e orchestrator.ExecEvent, pty bool) *procpb.ProcessEvent {
	b := []byte(e.Text)
	d := &procpb.ProcessEvent_DataEvent{Output: &procpb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
	switch {
	case pty:
		d.Output = &procpb.ProcessEvent_DataEvent_Pty{Pty: b}
	case e.Type == wire.EventStderr:
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
