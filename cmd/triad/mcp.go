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
	var recipesDir string
	fs.str(&recipesDir, "recipes", "", "directory of user recipes (*.md) added to the standard ones")
	c.common(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.validate(fs); err != nil {
		return err
	}
	log := newLogger(&c)
	st, err := openStack(ctx, &c, log)
	if err != nil {
		return err
	}
	defer st.Close()
	var recipes mcp.RecipeRunner
	if st.backend != "" {
		cat, err := catalog(recipesDir)
		if err != nil {
			return err
		}
		rn := runner.New(runner.Config{Orchestrator: st.orch, Catalog: cat, Backend: st.backend, Logger: log})
		defer rn.Close()
		recipes = rn
	}
	srv := mcp.New(mcp.Config{Orchestrator: st.orch, Recipes: recipes, Logger: log})
	defer srv.Close()
	log.Info("triad mcp serving on stdio", "store", c.Store, "sandbox", st.backend, "version", version.String())
	return srv.ServeStdio(ctx)
}
