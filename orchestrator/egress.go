package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/template"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// A run's sandbox is chosen once, when the run is set up: a template
// (its image and limits) and an egress policy (the template's, narrowed
// by the request, widened only by an admin). run.setup.json records both,
// and everything after reads them from there: the kernel a run starts,
// the proxy session its connections go through, a replay's own setup.
// See "Egress" and "Templates" in docs/DECISIONS.md.

// runSandbox is a run's sandbox, resolved from its setup against the
// server's templates.
type runSandbox struct {
	tmpl   *template.Template
	spec   sandbox.Spec   // the kernel's image and limits (no owner)
	policy *egress.Policy // secrets attached; empty reaches nothing
}

// egressReadyTimeout bounds the wait for a kernel's egress relay to
// answer: a relay that does not within it is broken (its forwarder did not
// start), and the call fails saying so.
const egressReadyTimeout = 2 * time.Minute

// sandboxes is the room of the runs' sandboxes as templates and the egress
// proxy shape them: it resolves a setup's template and policy, and keeps
// the egress sessions of the runs whose kernels reach the network in this
// process (each run's Session: its policy, its limits' counters, its
// records not yet journaled, and the kernels it serves). Its serve loops
// are started by serve and stopped by close, which Orchestrator.Close
// calls.
type sandboxes struct {
	templates   *template.Set // nil: only the default
	proxy       *egress.Proxy // nil: no run may reach the network
	trust       []byte
	imageDigest func(ctx context.Context, ref string) (string, error)
	kernels     *kernels.Manager
	store       *tmpfs.Store
	log         *slog.Logger

	mu     sync.Mutex
	runs   map[runid.ID]*egressRun
	wg     sync.WaitGroup // serve loops
	closed bool
}

type egressRun struct {
	sess    *egress.Session
	serving map[sandbox.Egress]bool
	// sent and received are what the session had moved when the run's
	// accounting last took it (moved); guarded by sandboxes.mu.
	sent, received int64
}

// Offer is what this server's sandbox offers runs, for the surfaces that
// describe it (the OpenAPI document, GET /templates).
type Offer struct {
	// Templates are the sandbox templates runs may choose, as callers see
	// them.
	Templates []wire.Template
	// ReachesNetwork reports whether kernels can reach the network
	// through the egress proxy: a run whose policy allows anything is
	// refused (unsupported) where they cannot.
	ReachesNetwork bool
	// RunsCommands reports whether sandbox.exec takes language bash
	// (true when no sandbox is configured: exec is then refused as a
	// whole).
	RunsCommands bool
}

// Offer returns what this server's sandbox offers runs.
func (o *Orchestrator) Offer() Offer {
	off := Offer{ReachesNetwork: o.sb.proxy != nil, RunsCommands: o.kernels == nil || o.kernels.RunsCommands()}
	for _, t := range o.sb.set().All() {
		off.Templates = append(off.Templates, t.Wire())
	}
	return off
}

// set returns the server's templates.
func (b *sandboxes) set() *template.Set {
	if b.templates == nil {
		return template.NewSet()
	}
	return b.templates
}

// resolve fills in a setup's template (the default when it names none)
// and egress policy (the template's, narrowed by s.Egress), and the image
// its kernels run: an unknown template is bad input naming the templates
// there are; a policy beyond the template's, from a caller without the
// admin scope, is forbidden.
func (b *sandboxes) resolve(ctx context.Context, s *wire.RunSetup) error {
	tm, err := b.set().Get(s.Template)
	if err != nil {
		return err
	}
	s.Template = tm.Name
	pol := tm.Egress
	if s.Egress != nil {
		pol, err = tm.Egress.Narrow(*s.Egress, auth.From(ctx).Admin())
		if errors.Is(err, egress.ErrOutside) {
			return fault.Wrap(fault.Forbidden, err, err.Error(),
				fmt.Sprintf("ask only for what template %s allows (GET /templates shows its egress policy), or have a key with the admin scope create the run", tm.Name))
		}
		if err != nil {
			return fault.Wrap(fault.BadInput, err, err.Error(), "send egress rules as {\"host\": \"pypi.org\", \"ports\": [443]}: names (or *.name wildcards), never addresses")
		}
	}
	s.Egress = nil
	if !pol.Empty() {
		if b.proxy == nil {
			return fault.New(fault.Unsupported, fmt.Sprintf("template %s allows egress, but this server's sandbox cannot reach the network", tm.Name),
				"run triad with --sandbox docker or kube, whose kernels reach the network through Triad's egress proxy")
		}
		w := pol.Wire()
		s.Egress = &w
	}
	if tm.Variant != nil {
		if s.Image, err = tm.Variant.Tag(); err != nil {
			return fmt.Errorf("template %s: %w", tm.Name, err)
		}
	}
	if b.imageDigest != nil && s.Image != "" {
		if d, err := b.imageDigest(ctx, s.Image); err == nil {
			s.ImageDigest = d
		} else {
			b.log.WarnContext(ctx, "image digest", "image", s.Image, "err", err)
		}
	}
	return nil
}

