package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/replay"
	"github.com/triadhq/triad/wire"
)

// replayCmd is "triad replay RUN_ID": a new run that re-executes the run's
// calls from its trace and compares every file it produced, in-process over
// the store, or on a server with --server. It fails when a file differs, so
// that `triad replay RUN && ...` reads as "if the run reproduces".
func replayCmd(ctx context.Context, args []string) error {
	var c config
	var server, asOf, seed, key string
	var asJSON bool
	fs := newFlagSet("replay")
	c.common(fs)
	fs.str(&key, "api-key", "", "API key for --server (Authorization: Bearer)")
	fs.StringVar(&server, "server", "", "replay on this triad server (e.g. http://127.0.0.1:8080) instead of in-process")
	fs.StringVar(&seed, "seed", "", "replay with this seed instead of the original's")
	fs.StringVar(&asOf, "as-of", "", "replay as of this date (YYYY-MM-DD) instead of the original's")
	fs.BoolVar(&asJSON, "json", false, "print the report (artifacts/reproducibility.json) instead of a summary")
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	if id == "" {
		return fmt.Errorf("usage: triad replay RUN_ID [--seed N] [--as-of YYYY-MM-DD] [--server URL] [--json]")
	}
	run, err := runid.Parse(id)
	if err != nil {
		return err
	}
	var req wire.ReplayRequest
	if seed != "" {
		var n int64
		if _, err := fmt.Sscan(seed, &n); err != nil {
			return fmt.Errorf("--seed %q: want an integer", seed)
		}
		req.Seed = &n
	}
	if asOf != "" {
		req.AsOf = &asOf
	}
	var rep *wire.ReplayReport
	if server != "" {
		if rep, err = replayRemote(ctx, server, key, run, req); err != nil {
			return err
		}
	} else {
		if err := c.validate(fs); err != nil {
			return err
		}
		st, _, err := open(ctx, &c)
		if err != nil {
			return err
		}
		defer st.Close()
		fmt.Fprintf(os.Stderr, "triad: replaying run %s (data in %s)\n", run, c.Data)
		if rep, err = replay.Run(ctx, st.orch, run, replay.Options{Seed: req.Seed, AsOf: req.AsOf}); err != nil {
			return err
		}
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printReport(rep)
	}
	if !rep.Identical {
		return fmt.Errorf("run %s did not reproduce: %d of %d file(s) differ, first at step %d (replay run %s)",
			rep.Original, rep.Different, rep.Different+rep.Same, rep.FirstDivergence, rep.RunID)
	}
	return nil
}

func printReport(rep *wire.ReplayReport) {
	verdict := "reproduced"
	if !rep.Identical {
		verdict = "diverged"
	}
	fmt.Printf("replay %s of run %s: %s: %d identical, %d different (seed %d, as_of %q; replay %.1f s, original's calls %.1f s)\n",
		rep.RunID, rep.Original, verdict, rep.Same, rep.Different, rep.Setup.Replay.Seed, rep.Setup.Replay.AsOf,
		float64(rep.DurationMs)/1000, float64(rep.OriginalMs)/1000)
	for _, f := range rep.Files {
		mark := "="
		if f.Status != wire.ReplayIdentical {
			mark = "≠"
		}
		line := fmt.Sprintf("  %s %-48s %s", mark, f.Path, f.Original.Short())
		if f.Status != wire.ReplayIdentical {
			line += fmt.Sprintf(" -> %s (diverged at step %d)", orNone(f.Replay.Short()), f.DivergedAt)
		}
		fmt.Println(line)
	}
	for _, w := range rep.Why {
		fmt.Println("  why: " + w)
	}
	fmt.Printf("report: artifacts/reproducibility.json of run %s\n", rep.RunID)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// replayRemote asks a server for the replay: POST /runs/{id}/replay.
func replayRemote(ctx context.Context, server, key string, run runid.ID, req wire.ReplayRequest) (*wire.ReplayReport, error) {
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(server, "/")+"/runs/"+run.String()+"/replay", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if key != "" {
		hr.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST /runs/%s/replay: %d %s", run, resp.StatusCode, b)
	}
	var rep wire.ReplayReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}
