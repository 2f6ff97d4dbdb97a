package docker

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// oomScoreAdj is every kernel's host oom_score_adj: under host memory
// pressure a sandbox dies before Triad does.
const oomScoreAdj = 500

// raiseOOMScores gives every host process of a gVisor sandbox the
// kernel's oom_score_adj. runsc sets it on its Sentry and gofer once they
// run, but the systrap stub processes the Sentry forked before that keep
// the shim's score (1), and later stubs fork from those. A cell cannot
// change any of them: its own oom_score_adj is gVisor's, emulated. Failing
// to read the cgroup (Triad not on the host's /proc) is logged, not fatal:
// the Sentry, which holds the sandbox's memory, has the score already.
func (k *Kernel) raiseOOMScores(ctx context.Context) {
	b := k.b
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
	defer cancel()
	info, err := b.cli.ContainerInspect(ictx, k.containerID)
	if err != nil || info.State == nil || info.State.Pid == 0 {
		b.log.WarnContext(ctx, "gVisor sandbox: cannot find its host processes to raise their oom_score_adj", "kernel", k.ID(), "err", err)
		return
	}
	// Twice: a stub forked from one not yet raised, during the first
	// pass, is raised by the second (later forks inherit the score).
	for range 2 {
		pids, err := cgroupProcs(info.State.Pid)
		if err != nil {
			b.log.WarnContext(ctx, "gVisor sandbox: cannot list its host processes to raise their oom_score_adj", "kernel", k.ID(), "err", err)
			return
		}
		raise(ctx, k, pids)
	}
}

func raise(ctx context.Context, k *Kernel, pids []int) {
	b := k.b
	for _, pid := range pids {
		p := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
		cur, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(cur))); err == nil && n >= oomScoreAdj {
			continue
		}
		if err := os.WriteFile(p, []byte(strconv.Itoa(oomScoreAdj)), 0); err != nil && !os.IsNotExist(err) {
			b.log.WarnContext(ctx, "gVisor sandbox: raise oom_score_adj", "kernel", k.ID(), "pid", pid, "err", err)
		}
	}
}

// cgroupProcs returns the host pids in the cgroup of pid: its memory
// controller's on cgroup v1, its unified cgroup on v2.
func cgroupProcs(pid int) ([]int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	var procs string
	for _, l := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			procs = "/sys/fs/cgroup/memory" + parts[2] + "/cgroup.procs"
		case parts[0] == "0" && parts[1] == "" && procs == "":
			procs = "/sys/fs/cgroup" + parts[2] + "/cgroup.procs"
		}
	}
	if procs == "" {
		return nil, fmt.Errorf("no memory cgroup for pid %d", pid)
	}
	data, err = os.ReadFile(procs)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
