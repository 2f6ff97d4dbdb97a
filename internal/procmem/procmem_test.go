package procmem_test

import (
	"os/exec"
	"testing"

	"github.com/triadhq/triad/internal/procmem"
)

// This process's and a child's figures are read, and they grow with the
// memory a process touches.
func TestFigures(t *testing.T) {
	rss, peak, err := procmem.RSS(0)
	if err != nil || rss <= 0 || peak < rss {
		t.Fatalf("self: rss %d peak %d, %v", rss, peak, err)
	}
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = 1
	}
	after, _, err := procmem.RSS(0)
	if err != nil || after < rss+32<<20 {
		t.Fatalf("self after touching 64 MiB: rss %d (before %d), %v", after, rss, err)
	}
	_ = buf[len(buf)-1]
	roll, err := procmem.Rollup(0)
	if err != nil || roll["Rss"] <= 0 || roll["Pss"] <= 0 || roll["Pss"] > roll["Rss"] {
		t.Fatalf("smaps_rollup: %v, %v", roll, err)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if rss, _, err := procmem.RSS(cmd.Process.Pid); err != nil || rss <= 0 || rss >= after {
		t.Fatalf("child sleep: rss %d, %v, want a small positive figure", rss, err)
	}
	if _, _, err := procmem.RSS(1 << 30); err == nil {
		t.Fatal("a pid that does not exist: got no error")
	}
}
