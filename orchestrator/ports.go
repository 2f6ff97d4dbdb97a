package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/sandbox"
)

// ToolPort is a connection from Triad's listener to a port in the run's
// sandbox (E2B's getHost).
const ToolPort = "sandbox.port"

// PortOutcome is sandbox.port's part of a step.
type PortOutcome struct {
	Port int
	// Request says what the connection is for ("GET /index.html").
	Request string
	// Via is who asked: "getHost" or the E2b-Sandbox-Port header.
	Via       string
	Backend   string
	Connected bool
}

// Tool implements Outcome.
func (p *PortOutcome) Tool() string { return ToolPort }

// Inputs implements Outcome.
func (p *PortOutcome) Inputs() []Input {
	return journal.Inputs(Input{Key: "port", Value: p.Port}, Input{Key: "request", Value: p.Request}, Input{Key: "via", Value: p.Via})
}

// Grade implements Outcome.
func (p *PortOutcome) Grade(req *evaluator.Request) {}

// Describe implements Outcome.
func (p *PortOutcome) Describe(s *Step) (did, next []string, failed bool) {
	if p.Connected {
		did = append(did, fmt.Sprintf("Connected Triad's listener to port %d in the %s sandbox for %s; the sandbox's network stays closed", p.Port, p.Backend, p.Request))
	}
	return did, nil, false
}

// DialPort connects to port in the run's live sandbox, for a request from
// outside (E2B's getHost), as a tool call: the run is resolved and the
// step recorded as for any tool; the bytes then flow outside the run's
// lock, as a download's do. A run with no live kernel has nothing
// listening: not found. See docs/DECISIONS.md, "getHost".
func (o *Orchestrator) DialPort(ctx context.Context, run runid.ID, port int, request, via string) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fault.Badf("send a port from 1 to 65535", "port %d is not a TCP port", port)
	}
	if o.kernels == nil {
		return nil, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker or kube")
	}
	var conn net.Conn
	po := &PortOutcome{Port: port, Request: request, Via: via, Backend: o.kernels.Backend()}
	err := o.call(ctx, run, po, nil, func(ctx context.Context, c *call) error {
		sess := o.kernels.Peek(run)
		if sess == nil {
			return fault.New(fault.NotFound, fmt.Sprintf("run %s has no kernel running, so nothing listens on port %d", run, port),
				"start the server with commands.run(..., {background: true}) first; a paused sandbox's processes are gone")
		}
		p, ok := sess.Kernel.(sandbox.Ports)
		if !ok {
			return fault.New(fault.Unsupported, fmt.Sprintf("the %s sandbox cannot reach a port inside it", o.kernels.Backend()),
				"use triad serve --sandbox docker or kube")
		}
		cn, err := p.DialPort(ctx, port)
		if errors.Is(err, sandbox.ErrNoListener) {
			return fault.Wrap(fault.NotFound, err, fmt.Sprintf("nothing listens on port %d in run %s's sandbox", port, run),
				"start the server first, listening on 127.0.0.1 or 0.0.0.0 of the sandbox")
		}
		if err != nil {
			return sandboxErr(err)
		}
		conn, po.Connected = cn, true
		return nil
	})
	return conn, err
}

// Usage is what the run's live kernel uses now, from its cgroup; live is
// false when no kernel runs (nothing is used). A kernel whose backend
// cannot say is unsupported. It is a read, not a tool call: nothing is
// journaled.
func (o *Orchestrator) Usage(ctx context.Context, run runid.ID) (u sandbox.Usage, live bool, err error) {
	if err := o.Visible(ctx, run); err != nil {
		return u, false, err
	}
	if o.kernels == nil {
		return u, false, nil
	}
	sess := o.kernels.Peek(run)
	if sess == nil {
		return u, false, nil
	}
	m, ok := sess.Kernel.(sandbox.Meter)
	if !ok {
		return u, true, fault.New(fault.Unsupported, fmt.Sprintf("the %s sandbox does not report its CPU and memory", o.kernels.Backend()),
			"use triad serve --sandbox docker")
	}
	u, err = m.Usage(ctx)
	if errors.Is(err, sandbox.ErrClosed) {
		return sandbox.Usage{}, false, nil // it stopped meanwhile
	}
	if err != nil {
		return u, true, sandboxErr(err)
	}
	return u, true, nil
}
