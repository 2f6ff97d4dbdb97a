package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/template"
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

// templateSet returns the server's templates.
func (o *Orchestrator) templateSet() *template.Set {
	if o.templates == nil {
		return template.NewSet()
	}
	return o.templates
}

// Templates returns the sandbox templates runs may choose, as callers see
// them.
func (o *Orchestrator) Templates() []wire.Template {
	var out []wire.Template
	for _, t := range o.templateSet().All() {
		out = append(out, t.Wire())
	}
	return out
}

// ReachesNetwork reports whether this server's kernels can reach the
// network through the egress proxy: a run whose policy allows anything is
// refused (unsupported) where they cannot.
func (o *Orchestrator) ReachesNetwork() bool { return o.egress != nil }

// resolveSandbox fills in a setup's template (the default when it names
// none) and egress policy (the template's, narrowed by s.Egress), and the
// image its kernels run: an unknown template is bad input naming the
// templates there are; a policy beyond the template's, from a caller
// without the admin scope, is forbidden.
func (o *Orchestrator) resolveSandbox(ctx context.Context, s *wire.RunSetup) error {
	tm, err := o.templateSet().Get(s.Template)
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
		if !o.ReachesNetwork() {
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
	if o.imageDigest != nil && s.Image != "" {
		if d, err := o.imageDigest(ctx, s.Image); err == nil {
			s.ImageDigest = d
		} else {
			o.log.WarnContext(ctx, "image digest", "image", s.Image, "err", err)
		}
	}
	return nil
}

// sandboxOf resolves the run's sandbox from its setup.
func (o *Orchestrator) sandboxOf(ctx context.Context, run runid.ID) (runSandbox, error) {
	s, err := o.runSetup(ctx, run)
	if err != nil {
		return runSandbox{}, err
	}
	tm, err := o.templateSet().Get(s.Template)
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

// kernelSpec is what the run's kernel starts from.
func (o *Orchestrator) kernelSpec(ctx context.Context, run runid.ID) (sandbox.Spec, error) {
	sb, err := o.sandboxOf(ctx, run)
	return sb.spec, err
}

// egressRuns are the runs whose sandboxes reach the network through the
// proxy in this process: each run's Session (its policy, its limits'
// counters, its records not yet journaled) and the kernels it serves.
type egressRuns struct {
	mu     sync.Mutex
	runs   map[runid.ID]*egressRun
	wg     sync.WaitGroup // serve loops
	closed bool
}

type egressRun struct {
	sess    *egress.Session
	serving map[sandbox.Egress]bool
}

// serveEgress makes the kernel's connections go through the run's
// session, and returns once the kernel's relay is ready. The session is
// made on the run's first use in this process, charged with the egress
// the run's journal records.
func (o *Orchestrator) serveEgress(ctx context.Context, run runid.ID, k sandbox.Kernel, pol *egress.Policy) (*egress.Session, error) {
	e, ok := k.(sandbox.Egress)
	if !ok {
		return nil, fault.New(fault.Unsupported, fmt.Sprintf("run %s has an egress policy, but %s kernels cannot reach the network", run, o.kernels.Backend()),
			"run triad with --sandbox docker or kube, or start a run without egress")
	}
	er, err := o.egressRun(ctx, run, pol)
	if err != nil {
		return nil, err
	}
	o.eg.mu.Lock()
	if o.eg.closed {
		o.eg.mu.Unlock()
		return nil, sandbox.ErrClosed
	}
	if !er.serving[e] {
		er.serving[e] = true
		o.eg.wg.Add(1)
		go func() {
			defer o.eg.wg.Done()
			// Serve ends when the kernel closes (AcceptEgress fails) or
			// the session does.
			if err := er.sess.Serve(context.Background(), e.AcceptEgress); err != nil && !errors.Is(err, sandbox.ErrClosed) {
				o.log.Warn("egress: serving a kernel's connections ended", "run", run, "err", err)
			}
			o.eg.mu.Lock()
			delete(er.serving, e)
			o.eg.mu.Unlock()
		}()
	}
	o.eg.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, egressReadyTimeout)
	defer cancel()
	if err := e.EgressReady(rctx); err != nil {
		return nil, fmt.Errorf("the egress relay of run %s's kernel: %w", run, err)
	}
	return er.sess, nil
}

// egressRun returns the run's egress state, making its session on first
// use.
func (o *Orchestrator) egressRun(ctx context.Context, run runid.ID, pol *egress.Policy) (*egressRun, error) {
	o.eg.mu.Lock()
	er := o.eg.runs[run]
	o.eg.mu.Unlock()
	if er != nil {
		return er, nil
	}
	sess, err := o.egress.Session(run.String(), pol)
	if err != nil {
		return nil, err
	}
	bytes, conns := o.recordedEgress(ctx, run)
	sess.Charge(bytes, conns)
	o.eg.mu.Lock()
	defer o.eg.mu.Unlock()
	if o.eg.closed {
		sess.Close()
		return nil, sandbox.ErrClosed
	}
	if o.eg.runs == nil {
		o.eg.runs = map[runid.ID]*egressRun{}
	}
	if er := o.eg.runs[run]; er != nil { // made meanwhile; the run's calls are serialised, so rarely
		sess.Close()
		return er, nil
	}
	er = &egressRun{sess: sess, serving: map[sandbox.Egress]bool{}}
	o.eg.runs[run] = er
	return er, nil
}

// recordedEgress sums what the run's journal records of its egress: the
// bytes its connections moved and how many it opened, which count
// against the run's limits whichever process served them.
func (o *Orchestrator) recordedEgress(ctx context.Context, run runid.ID) (int64, int) {
	tr, err := o.trace(ctx, run)
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

// fetchedURLs are the URLs the run's sandbox fetched through the proxy
// (allowed connections, as the journal and this step record them), which a
// report may cite as its sources.
func (o *Orchestrator) fetchedURLs(ctx context.Context, s *Step) []string {
	seen := map[string]bool{}
	var out []string
	add := func(cs []wire.Connection) {
		for _, c := range cs {
			if c.Verdict == wire.VerdictAllowed && c.URL != "" && !seen[c.URL] {
				seen[c.URL] = true
				out = append(out, c.URL)
			}
		}
	}
	if tr, err := o.trace(ctx, s.Run); err == nil {
		for _, t := range tr {
			add(t.Egress)
		}
	}
	if e, ok := s.Outcome.(*ExecOutcome); ok {
		add(e.Egress)
	}
	sort.Strings(out)
	return out
}

// takeEgress returns the run's connection records since the last step.
func (o *Orchestrator) takeEgress(run runid.ID) []wire.Connection {
	o.eg.mu.Lock()
	er := o.eg.runs[run]
	o.eg.mu.Unlock()
	if er == nil {
		return nil
	}
	return er.sess.Take()
}

// dropEgress closes the run's session: its kernels are gone or another
// process serves the run now.
func (o *Orchestrator) dropEgress(run runid.ID) {
	o.eg.mu.Lock()
	er := o.eg.runs[run]
	delete(o.eg.runs, run)
	o.eg.mu.Unlock()
	if er != nil {
		er.sess.Close()
	}
}

// closeEgress closes every session and waits for the serve loops. A run
// set up afterwards gets a new session.
func (o *Orchestrator) closeEgress() {
	o.eg.mu.Lock()
	o.eg.closed = true
	runs := o.eg.runs
	o.eg.runs = nil
	o.eg.mu.Unlock()
	for _, er := range runs {
		er.sess.Close()
	}
	o.eg.wg.Wait()
	o.eg.mu.Lock()
	o.eg.closed = false
	o.eg.mu.Unlock()
}

// commandEnv is a command's environment in a run with egress: the
// kernel's egress environment under the caller's.
func (o *Orchestrator) commandEnv(run runid.ID, env map[string]string) map[string]string {
	o.eg.mu.Lock()
	er := o.eg.runs[run]
	o.eg.mu.Unlock()
	if er == nil {
		return env
	}
	out := egressEnv(len(er.sess.CACert())+len(o.egressTrust) > 0)
	maps.Copy(out, env)
	return out
}

// setUpEgress makes a freshly set-up kernel's egress go through the proxy:
// the relay served and ready, then a setup cell that points the kernel's
// HTTP clients at it (HTTP_PROXY and friends) and, when the run's CA
// terminates TLS for a secret or the operator trusts more CAs, makes them
// trust those too. A run without egress gets nothing: its kernel reaches
// nothing, exactly as without the proxy.
func (o *Orchestrator) setUpEgress(ctx context.Context, run runid.ID, k sandbox.Kernel) error {
	sb, err := o.sandboxOf(ctx, run)
	if err != nil || sb.policy.Empty() {
		return err
	}
	sess, err := o.serveEgress(ctx, run, k, sb.policy)
	if err != nil {
		return err
	}
	return runSetupCell(ctx, k, egressCell(egressEnv(len(sess.CACert())+len(o.egressTrust) > 0), string(sess.CACert())+string(o.egressTrust)))
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
