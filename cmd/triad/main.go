// Command triad serves the three tools (sandbox.exec, browser.search, tmp files) over HTTP and runs recipes.
package main

import (
	"context"
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
	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/recipes/runner"
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
  triad recipes [list]    list the recipes
  triad recipes export NAME [-o FILE]
                          write a recipe's starter notebook
  triad image build       build the sandbox image (offline, from Debian packages)
  triad image tag [--image server]
                          print the sandbox (or Triad server) image tag for this build
  triad image export [--image sandbox|server] --format docker-archive [-o FILE]
                          write the sandbox image, or Triad's own (this static
                          binary), as an archive for ctr/docker load
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
	case "run":
		err = runCmd(ctx, os.Args[2:])
	case "recipes":
		err = recipesCmd(ctx, os.Args[2:])
	case "image":
		err = imageCmd(ctx, os.Args[2:])
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

func serve(ctx context.Context, args []string) error {
	var c config
	fs := newFlagSet("serve")
	fs.str(&c.Addr, "addr", "127.0.0.1:8080", "listen address")
	c.common(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	st, log, err := open(ctx, &c)
	if err != nil {
		return err
	}
	defer st.Close()
	orch, rn := st.orch, st.runner
	h := api.New(api.Config{Orchestrator: orch, Runner: rn, Logger: log})
	var recipes *runner.Runner
	if rn != nil {
		recipes = rn
	}
	m := mcp.New(mcp.Config{Orchestrator: orch, Recipes: recipes, Logger: log})
	defer m.Close()
	h.Router().Handle("/mcp", m.Handler())
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	log.Info("triad serving", "addr", ln.Addr().String(), "store", c.Store, "version", version.String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	m.Close() // end open MCP sessions before the HTTP server waits for them
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func newLogger(c *config) *slog.Logger {
	lvl, _ := c.level()
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
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
		return tmpfs.New(b, x, log), func() { x.Close() }, nil
	case "s3":
		b, x, err := s3.New(ctx, s3.Config{
			Endpoint: c.S3Endpoint, Bucket: c.S3Bucket, AccessKey: c.S3AccessKey, SecretKey: c.S3SecretKey,
			Region: c.S3Region, SpoolDir: filepath.Join(c.Data, "spool"), Logger: log,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open S3 store %s/%s: %w", c.S3Endpoint, c.S3Bucket, err)
		}
		return tmpfs.New(b, x, log), func() { x.Close(); b.Close() }, nil
	default:
		return nil, nil, fmt.Errorf("--store %q: want local or s3", c.Store)
	}
}
