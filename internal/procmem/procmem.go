// Package procmem reads a Linux process's memory figures from /proc, for
// the tests and benchmarks that hold Triad to its memory bounds.
package procmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Figures maps a field of a /proc memory file (VmRSS, VmHWM, Rss, Pss and
// the like, without the colon) to its value in bytes.
type Figures map[string]int64

// Status reads /proc/<pid>/status; pid 0 means this process.
func Status(pid int) (Figures, error) { return read(pid, "status") }

// Rollup reads /proc/<pid>/smaps_rollup (Rss, Pss: the process's share of
// pages it shares with others); pid 0 means this process.
func Rollup(pid int) (Figures, error) { return read(pid, "smaps_rollup") }

// RSS returns a process's resident set and its peak (VmRSS, VmHWM) in
// bytes; pid 0 means this process.
func RSS(pid int) (rss, peak int64, err error) {
	f, err := Status(pid)
	if err != nil {
		return 0, 0, err
	}
	if _, ok := f["VmRSS"]; !ok {
		return 0, 0, fmt.Errorf("procmem: no VmRSS in /proc/%s/status", name(pid))
	}
	return f["VmRSS"], f["VmHWM"], nil
}

func name(pid int) string {
	if pid == 0 {
		return "self"
	}
	return strconv.Itoa(pid)
}

// read parses the "Name:   123 kB" lines of /proc/<pid>/<file>.
func read(pid int, file string) (Figures, error) {
	data, err := os.ReadFile("/proc/" + name(pid) + "/" + file)
	if err != nil {
		return nil, fmt.Errorf("procmem: %w", err)
	}
	out := Figures{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v, ok := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		if !ok {
			continue // not a size
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[key] = n << 10
		}
	}
	return out, nil
}
