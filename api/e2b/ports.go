package e2b

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
)

// getHost(port) and metrics (docs/e2b-protocol.md §5).
//
// getHost builds <port>-<sandboxID>.<domain>, the domain being create's
// answer (Config.Domain, or the request's own host). A request to such a
// host reaches Triad's listener (a wildcard name, or *.localhost), which
// proxies it to the port in the sandbox: the core dials it (a sandbox.port
// step of the run's journal, orchestrator.DialPort) through the way Triad
// already reaches into the sandbox, so the sandbox's network stays closed.
// The same proxy serves a data-plane request whose E2b-Sandbox-Port names
// another port than envd's or the interpreter's. Either is admitted by one
// of the sandbox's access tokens (X-Access-Token, E2b-Traffic-Access-Token)
// or by a key of the control plane's (X-API-Key) that may see the sandbox;
// anything else gets E2B's "sandbox not found" answer, the same whether
// the sandbox exists or not. See docs/DECISIONS.md, "getHost".

// portHostRE matches a getHost host's first label: a port and a sandbox id
// as Triad mints them (runid.New).
var portHostRE = regexp.MustCompile(`^([0-9]{1,5})-(r-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.`)

// portHost reads a getHost host: its port and sandbox id.
func portHost(host string) (int, string, bool) {
	m := portHostRE.FindStringSubmatch(host)
	if m == nil {
		return 0, "", false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || port < 1 || port > 65535 {
		return 0, "", false
	}
	return port, m[2], true
}

// domain is create's domain: Config.Domain, or the host the request came
// to, loopback addresses named localhost.
func (s *Server) domain(r *http.Request) string {
	if s.c.Domain != "" {
		return s.c.Domain
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		host = "localhost"
	}
	if port == "" {
		return host
	}
	return net.JoinHostPort(host, port)
}

// portNotFound is E2B's answer for a getHost request that reaches no
// sandbox (its proxy's), with Triad's error beside it.
type portNotFound struct {
	Message   string      `json:"message"`
	SandboxID string      `json:"sandboxId"`
	Code      int         `json:"code"`
	Error     errorDetail `json:"error"`
}

func (s *Server) writePortError(w http.ResponseWriter, r *http.Request, id string, err error) {
	fe, _ := classify(err)
	msg := "The sandbox was not found"
	if fe.Kind != fault.NotFound {
		msg = fe.Message
	}
	s.log.InfoContext(r.Context(), "E2B getHost request refused", "sandbox", id, "host", r.Host, "kind", fe.Kind, "err", err)
	writeJSON(w, http.StatusBadGateway, portNotFound{Message: msg, SandboxID: id, Code: http.StatusBadGateway,
		Error: errorDetail{Kind: fe.Kind, Message: fe.Message, Suggestion: fe.Suggestion}})
}

// servePortHost serves a request to a getHost host.
func (s *Server) servePortHost(w http.ResponseWriter, r *http.Request, port int, raw string) {
	unknown := fault.New(fault.NotFound, fmt.Sprintf("no running sandbox %s takes this request's credentials", raw),
		"send the sandbox's access token (X-Access-Token) or an API key that may see it (X-API-Key)")
	id, err := runid.Parse(raw)
	if err != nil {
		s.writePortError(w, r, raw, unknown)
		return
	}
	sb, err := s.reg.get(r.Context(), id)
	if err != nil {
		s.writePortError(w, r, raw, unknown)
		return
	}
	var p auth.Principal
	switch {
	case sb.tokenOK(r.Header.Get(HeaderAccessToken)) || sb.tokenOK(r.Header.Get(HeaderTrafficToken)):
		if p, err = s.c.Core.Creator(r.Context(), id); err != nil {
			s.writePortError(w, r, raw, unknown)
			return
		}
	case r.Header.Get(HeaderAPIKey) != "":
		kp, ok := s.authorize(r)
		if !ok || s.c.Core.Visible(auth.With(r.Context(), kp), id) != nil {
			s.writePortError(w, r, raw, unknown)
			return
		}
		p = kp
	case sb.PublicTraffic:
		// Created with network.allowPublicTraffic true: the URL is
		// public, and the request acts as the sandbox's creator.
		if p, err = s.c.Core.Creator(r.Context(), id); err != nil {
			s.writePortError(w, r, raw, unknown)
			return
		}
	default:
		s.writePortError(w, r, raw, unknown)
		return
	}
	if sb.State != StateRunning {
		s.writePortError(w, r, raw, fault.New(fault.Conflict, fmt.Sprintf("sandbox %s is paused: its processes are gone", id),
			"Sandbox.connect resumes it; start the server again"))
		return
	}
	s.proxyPort(w, r.WithContext(auth.With(r.Context(), p)), sb, port, "getHost")
}

// proxyPort proxies r to port in sandbox id's sandbox, one connection per
// request, each a sandbox.port step; the caller admitted r and put its
// principal in its context.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, sb Sandbox, port int, via string) {
	id := sb.ID
	request := r.Method + " " + r.URL.EscapedPath()
	if len(request) > 200 {
		request = request[:200] + "…"
	}
	tr := &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 0,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return s.c.Core.DialPort(ctx, id, port, request, via)
		}}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.Host = pr.In.Host
			if sb.MaskHost != "" {
				pr.Out.Host = maskHost(sb.MaskHost, port)
			}
			// Triad's credentials stay with Triad.
			for _, h := range []string{HeaderAccessToken, HeaderTrafficToken, HeaderAPIKey, HeaderSandboxID, HeaderSandboxPort} {
				pr.Out.Header.Del(h)
			}
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if fault.As(err) == nil && !errors.Is(err, context.Canceled) {
				err = fault.Wrap(fault.Unavailable, err, fmt.Sprintf("the server on port %d in sandbox %s did not answer: %v", port, id, err),
					"check that it is running and speaks HTTP")
			}
			s.writePortError(w, r, id.String(), err)
		},
	}
	rp.ServeHTTP(w, r)
}

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metricsSlack is how far outside [start, end] a reading still counts:
// the SDK sends seconds, and E2B's own readings are 5 s buckets.
const metricsSlack = 5 * time.Second