// of resolves the run's sandbox from its setup.
func (b *sandboxes) of(run runid.ID, s wire.RunSetup) (runSandbox, error) {
	tm, err := b.set().Get(s.Template)
	if err != nil {
		return runSandbox{}, fault.Wrap(fault.Unsupported, err, fmt.Sprintf("run %s was set up with template %q, which this server no longer offers", run, s.Template),
			"restore the template in --templates, or start a new run")
	}
	sb := runSandbox{tmpl: tm, spec: sandbox.Spec{Limits: tm.Limits}, policy: &egress.Policy{}}
	if tm.Variant != nil {
		sb.spec.Image = s.Image
	}
	if s.Egress != nil {
		// The recorded policy was allowed when the run was set up (by an
		// admin, if it goes beyond the template): narrowing the template's
		// to it attaches the template's secrets again.
		req := *s.Egress
		req.Secrets = nil
		if sb.policy, err = tm.Egress.Narrow(req, true); err != nil {
			return sb, fmt.Errorf("run %s: its recorded egress policy: %w", run, err)
		}
	}
	return sb, nil
}

// serve makes the kernel's connections go through the run's session, and
// returns once the kernel's relay is ready. The session is made on the
// run's first use in this process, charged with the egress the run's
// journal records.
func (b *sandboxes) serve(ctx context.Context, run runid.ID, k sandbox.Kernel, pol *egress.Policy) (*egress.Session, error) {
	e, ok := k.(sandbox.Egress)
	if !ok {
		return nil, fault.New(fault.Unsupported, fmt.Sprintf("run %s has an egress policy, but %s kernels cannot reach the network", run, b.kernels.Backend()),
			"run triad with --sandbox docker or kube, or start a run without egress")
	}
	er, err := b.session(ctx, run, pol)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	if !er.serving[e] {
		er.serving[e] = true
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			// Serve ends when the kernel closes (AcceptEgress fails) or
			// the session does.
			if err := er.sess.Serve(context.Background(), e.AcceptEgress); err != nil && !errors.Is(err, sandbox.ErrClosed) {
				b.log.Warn("egress: serving a kernel's connections ended", "run", run, "err", err)
			}
			b.mu.Lock()
			delete(er.serving, e)
			b.mu.Unlock()
		}()
	}
	b.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, egressReadyTimeout)
	defer cancel()
	if err := e.EgressReady(rctx); err != nil {
		return nil, fmt.Errorf("the egress relay of run %s's kernel: %w", run, err)
	}
	return er.sess, nil
}

// session returns the run's egress state, making its session on first
// use.
func (b *sandboxes) session(ctx context.Context, run runid.ID, pol *egress.Policy) (*egressRun, error) {
	b.mu.Lock()
	er := b.runs[run]
	b.mu.Unlock()
	if er != nil {
		return er, nil
	}
	sess, err := b.proxy.Session(run.String(), pol)
	if err != nil {
		return nil, err
	}
	bytes, conns := b.recorded(ctx, run)
	sess.Charge(bytes, conns)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		sess.Close()
		return nil, sandbox.ErrClosed
	}
	if b.runs == nil {
		b.runs = map[runid.ID]*egressRun{}
	}
	if er := b.runs[run]; er != nil { // made meanwhile; the run's calls are serialised, so rarely
		sess.Close()
		return er, nil
	}
	er = &egressRun{sess: sess, serving: map[sandbox.Egress]bool{}}
	b.runs[run] = er
	return er, nil
}

// recorded sums what the run's journal records of its egress: the bytes
// its connections moved and how many it opened, which count against the
// run's limits whichever process served them.
func (b *sandboxes) recorded(ctx context.Context, run runid.ID) (int64, int) {
	tr, err := journal.ReadTrace(ctx, b.store, run)
	if err != nil {
		return 0, 0
	}
	last := map[int]wire.Connection{}
	maxID := 0
	for _, t := range tr {
		for _, c := range t.Egress {
			last[c.ID] = c
			maxID = max(maxID, c.ID)
		}
	}
	var bytes int64
	for _, c := range last {
		bytes += c.Sent + c.Received
	}
	return bytes, maxID
}

