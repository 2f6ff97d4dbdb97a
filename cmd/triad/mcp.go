package main

import (
	"context"

	"github.com/triadhq/triad/api/mcp"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/recipes/runner"
)

// mcpCmd is "triad mcp": the tools over MCP on stdin and stdout, for
// clients that start their servers as subprocesses (Claude Desktop, IDE
// agents). It takes serve's store, sandbox and search flags. The process
// is one MCP session and so one fresh run. stdout carries the protocol and
// nothing else: logs and the sandbox image build's progress go to stderr.
func mcpCmd(ctx context.Context, args []string) error {
	var c config
	fs := newFlagSet("mcp")
	c.common(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	st, log, err := open(ctx, &c)
	if err != nil {
		return err
	}
	defer st.Close()
	var recipes *runner.Runner
	if st.runner != nil {
		recipes = st.runner
	}
	srv := mcp.New(mcp.Config{Orchestrator: st.orch, Recipes: recipes, Logger: log})
	defer srv.Close()
	log.Info("triad mcp serving on stdio", "store", c.Store, "sandbox", st.backend, "version", version.String())
	return srv.ServeStdio(ctx)
}
