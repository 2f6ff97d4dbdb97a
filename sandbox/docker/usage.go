package docker

import (
	"context"
	"encoding/json"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/triadhq/triad/sandbox"
)

var _ sandbox.Meter = (*Kernel)(nil)

// Usage implements sandbox.Meter from the engine's one-shot stats of the
// kernel's container (its cgroup): the CPU time of every process in it,
// and its memory less the inactive page cache, as `docker stats` counts
// it. A context shares its container, so it reports the container's.
func (k *Kernel) Usage(ctx context.Context) (sandbox.Usage, error) {
	// containerID is set before the kernel is handed out and never
	// changes after, so reading it needs no lock (Execute holds k.mu for
	// the whole cell).
	id := k.containerID
	if k.parent != nil {
		id = k.parent.containerID
	}
	resp, err := k.b.cli.ContainerStatsOneShot(ctx, id)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return sandbox.Usage{}, fmt.Errorf("kernel %s: %w", k.ID(), sandbox.ErrClosed)
		}
		return sandbox.Usage{}, fmt.Errorf("kernel %s: stats: %w", k.ID(), err)
	}
	defer resp.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return sandbox.Usage{}, fmt.Errorf("kernel %s: decode stats: %w", k.ID(), err)
	}
	return usageOf(st), nil
}

// usageOf reads a container's stats: cgroup v1 names the inactive page
// cache total_inactive_file, v2 inactive_file.
func usageOf(st container.StatsResponse) sandbox.Usage {
	mem := st.MemoryStats.Usage
	inactive, ok := st.MemoryStats.Stats["total_inactive_file"]
	if !ok {
		inactive = st.MemoryStats.Stats["inactive_file"]
	}
	if inactive < mem {
		mem -= inactive
	}
	return sandbox.Usage{CPUSeconds: float64(st.CPUStats.CPUUsage.TotalUsage) / 1e9, MemoryBytes: int64(mem)}
}