// take returns the run's connection records since the last step.
func (b *sandboxes) take(run runid.ID) []wire.Connection {
	b.mu.Lock()
	er := b.runs[run]
	b.mu.Unlock()
	if er == nil {
		return nil
	}
	return er.sess.Take()
}

// moved returns the bytes the run's egress sent and received since the
// last call, for the run's accounting.
func (b *sandboxes) moved(run runid.ID) (sent, received int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	er := b.runs[run]
	if er == nil {
		return 0, 0
	}
	s, r := er.sess.Moved()
	sent, received = s-er.sent, r-er.received
	er.sent, er.received = s, r
	return sent, received
}

// drop closes the run's session: its kernels are gone or another process
// serves the run now.
func (b *sandboxes) drop(run runid.ID) {
	b.mu.Lock()
	er := b.runs[run]
	delete(b.runs, run)
	b.mu.Unlock()
	if er != nil {
		er.sess.Close()
	}
}

// close closes every session and waits for the serve loops. A run set up
// afterwards gets a new session.
func (b *sandboxes) close() {
	b.mu.Lock()
	b.closed = true
	runs := b.runs
	b.runs = nil
	b.mu.Unlock()
	for _, er := range runs {
		er.sess.Close()
	}
	b.wg.Wait()
	b.mu.Lock()
	b.closed = false
	b.mu.Unlock()
}

// commandEnv is a command's environment in a run with egress: the
// kernel's egress environment under the caller's.
func (b *sandboxes) commandEnv(run runid.ID, env map[string]string) map[string]string {
	b.mu.Lock()
	er := b.runs[run]
	b.mu.Unlock()
	if er == nil {
		return env
	}
	out := egressEnv(len(er.sess.CACert())+len(b.trust) > 0)
	maps.Copy(out, env)
	return out
}

// setUp makes a freshly set-up kernel's egress go through the proxy: the
// relay served and ready, then a setup cell that points the kernel's HTTP
// clients at it (HTTP_PROXY and friends) and, when the run's CA
// terminates TLS for a secret or the operator trusts more CAs, makes them
// trust those too. A run without egress gets nothing: its kernel reaches
// nothing, exactly as without the proxy.
func (b *sandboxes) setUp(ctx context.Context, run runid.ID, s wire.RunSetup, k sandbox.Kernel) error {
	sb, err := b.of(run, s)
	if err != nil || sb.policy.Empty() {
		return err
	}
	sess, err := b.serve(ctx, run, k, sb.policy)
	if err != nil {
		return err
	}
	return runSetupCell(ctx, k, egressCell(egressEnv(len(sess.CACert())+len(b.trust) > 0), string(sess.CACert())+string(b.trust)))
}

// egressCAFile is where the egress setup cell writes the kernel's CA
// bundle: the image's, the run's CA and the operator's extra CAs.
const egressCAFile = image.Home + "/.triad-egress-ca.pem"

// egressEnv is the environment of a kernel with egress, for its cells and
// its commands alike: the proxy for every HTTP client, pip installing into
// the user's site (the root filesystem is read-only), and, with ca, the
// CA bundle for every client's verification.
func egressEnv(ca bool) map[string]string {
	proxy := "http://" + sandbox.EgressAddr
	env := map[string]string{
		"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy,
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
		"PIP_USER": "1", "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
		"PIP_NO_CACHE_DIR": "1", "PIP_PROGRESS_BAR": "off",
	}
	if ca {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT"} {
			env[k] = egressCAFile
		}
	}
	return env
}

// egressCell is the setup cell of a kernel with egress: env in os.environ
// (so subprocesses, pip among them, inherit it), the CA bundle written
// when extraCA is set, and the user's site on sys.path so that what pip
// installs there imports at once. It defines nothing in the caller's
// namespace.
func egressCell(env map[string]string, extraCA string) string {
	e, _ := json.Marshal(env)
	ca, _ := json.Marshal(extraCA)
	return strings.NewReplacer("$ENV", pyStr(string(e)), "$CAFILE", pyStr(egressCAFile), "$CA", string(ca)).Replace(`# Triad's kernel setup: the run's egress goes through Triad's proxy.
def _triad_egress(env, extra_ca, ca_file):
    import json, os, site
    if extra_ca:
        with open("/etc/ssl/certs/ca-certificates.crt") as f:
            base = f.read()
        os.makedirs(os.path.dirname(ca_file), exist_ok=True)
        with open(ca_file, "w") as f:
            f.write(base.rstrip("\n") + "\n" + extra_ca)
    os.environ.update(json.loads(env))
    user_site = site.getusersitepackages()
    os.makedirs(user_site, exist_ok=True)
    site.addsitedir(user_site)


_triad_egress($ENV, $CA, $CAFILE)
del _triad_egress
`)
}
