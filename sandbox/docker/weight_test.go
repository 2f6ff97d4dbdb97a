package docker

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/triadhq/triad/sandbox"
)

// TestStartCPUWeight: a kernel's container starts at the low CPU weight,
// so its ipykernel import yields to running kernels, and runs at the
// normal weight once it has answered, restarts included; its CPU limit
// holds throughout. With StartCPUShares at the normal weight nothing is
// lowered. The weight is read from the container's cgroup on the host, as
// the kernel scheduler sees it, and from the engine's record.
func TestStartCPUWeight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start int64 // Config.StartCPUShares
		want  int64 // the weight while the kernel starts
	}{
		{"default", 0, DefaultStartCPUShares},
		{"off", NormalCPUShares, NormalCPUShares},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t, Config{StartCPUShares: tc.start})
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			// The engine reports the container's start before the kernel
			// has imported ipykernel (seconds of CPU at the low weight), and
			// the weight is raised only after the kernel answers.
			msgs, errs := b.cli.Events(ctx, events.ListOptions{Filters: filters.NewArgs(
				filters.Arg("type", "container"), filters.Arg("event", "start"),
				filters.Arg("label", LabelRoot+"="+b.rootTag))})
			started := make(chan sandbox.Kernel, 1)
			failed := make(chan error, 1)
			go func() {
				k, err := b.Start(ctx, sandbox.Spec{Owner: "run-weight"})
				if err != nil {
					failed <- err
					return
				}
				started <- k
			}()
			select {
			case m := <-msgs:
				if got := cgroupShares(t, b, m.Actor.ID); got != tc.want {
					t.Errorf("starting kernel's cgroup: got cpu.shares %d, want %d", got, tc.want)
				}
			case err := <-errs:
				t.Fatalf("engine events: %v", err)
			case err := <-failed:
				t.Fatalf("Start: %v", err)
			}
			var k sandbox.Kernel
			select {
			case k = <-started:
			case err := <-failed:
				t.Fatalf("Start: %v", err)
			}
			t.Cleanup(func() { _ = k.Close() })
			id := k.(*Kernel).containerID
			check := func(when string) {
				t.Helper()
				if got := cgroupShares(t, b, id); got != NormalCPUShares {
					t.Errorf("%s: cgroup cpu.shares got %d, want %d", when, got, NormalCPUShares)
				}
				ci, err := b.cli.ContainerInspect(ctx, id)
				if err != nil {
					t.Fatalf("inspect: %v", err)
				}
				if got, want := ci.HostConfig.CPUShares, int64(NormalCPUShares); got != want {
					t.Errorf("%s: engine's CPUShares got %d, want %d", when, got, want)
				}
				if got, want := ci.HostConfig.NanoCPUs, int64(DefaultCPUs*1e9); got != want {
					t.Errorf("%s: NanoCPUs got %d, want %d (the CPU limit)", when, got, want)
				}
			}
			check("running")
			if v := value(t, run1(t, k, "1+1", 30*time.Second)); v != "2" {
				t.Fatalf("1+1: got %s, want 2", v)
			}
			res := run1(t, k, "import os; os._exit(1)", 30*time.Second)
			if res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || !res.Restarted {
				t.Fatalf("os._exit: got %s, want kernel_died, restarted", describe(res))
			}
			check("restarted")
		})
	}
}

// cgroupShares reads the cpu weight of a container's cgroup on the host:
// cpu.shares on cgroup v1, cpu.weight on v2 (converted back by the
// engine's formula, shares 2..262144 onto weight 1..10000, so the two
// compare).
func cgroupShares(t *testing.T, b *Backend, id string) int64 {
	t.Helper()
	ci, err := b.cli.ContainerInspect(t.Context(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	if ci.State == nil || ci.State.Pid == 0 {
		t.Fatalf("container %s is not running", shortID(id))
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", ci.State.Pid))
	if err != nil {
		t.Fatalf("the kernel's cgroup: %v", err)
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpu" {
				v1 = parts[2]
			}
		}
	}
	read := func(p string) int64 {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return n
	}
	if v1 != "" {
		return read(filepath.Join("/sys/fs/cgroup/cpu", v1, "cpu.shares"))
	}
	w := read(filepath.Join("/sys/fs/cgroup", v2, "cpu.weight"))
	// runc before 1.3 converts linearly: weight = 1 + (shares-2)*9999/262142.
	for _, s := range []int64{DefaultStartCPUShares, NormalCPUShares} {
		if 1+(s-2)*9999/262142 == w {
			return s
		}
	}
	return -w
}
