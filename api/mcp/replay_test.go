package mcp

import (
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/wire"
)

// An agent's session over MCP (a write, cells with random draws and a plot,
// a search, a kernel restart in the middle) replays to identical files:
// the replay restarts its kernel where the session did, so the cell after
// the restart sees no earlier variable in the replay either.
func TestMCPSessionReplays(t *testing.T) {
	s := newStack(t, stackOptions{sandbox: true})
	cs := connectHTTP(t, s)
	res := call(t, cs, ToolWrite, map[string]any{"path": "data/n.txt", "text": "17\n"})
	ok[wire.FileRef](t, res)
	run := runid.Must(runOf(t, res))
	exec := func(code string) {
		t.Helper()
		if out := ok[wire.ExecResponse](t, call(t, cs, ToolExec, map[string]any{"code": code})); !out.OK {
			t.Fatalf("%s: %+v", code, out.Error)
		}
	}
	exec("import random, numpy as np\nx = int(open('data/n.txt').read())\nopen('draws.txt', 'w').write(repr([random.random(), float(np.random.rand())]))")
	ok[wire.SearchResponse](t, call(t, cs, ToolSearch, map[string]any{"query": "analytics vendors market share"}))
	if res := call(t, cs, ToolRestart, map[string]any{}); res.IsError {
		t.Fatalf("restart: %s", text(res))
	}
	exec("import numpy as np\nopen('after.txt', 'w').write(f\"{'x' in globals()} {np.random.rand()}\")")
	exec("import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.savefig('plot.png')\nplt.show()")

	rep, err := replay.Run(t.Context(), s.orch, run, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Files {
		if f.Status != wire.ReplayIdentical {
			t.Errorf("%s: %s (diverged at step %d)", f.Path, f.Status, f.DivergedAt)
		}
	}
	after, _, err := s.store.ReadAll(t.Context(), runid.Must(rep.RunID), "after.txt")
	if err != nil || len(after) < 6 || string(after[:6]) != "False " {
		t.Errorf("after the restart the replay's kernel kept state: after.txt %q %v", after, err)
	}
	if !rep.Identical || len(rep.Files) < 6 {
		t.Errorf("got identical=%v over %d files, want identical over data/n.txt, draws.txt, the citations record, after.txt, plot.png and the displayed plot; why %q",
			rep.Identical, len(rep.Files), rep.Why)
	}
}
