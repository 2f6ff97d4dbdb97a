package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// --interrupt-grace reaches the kernels: a cell that ignores SIGINT and
// outlives its deadline is given that long after the interrupt, and the
// answer says so; the restarted kernel serves the next cell.
func TestInterruptGraceFlag(t *testing.T) {
	dockerClient(t)
	bin := buildTriad(t)
	s := startServer(t, bin, t.TempDir(), "--sandbox", "docker", "--warm", "0", "--interrupt-grace", "1500ms")
	const run = "r-grace"
	code, out := s.execHTTP(run, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)", 1)
	if code != 200 || out.Error == nil || out.Error.Kind != "timeout" || !out.Kernel.Restarted {
		t.Fatalf("a cell that ignores the interrupt: got %d %+v, want a timeout and a restarted kernel\n%s", code, out, s.logs)
	}
	if !strings.Contains(out.Error.Evalue, "within 1.5s of an interrupt") {
		t.Fatalf("evalue %q, want it to name the 1.5s grace", out.Error.Evalue)
	}
	if code, out := s.execHTTP(run, "1 + 1", 60); code != 200 || !out.OK {
		t.Fatalf("after the restart: %d %+v", code, out)
	}
	if out, err := exec.Command(bin, "serve", "--data", t.TempDir(), "--sandbox", "none", "--interrupt-grace", "0s").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--interrupt-grace") {
		t.Fatalf("serve --interrupt-grace 0s: got %v\n%s, want it refused naming the flag", err, out)
	}
}
