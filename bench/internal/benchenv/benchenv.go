// Package benchenv holds what the benchmark programs under bench/ share
// about their surroundings: the machine's load, a free loopback address and
// a freshly built triad binary.
package benchenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// LoadAvg returns the 1, 5 and 15 minute load averages as /proc/loadavg
// writes them, or "unknown".
func LoadAvg() string {
	f := loadFields()
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Load1 returns the 1 minute load average, or 0 when it cannot be read.
func Load1() float64 {
	f := loadFields()
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func loadFields() []string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a server the benchmark starts.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// BuildTriad builds ./cmd/triad into dir and returns the binary's path.
// It must run from the module root.
func BuildTriad(dir string) (string, error) {
	bin := filepath.Join(dir, "triad")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/triad").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/triad (run from the module root): %v\n%s", err, out)
	}
	return bin, nil
}