// metrics is GET /sandboxes/{id}/metrics: one reading, now, of the
// sandbox's kernel's cgroup (CPU over the engine's last second, memory
// without the page cache) and of its files (disk), when now is in the
// asked interval. A sandbox with no kernel running (none started yet, or
// paused) uses no CPU or memory, and says so.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	bound := func(name string) (time.Time, bool, error) {
		raw := q.Get(name)
		if raw == "" {
			return time.Time{}, false, nil
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, false, fault.Badf("send "+name+" as Unix seconds, 0 or more", "%s %q is not Unix seconds", name, raw)
		}
		return time.Unix(n, 0), true, nil
	}
	start, hasStart, err := bound("start")
	if err != nil {
		return err
	}
	end, hasEnd, err := bound("end")
	if err != nil {
		return err
	}
	if hasStart && hasEnd && end.Before(start) {
		return fault.New(fault.BadInput, "end is before start", "send start <= end")
	}
	u, live, err := s.c.Core.Usage(r.Context(), sb.ID)
	if fe := fault.As(err); fe != nil && fe.Kind == fault.Unsupported {
		return statusError{http.StatusBadRequest, fe}
	}
	if err != nil {
		return err
	}
	sz := sizesOf(s.c.Limits)
	m := metricJSON{CPUCount: sz.cpus, MemTotal: int64(sz.memoryMB) << 20, DiskTotal: int64(sz.diskMB) << 20}
	at := time.Now()
	if live {
		at = u.At
		m.CPUCount = max(1, int(math.Ceil(u.CPUs)))
		m.CPUUsedPct = math.Round(u.CPUPercent*100) / 100
		m.MemUsed, m.MemCache = u.MemoryBytes, u.MemoryCacheBytes
		if u.MemoryLimitBytes > 0 {
			m.MemTotal = u.MemoryLimitBytes
		}
	}
	if (hasStart && at.Before(start.Add(-metricsSlack))) || (hasEnd && at.After(end.Add(metricsSlack))) || at.Before(sb.StartedAt.Add(-metricsSlack)) {
		return writeJSON(w, http.StatusOK, []metricJSON{})
	}
	files, err := s.c.Core.WorkingFiles(r.Context(), sb.ID, "")
	if err != nil {
		return err
	}
	for _, f := range files {
		m.DiskUsed += f.Size
	}
	if m.DiskTotal < m.DiskUsed {
		m.DiskTotal = m.DiskUsed // no disk limit: the files are all there is
	}
	m.Timestamp, m.TimestampUnix = at.UTC(), at.Unix()
	return writeJSON(w, http.StatusOK, []metricJSON{m})
}
