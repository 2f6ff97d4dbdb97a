package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/docker/image"
)

// sandboxConfig holds the sandbox flags.
type sandboxConfig struct {
	Backend        string
	Image          string
	Memory         string
	CPUs           float64
	Pids           int64
	Disk           string
	CellTimeout    time.Duration
	MaxCellTimeout time.Duration
	IdleTTL        time.Duration
	Warm           int

	memory, disk int64
}

func (c *sandboxConfig) flags(f *flagSet) {
	f.str(&c.Backend, "sandbox", "auto", "sandbox backend: docker, wasm, auto (docker when an engine answers, else wasm) or none")
	f.str(&c.Image, "image", "", "sandbox image for --sandbox docker (default: the tag this build derives from its package list, built on first use)")
	f.str(&c.Memory, "memory", "2GiB", "memory per kernel, swap included")
	f.float(&c.CPUs, "cpus", 1, "CPUs per kernel")
	f.int64(&c.Pids, "pids", 256, "processes and threads per kernel")
	f.str(&c.Disk, "disk", "2GiB", "disk quota of each kernel's working directory")
	f.duration(&c.CellTimeout, "cell-timeout", 60*time.Second, "default cell deadline (timeout_s overrides it)")
	f.duration(&c.MaxCellTimeout, "max-cell-timeout", 10*time.Minute, "largest deadline a cell may ask for")
	f.duration(&c.IdleTTL, "idle-ttl", 30*time.Minute, "stop a run's kernel after this long unused (its files stay)")
	f.int(&c.Warm, "warm", 2, "ready kernels kept in the warm pool")
}

func (c *sandboxConfig) validate() error {
	switch c.Backend {
	case "docker", "wasm", "auto", "none":
	default:
		return fmt.Errorf("--sandbox %q: want docker, wasm, auto or none", c.Backend)
	}
	var err error
	if c.memory, err = parseBytes(c.Memory); err != nil {
		return fmt.Errorf("--memory: %w", err)
	}
	if c.disk, err = parseBytes(c.Disk); err != nil {
		return fmt.Errorf("--disk: %w", err)
	}
	if c.CPUs <= 0 || c.Pids <= 0 || c.Warm < 0 || c.CellTimeout <= 0 || c.MaxCellTimeout < c.CellTimeout {
		return fmt.Errorf("--cpus and --pids must be positive, --warm not negative, and --max-cell-timeout at least --cell-timeout")
	}
	return nil
}

func (c *sandboxConfig) limits() sandbox.Limits {
	return sandbox.Limits{MemoryBytes: c.memory, CPUs: c.CPUs, Pids: c.Pids, DiskBytes: c.disk}
}

// openSandbox starts the configured backend. progress receives the image
// build's output on first use. It returns nil for --sandbox none.
func openSandbox(ctx context.Context, c *config, log *slog.Logger, progress io.Writer) (sandbox.Backend, error) {
	sc := &c.Sandbox
	if sc.Backend == "none" {
		return nil, nil
	}
	if sc.Backend == "docker" || sc.Backend == "auto" {
		b, err := openDocker(ctx, c, log, progress)
		if err == nil || sc.Backend == "docker" {
			return b, err
		}
		log.Warn("no Docker engine answers; using the embedded wasm sandbox", "err", err)
	}
	return openWasm(ctx, c, log)
}

func openDocker(ctx context.Context, c *config, log *slog.Logger, progress io.Writer) (sandbox.Backend, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = cli.Ping(pctx)
	cancel()
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: no Docker engine answers: %v", sandbox.ErrUnavailable, err)
	}
	tag := c.Sandbox.Image
	if tag == "" {
		tag, err = image.Ensure(ctx, cli, image.Options{Progress: progress, Logger: log})
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("sandbox image: %w", err)
		}
	}
	cli.Close()
	return docker.New(ctx, docker.Config{
		Image:       tag,
		WorkRoot:    filepath.Join(c.Data, "work", "docker"),
		Defaults:    c.Sandbox.limits(),
		CellTimeout: c.Sandbox.CellTimeout,
		Logger:      log,
	})
}

// parseBytes reads "2GiB", "512MiB", "2g", "1048576".
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%q is not a size like 2GiB, 512MiB or 1048576", s)
	}
	return int64(f * float64(mult)), nil
}
