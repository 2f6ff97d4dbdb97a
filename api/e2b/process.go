package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	procpb "github.com/triadhq/triad/api/e2b/envd/process"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// commandMIME is the display bundle the command wrapper reports its result
// in: stdout and stderr as base64, the exit code, and why it failed to start.
const commandMIME = "application/vnd.triad.e2b-command+json"

// chunk is the most bytes one data event carries.
const chunk = 32 << 10

// processService is envd's process.Process. A command runs in the run's
// kernel container, under the same jail as every cell, as one sandbox.exec
// whose cell starts the process and reports its output and exit code
// (DECISIONS.md, "E2B surface: commands run through sandbox.exec").
type processService struct {
	s *Server
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// command is one commands.run in flight.
type command struct {
	pid    uint32
	cfg    *procpb.ProcessConfig
	tag    string
	cancel context.CancelFunc
	done   chan struct{}
	events []*procpb.ProcessEvent // the data and end events, set before done closes
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

func (p *processes) add(run runid.ID, c *command) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next[run]++
	c.pid = p.next[run]
	if p.m[run] == nil {
		p.m[run] = map[uint32]*command{}
	}
	p.m[run][c.pid] = c
}

func (p *processes) remove(run runid.ID, pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m[run], pid)
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

// killAll cancels every command of the sandbox: it was killed or paused.
func (p *processes) killAll(run runid.ID) {
	for _, c := range p.list(run) {
		c.cancel()
	}
}

// Start is commands.run: the start event goes out at once, the output and
// the exit code when the command ends.
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
	code, err := ps.s.commandCode(sb, cfg)
	if err != nil {
		return connectErr(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &command{cfg: cfg, tag: req.Msg.GetTag(), cancel: cancel, done: make(chan struct{})}
	ps.s.procs.add(sb.ID, c)
	defer ps.s.procs.remove(sb.ID, c.pid)
	send := func(e *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: e}) }
	if err := send(startEvent(c.pid)); err != nil {
		return err
	}
	timeout := 24 * time.Hour // capped by the server's maximum cell time
	if dl, ok := ctx.Deadline(); ok {
		// End the cell a moment before the client's deadline, so the
		// client hears the end instead of its own deadline_exceeded.
		timeout = max(time.Until(dl)-time.Second, time.Second)
	}
	type result struct {
		out wire.ExecResponse
		err error
	}
	resc := make(chan result, 1)
	go func() {
		out, err := ps.s.c.Core.Exec(cctx, sb.ID, wire.ExecRequest{Code: code, TimeoutS: seconds(timeout)})
		resc <- result{out, err}
	}()
	var keep <-chan time.Time
	if n, err := strconv.Atoi(req.Header().Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		t := time.NewTicker(time.Duration(n) * time.Second)
		defer t.Stop()
		keep = t.C
	}
	for {
		select {
		case <-keep:
			if err := send(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Keepalive{Keepalive: &procpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		case r := <-resc:
			c.events = commandEvents(r.out, r.err, cctx)
			close(c.done)
			for _, e := range c.events {
				if err := send(e); err != nil {
					return err
				}
			}
			return nil
		}
	}
}

// Connect attaches to a command in flight: its start event now, its output
// and end when it ends.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[procpb.ConnectRequest], stream *connect.ServerStream[procpb.ConnectResponse]) error {
	sb := sandboxOf(ctx)
	c := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if c == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("no such process in flight (commands.list shows them)"))
	}
	send := func(e *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: e}) }
	if err := send(startEvent(c.pid)); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
	}
	for _, e := range c.events {
		if err := send(e); err != nil {
			return err
		}
	}
	return nil
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

// SendSignal is commands.kill: the command's cell is interrupted and the
// process killed with it.
func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[procpb.SendSignalRequest]) (*connect.Response[procpb.SendSignalResponse], error) {
	sb := sandboxOf(ctx)
	c := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if c == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such process in flight (commands.list shows them)"))
	}
	c.cancel()
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

// commandSpec is what the wrapper cell reads: the argv, cwd and
// environment, passed as JSON so no value is ever spliced into Python
// source.
type commandSpec struct {
	Args []string          `json:"args"`
	Cwd  string            `json:"cwd"`
	Envs map[string]string `json:"envs"`
}

