package main_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/testenv"
)

// TestE2BSDK runs the Node suite in e2e/e2b: E2B's official SDKs (e2b,
// @e2b/code-interpreter, pinned by its lockfile and installed from npm into
// the cache by scripts/e2b-sdk.sh) drive a real triad serve with nothing but
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. It fails if any Node test
// fails, is skipped or is marked todo: every test in the suite is a claim.
func TestE2BSDK(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "Node.js 20+ with npm (apt-get install nodejs npm)")
		}
	}
	dockerClient(t).Close()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	install := exec.Command(filepath.Join(root, "scripts", "e2b-sdk.sh"), "install")
	var stderr bytes.Buffer
	install.Stderr = &stderr
	if out, err := install.Output(); err != nil {
		t.Fatalf("scripts/e2b-sdk.sh install: %v\n%s%s", err, out, stderr.String())
	}

	const key = "e2b_7269616420652b62207465737420" // the Python SDK demands e2b_<hex>
	bin := buildTriad(t)
	// The suite's timeout test expects an interrupted cell to keep its
	// kernel: the grace is long enough for a loaded host to deliver the
	// interrupt.
	srv := startServer(t, bin, t.TempDir(), "--sandbox", "docker", "--warm", "2", "--e2b-api-key", key, "--interrupt-grace", "30s")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=tap")
	node.Dir = filepath.Join(root, "e2e", "e2b")
	node.Env = append(os.Environ(), "E2B_API_URL="+srv.url, "E2B_SANDBOX_URL="+srv.url, "E2B_API_KEY="+key, "TRIAD_URL="+srv.url, "TRIAD_API_KEY="+srv.key)
	var out bytes.Buffer
	node.Stdout, node.Stderr = &out, &out
	err = node.Run()
	counts := summary(t, out.String())
	if err != nil {
		t.Fatalf("node --test e2e/e2b: %v\n%s\n--- triad serve log (tail) ---\n%s", err, out.String(), tail(srv.logs.String(), 60))
	}
	if counts["pass"] == 0 || counts["todo"] != 0 || counts["skipped"] != 0 {
		t.Fatalf("node --test e2e/e2b: %v; want every test to run and pass, none todo or skipped\n%s", counts, out.String())
	}
}

// summary logs each test's verdict and the totals from the TAP output, and
// returns the totals ("pass", "fail", "todo", "skipped", ...).
func summary(t *testing.T, tap string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(tap))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	// A failing test's diagnostic block (the YAML between "not ok" and
	// "...") is logged right under its verdict, so the reason is in the
	// first screen of a failed run's output, not after the whole TAP.
	diag := 0
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "not ok ") {
			t.Log(l)
			diag = 0
			if strings.HasPrefix(l, "not ok ") {
				diag = 40
			}
			continue
		}
		if diag > 0 {
			if strings.TrimSpace(l) == "..." {
				diag = 0
			} else {
				t.Log("    " + l)
				diag--
			}
		}
		if f := strings.Fields(l); len(f) == 3 && f[0] == "#" {
			if n, err := strconv.Atoi(f[2]); err == nil {
				counts[f[1]] = n
				t.Log(l)
			}
		}
	}
	return counts
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
