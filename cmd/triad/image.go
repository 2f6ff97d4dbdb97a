package main

import (
	"context"
	"fmt"
	"os"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/sandbox/docker/image"
)

// imageCmd is "triad image build|tag".
func imageCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "build" && args[0] != "tag") {
		return fmt.Errorf("usage: triad image build [--force] | triad image tag")
	}
	if args[0] == "tag" {
		fmt.Println(image.Tag())
		return nil
	}
	var force bool
	var cacheDir string
	fs := newFlagSet("image build")
	fs.BoolVar(&force, "force", false, "rebuild the root filesystem even when a cached one exists")
	fs.str(&cacheDir, "cache", "", "cache directory for the root filesystem tarball (default ${TRIAD_CACHE:-$HOME/.cache/triad})")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx); err != nil {
		return fmt.Errorf("no Docker engine answers (%v); start dockerd, or use --sandbox wasm", err)
	}
	opts := image.Options{CacheDir: cacheDir, Progress: os.Stderr}
	build := image.Ensure
	if force {
		build = image.Build
	}
	tag, err := build(ctx, cli, opts)
	if err != nil {
		return err
	}
	fmt.Println(tag)
	return nil
}