// commandCode builds the cell that runs cfg in the kernel's container. Its
// first line names the command, so the journal's code summary shows it;
// environment values appear only in the hashed body.
func (s *Server) commandCode(sb Sandbox, cfg *procpb.ProcessConfig) (string, error) {
	envs := maps.Clone(sb.Envs)
	if envs == nil {
		envs = map[string]string{}
	}
	maps.Copy(envs, cfg.GetEnvs())
	if err := validEnvs(envs); err != nil {
		return "", err
	}
	cwd := ""
	if cfg.Cwd != nil {
		p, err := runPath(cfg.GetCwd())
		if err != nil {
			return "", err
		}
		cwd = p
	}
	spec, err := json.Marshal(commandSpec{Args: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cwd, Envs: envs})
	if err != nil {
		return "", err
	}
	shown := cfg.GetCmd()
	if args := cfg.GetArgs(); len(args) == 3 && args[0] == "-l" && args[1] == "-c" {
		shown = args[2] // commands.run's /bin/bash -l -c <cmd>
	}
	shown, _, _ = strings.Cut(shown, "\n")
	shown = shorten(shown, 120)
	return "# e2b commands.run (bash): " + shown + "\n" + fmt.Sprintf(commandWrapper, pyStr(string(spec)), pyStr(commandMIME)), nil
}

// commandWrapper runs the command and reports its output through a display
// bundle. Names start with __e2b_ and are deleted, so the user's namespace
// is untouched.
const commandWrapper = `def __e2b_command():
    import base64, json, os, subprocess
    from IPython.display import display
    spec = json.loads(%s)
    env = dict(os.environ)
    env.update(spec["envs"])
    try:
        p = subprocess.run(spec["args"], cwd=spec["cwd"] or None, env=env, stdin=subprocess.DEVNULL, capture_output=True)
        res = {"stdout": base64.b64encode(p.stdout).decode(), "stderr": base64.b64encode(p.stderr).decode(), "exit_code": p.returncode}
    except OSError as e:
        res = {"stdout": "", "stderr": "", "exit_code": 127, "error": str(e)}
    display({%s: res}, raw=True)
__e2b_command()
del __e2b_command
`

// commandResult is what the wrapper reports.
type commandResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int32  `json:"exit_code"`
	Error    string `json:"error"`
}

// commandEvents turns the wrapper cell's answer into the command's data and
// end events.
func commandEvents(out wire.ExecResponse, err error, ctx context.Context) []*procpb.ProcessEvent {
	end := func(code int32, exited bool, status, msg string) *procpb.ProcessEvent {
		e := &procpb.ProcessEvent_EndEvent{ExitCode: code, Exited: exited, Status: status}
		if msg != "" {
			e.Error = &msg
		}
		return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: e}}
	}
	if err != nil {
		if ctx.Err() != nil {
			return []*procpb.ProcessEvent{end(-1, false, "signal: killed", "the command was killed")}
		}
		fe, _ := classify(err)
		return []*procpb.ProcessEvent{end(-1, false, "error", sdkMessage(fe))}
	}
	var res *commandResult
	for _, b := range out.Display {
		if v, ok := b.Data[commandMIME]; ok {
			raw, _ := json.Marshal(v)
			var r commandResult
			if json.Unmarshal(raw, &r) == nil {
				res = &r
			}
		}
	}
	if res == nil {
		msg := "the command did not report a result"
		if out.Error != nil {
			msg = strings.TrimSpace(out.Error.Message)
			if out.Error.Ename == "ModuleNotFoundError" || out.Error.Ename == "NameError" {
				msg += " (commands need the docker sandbox: start triad with --sandbox docker)"
			}
		}
		return []*procpb.ProcessEvent{end(-1, false, "error", msg)}
	}
	var evs []*procpb.ProcessEvent
	for _, o := range []struct {
		b64    string
		stderr bool
	}{{res.Stdout, false}, {res.Stderr, true}} {
		b, _ := base64.StdEncoding.DecodeString(o.b64)
		for len(b) > 0 {
			n := min(len(b), chunk)
			d := &procpb.ProcessEvent_DataEvent{Output: &procpb.ProcessEvent_DataEvent_Stdout{Stdout: b[:n]}}
			if o.stderr {
				d.Output = &procpb.ProcessEvent_DataEvent_Stderr{Stderr: b[:n]}
			}
			evs = append(evs, &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: d}})
			b = b[n:]
		}
	}
	switch {
	case res.Error != "":
		evs = append(evs, end(res.ExitCode, false, "error", res.Error))
	case res.ExitCode < 0:
		evs = append(evs, end(-1, false, fmt.Sprintf("signal: %d", -res.ExitCode), ""))
	default:
		evs = append(evs, end(res.ExitCode, true, fmt.Sprintf("exit status %d", res.ExitCode), ""))
	}
	return evs
}
