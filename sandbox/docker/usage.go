package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/internal/relay"
)

var (
	_ sandbox.Ports = (*Kernel)(nil)
	_ sandbox.Meter = (*Kernel)(nil)
)

// DialPort implements sandbox.Ports: the forwarder in the container
// connects to the port on the container's loopback, reached through its
// ports socket in the bind-mounted socket directory. The container's
// network stays none.
func (k *Kernel) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if k.parent != nil {
		return k.parent.DialPort(ctx, port)
	}
	if k.isClosing() {
		return nil, sandbox.ErrClosed
	}
	return relay.DialPort(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(k.sockDir, egressSock+relay.PortsSuffix))
	}, port)
}

// Usage implements sandbox.Meter: the container's cgroup, as the engine's
// stats report it. The engine samples the CPU twice, about a second apart,
// for the CPU share.
func (k *Kernel) Usage(ctx context.Context) (sandbox.Usage, error) {
	if k.parent != nil {
		return k.parent.Usage(ctx)
	}
	// Read as ID reads it: k.mu is held while a cell runs, which must not
	// hold up a reading.
	id := k.containerID
	if id == "" || k.isClosing() {
		return sandbox.Usage{}, sandbox.ErrClosed
	}
	st, err := k.stats(ctx, id, false)
	if err != nil {
		return sandbox.Usage{}, err
	}
	u := sandbox.Usage{At: st.Read, CPUTime: time.Duration(st.CPUStats.CPUUsage.TotalUsage), CPUs: k.limits.CPUs,
		MemoryLimitBytes: int64(st.MemoryStats.Limit)}
	if u.At.IsZero() {
		u.At = time.Now()
	}
	if u.CPUs <= 0 {
		u.CPUs = float64(st.CPUStats.OnlineCPUs)
		if u.CPUs <= 0 {
			u.CPUs = float64(runtime.NumCPU())
		}
	}
	if wall := st.Read.Sub(st.PreRead); wall > 0 && !st.PreRead.IsZero() && st.CPUStats.CPUUsage.TotalUsage >= st.PreCPUStats.CPUUsage.TotalUsage {
		used := time.Duration(st.CPUStats.CPUUsage.TotalUsage - st.PreCPUStats.CPUUsage.TotalUsage)
		u.CPUPercent = min(100, 100*used.Seconds()/(wall.Seconds()*u.CPUs))
	}
	// cgroup v1 calls the page cache "cache", v2 counts its reclaimable
	// part as "inactive_file"; docker stats subtracts the same.
	cache := st.MemoryStats.Stats["cache"]
	if c, ok := st.MemoryStats.Stats["inactive_file"]; ok && cache == 0 {
		cache = c
	}
	u.MemoryCacheBytes = int64(cache)
	if st.MemoryStats.Usage > cache {
		u.MemoryBytes = int64(st.MemoryStats.Usage - cache)
	}
	return u, nil
}

// stats is the engine's stats of the container id: one sample (oneShot),
// or two about a second apart, for a CPU share.
func (k *Kernel) stats(ctx context.Context, id string, oneShot bool) (container.StatsResponse, error) {
	var st container.StatsResponse
	var rd container.StatsResponseReader
	var err error
	if oneShot {
		rd, err = k.b.cli.ContainerStatsOneShot(ctx, id)
	} else {
		rd, err = k.b.cli.ContainerStats(ctx, id, false)
	}
	if cerrdefs.IsNotFound(err) {
		return st, fmt.Errorf("stats of container %s: %w", shortID(id), sandbox.ErrClosed)
	}
	if err != nil {
		return st, fmt.Errorf("stats of container %s: %w", shortID(id), err)
	}
	defer rd.Body.Close()
	if err := json.NewDecoder(rd.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("stats of container %s: %w", shortID(id), err)
	}
	return st, nil
}
