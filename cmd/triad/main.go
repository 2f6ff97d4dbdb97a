// Command triad serves the three tools (sandbox.exec, browser.search, tmp files) over HTTP and runs recipes.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/api/e2b"
	"github.com/triadhq/triad/api/e2b/metarecords"
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/auth/share"
	"github.com/triadhq/triad/console"
	"github.com/triadhq/triad/internal/compress"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/s3"
)

const usage = `triad: three tools for AI agents: sandbox.exec, browser.search and tmp files.

Usage:
  triad serve [flags]     serve the HTTP API (and MCP over streamable HTTP at /mcp)
  triad mcp [flags]       serve the tools over MCP on stdin/stdout (one session, one run)
  triad run RECIPE [--param k=v] [--input name=FILE] [--server URL] [--resume RUN_ID]
                          run a recipe (in-process with the embedded defaults, or on a server)
  triad replay RUN_ID [--seed N] [--as-of DATE] [--server URL] [--json]
                          re-execute a run's calls from its trace as a new run and compare every
                          file it produced (exit status 1 when one differs)
  triad recipes [list]    list the recipes
  triad recipes export NAME [-o FILE]
                          write a recipe's starter notebook
  triad keys create --name NAME [--tenant T] [--scope runs,read,admin]
  triad keys list | revoke ID
                          manage API keys (kept hashed in the store)
  triad fsck [--dry-run] [--rate BYTES]
                          re-hash every stored blob and quarantine those whose bytes no longer
                          match their sha256, listing the runs and paths that held them
  triad gc [--grace DURATION]
                          remove the blobs no run holds (a deleted run's, once no other run
                          holds the same bytes), stored longer than --grace (6h) ago
  triad image build       build the sandbox image (offline, from Debian packages)
  triad image tag [--image server]
                          print the sandbox (or Triad server) image tag for this build
  triad image export [--image sandbox|server] --format docker-archive [-o FILE]
                          write the sandbox image, or Triad's own (this static
                          binary), as an archive for ctr/docker load
  triad image seccomp     print Triad's seccomp profile as a Kubernetes node installs it
                          (a Localhost profile, for --kube-seccomp-profile)
  triad csi-workdir --node NAME [--kubelet-dir DIR] [--state DIR]
                          serve the CSI node plugin that gives kernel pods working
                          directories of a fixed size (as root, on every node)
  triad version           print the version

Run "triad COMMAND -h" for a command's flags. Every flag has a TRIAD_* twin
in the environment (--data is TRIAD_DATA); a flag on the command line wins.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, os.Args[2:])
	case "mcp":
		err = mcpCmd(ctx, os.Args[2:])
	case "keys":
		err = keysCmd(ctx, os.Args[2:])
	case "fsck":
		err = fsckCmd(ctx, os.Args[2:])
	case "gc":
		err = gcCmd(ctx, os.Args[2:])
	case "run":
		err = runCmd(ctx, os.Args[2:])
	case "replay":
		err = replayCmd(ctx, os.Args[2:])
	case "recipes":
		err = recipesCmd(ctx, os.Args[2:])
	case "image":
		err = imageCmd(ctx, os.Args[2:])
	case "csi-workdir":
		err = csiCmd(ctx, os.Args[2:])
	case "eval-worker":
		err = evalWorkerCmd(ctx, os.Args[2:])
	case "version", "--version", "-v":
		fmt.Println(version.String())
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "triad: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "triad:", err)
		os.Exit(1)
	}
}

// serveFlagSet registers every flag of `triad serve` on c.
func (c *config) serveFlagSet() *flagSet {
	fs := newFlagSet("serve")
	c.serveFlags(fs)
	c.E2B.flags(fs)
	c.common(fs)
	return fs
}

func serve(ctx context.Context, args []string) error {
	var c config
	fs := c.serveFlagSet()
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if err := c.validateServe(); err != nil {
		return err
	}
	if err := c.E2B.validate(); err != nil {
		return err
	}
	c.metrics = metrics.New()
	log := newLogger(&c)
	// Refuse an open public server before anything slow starts.
	store, closeStore, err := openStore(ctx, &c, log)
	if err != nil {
		return err
	}
	var ks *keys.Store
	open := false
	if c.Auth == "keys" {
		ks = keys.New(store.Meta(), keys.Config{Logger: log})
		any, err := ks.Any(ctx)
		if err != nil {
			closeStore()
			return fmt.Errorf("read the API keys from the store: %w", err)
		}
		if !any {
			if !loopback(c.Addr) {
				closeStore()
				return fmt.Errorf("refusing to serve on %s with no API key: anyone who can reach it could run code and read every run.\n"+
					"Create a key first, with the same store settings:\n    triad keys create --name NAME\n"+
					"or pass --auth none (TRIAD_AUTH=none) to serve without authentication deliberately", c.Addr)
			}
			open = true
			log.Warn("no API key exists: serving without authentication on loopback until the first key is created (triad keys create --name NAME)", "addr", c.Addr)
		}
	} else {
		log.Warn("authentication is off (--auth none): every caller is the operator, who can run code and read every run", "addr", c.Addr)
	}
	closeStore()

	st, err := openStack(ctx, &c, log)
	if err != nil {
		return err
	}
	defer st.Close()
	if ks != nil {
		ks = keys.New(st.store.Meta(), keys.Config{Logger: log})
	}
	shares, err := share.Open(ctx, st.store.Meta(), share.Config{Secret: []byte(c.ShareSecret)})
	if err != nil {
		return err
	}
	var sessions *session.Store
	if ks != nil {
		sessions = session.New(st.store.Meta(), ks, session.Config{TTL: c.SessionTTL, Logger: log})
	}
	cfg := api.Config{Orchestrator: st.orch, Runner: st.runner, Logger: log, Keys: ks, OpenWithoutKeys: open, Shares: shares,
		ShareTTL: c.ShareTTL, MaxShareTTL: c.ShareMaxTTL, PublicURL: c.PublicURL, TLS: c.TLSCert != "",
		Metrics: c.metrics, MetricsNeedKey: c.MetricsAuth, Sessions: sessions, Body: c.body()}
	if c.MetricsAddr == "" {
		cfg.MetricsHandler = c.metrics.Handler()
	}
	h := api.New(cfg)
	m := mcp.New(mcp.Config{Orchestrator: st.orch, Recipes: st.runner, Logger: log})
	defer m.Close()
	h.Mount("/mcp", "MCP over streamable HTTP: the tools for MCP clients; a session is one run", m.Handler())
	defer h.Close()
	var handler http.Handler = h
	if c.Console {
		con, err := console.New(console.Config{Orchestrator: st.orch, Keys: ks, OpenWithoutKeys: open, Sessions: sessions,
			TLS: c.TLSCert != "", Logger: log})
		if err != nil {
			return err
		}
		handler = con.Handler(handler)
	}
	// The API's and the console's text answers are gzipped for clients
	// that accept it; E2B's surface (envd's own encodings) is outside.
	handler = compress.Handler(handler)
	// A deleted run's share links go with it, and its E2B sandbox.
	st.orch.OnDelete(shares.RevokeRun)
	if c.E2B.Enabled {
		e, err := openE2B(ctx, &c, st, ks, open, log)
		if err != nil {
			return err
		}
		defer e.Close()
		handler = e.Handler(handler)
		st.orch.OnDelete(e.ForgetRun)
	} else {
		st.orch.OnDelete(metarecords.New(st.store.Meta()).Delete)
		// The surface is off, but its old records still leave the runs.
		ec, err := e2bRecords(ctx, &c, st, log)
		if err == nil {
			err = e2b.Migrate(ctx, ec)
		}
		if err != nil {
			return err
		}
	}
	if c.GCEvery > 0 {
		log.Info("keeping the store in the background", "every", c.GCEvery, "retain", c.Retain, "grace", c.GCGrace)
	}
	st.orch.StartKeeper(orchestrator.KeepConfig{Retain: c.Retain, Every: c.GCEvery, Grace: c.GCGrace})
	srv := &http.Server{
		Handler: handler,
		// A client that sends its headers slowly is cut after 10 s, and a
		// kept-alive connection that sends nothing more is closed after
		// 2 min; bodies have their own deadlines (--body-idle,
		// --body-timeout), since a slow body is not a slow header.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	scheme := "http"
	if c.TLSCert != "" {
		certs, err := newCertReloader(c.TLSCert, c.TLSKey, log)
		if err != nil {
			ln.Close()
			return err
		}
		stop := certs.reloadOnHUP()
		defer stop()
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get}
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
	}
	errc := make(chan error, 2)
	var msrv *http.Server
	if c.MetricsAddr != "" {
		mln, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		msrv = &http.Server{Handler: metricsMux(c.metrics), ReadHeaderTimeout: 10 * time.Second}
		log.Info("metrics serving", "addr", mln.Addr().String())
		go func() { errc <- msrv.Serve(mln) }()
	}
	if c.scrubRate > 0 {
		log.Info("scrubbing the store in the background", "bytes_per_second", c.scrubRate)
		sctx, stopScrub := context.WithCancel(ctx)
		scrubbed := make(chan struct{})
		go func() { defer close(scrubbed); st.store.Scrub(sctx, c.scrubRate) }()
		defer func() { stopScrub(); <-scrubbed }() // before the store closes
	}
	log.Info("triad serving", "addr", ln.Addr().String(), "scheme", scheme, "auth", c.Auth, "store", c.Store, "version", version.String())
	if c.Console {
		log.Info("web console", "url", scheme+"://"+ln.Addr().String()+"/")
	}
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	m.Close() // end open MCP sessions and event streams before the HTTP server waits for them
	h.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if msrv != nil {
		msrv.Shutdown(sctx)
	}
	return srv.Shutdown(sctx)
}

// metricsMux serves /metrics alone, for --metrics-addr.
func metricsMux(m *metrics.Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	return mux
}

// loopback reports whether addr listens on loopback only: 127.0.0.0/8,
// ::1 or localhost. An empty host (":8080") is every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func newLogger(c *config) *slog.Logger {
	lvl, _ := c.level()
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// newStore joins blobs and index, counted by the metrics when there are.
func newStore(c *config, name string, b tmpfs.Blobs, x tmpfs.Index, log *slog.Logger) *tmpfs.Store {
	if c.metrics != nil {
		b, x = c.metrics.Store(name, b, x)
	}
	return tmpfs.New(b, x, log)
}

// openStore builds the configured file store.
func openStore(ctx context.Context, c *config, log *slog.Logger) (*tmpfs.Store, func(), error) {
	switch c.Store {
	case "local":
		dir := filepath.Join(c.Data, "store")
		b, err := local.NewBlobs(dir)
		if err != nil {
			return nil, nil, err
		}
		x, err := local.NewIndex(dir)
		if err != nil {
			return nil, nil, err
		}
		return newStore(c, "local", b, x, log), func() { x.Close() }, nil
	case "s3":
		b, x, err := s3.New(ctx, s3.Config{
			Endpoint: c.S3Endpoint, Bucket: c.S3Bucket, AccessKey: c.S3AccessKey, SecretKey: c.S3SecretKey,
			Region: c.S3Region, Logger: log,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open S3 store %s/%s: %w", c.S3Endpoint, c.S3Bucket, err)
		}
		return newStore(c, "s3", b, x, log), func() { x.Close(); b.Close() }, nil
	default:
		return nil, nil, fmt.Errorf("--store %q: want local or s3", c.Store)
	}
}
