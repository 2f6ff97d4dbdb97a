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
	return k.usage(ctx, false)
}

// Sample implements sandbox.Meter: one sample of the engine's stats, at
// once.
func (k *Kernel) Sample(ctx context.Context) (sandbox.Usage, error) {
	return k.usage(ctx, true)
}

func (k *Kernel) usage(ctx context.Context, oneShot bool) (sandbox.Usage, error) {
	if k.parent != nil {
		return k.parent.usage(ctx, oneShot)
	}
	// Read as ID reads it: k.mu is held while a cell runs, which must not
	// hold up a reading.
	id := k.containerID
	if id == "" || k.isClosing() {
		return sandbox.Usage{}, sandbox.ErrClosed
	}
	// Since first: a restart moves it before its container starts, so a
	// reading of the new container never pairs with the old Since.
	var since time.Time
	if p := k.started.Load(); p != nil {
		since = *p
	}
	st, err := k.stats(ctx, id, oneShot)
	if err != nil {
		return sandbox.Usage{}, err
	}
	if st.Read.IsZero() && oneShot {
		// The engine answers a stopped container (one restarting) with an
		// empty sample: zeros, which accounting must not take for a
		// reading. (E2B's metrics report them: a stopped sandbox uses
		// nothing.)
		return sandbox.Usage{}, fmt.Errorf("stats of container %s: not running: %w", shortID(id), sandbox.ErrClosed)
	}
	u := sandbox.Usage{At: st.Read, CPUTime: time.Duration(st.CPUStats.CPUUsage.TotalUsage), CPUs: k.limits.CPUs,
		Since: since, MemoryLimitBytes: int64(st.MemoryStats.Limit), CPUPercent: -1}
	if u.At.IsZero() {
		u.At = time.Now()
	}
	if u.CPUs <= 0 {
		u.CPUs = float64(st.CPUStats.OnlineCPUs)
		if u.CPUs <= 0 {
			u.CPUs = float64(runtime.NumCPU())
		}
	}
	if wall := st.Read.Sub(st.PreRead); !oneShot && wall > 0 && !st.PreRead.IsZero() && st.CPUStats.CPUUsage.TotalUsage >= st.PreCPUStats.CPUUsage.TotalUsage {
		used := time.Duration(st.CPUStats.CPUUsage.TotalUsage - st.PreCPUStats.CPUUsage.TotalUsage)
		u.CPUPercent = min(100, 100*used.Seconds()/(wall.Seconds()*u.CPUs))
	} else if !oneShot {
		u.CPUPercent = 0
	}
	// What the kernel can reclaim at once is the inactive file pages
	// (cgroup v1's total_inactive_file, v2's inactive_file), which docker
	// stats subtracts too. Not v1's whole "cache": under gVisor the
	// sandbox's own memory is the host's shared file pages, counted there.
	cache, ok := st.MemoryStats.Stats["total_inactive_file"]
	if !ok {
		cache = st.MemoryStats.Stats["inactive_file"]
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
