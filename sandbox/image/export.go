package image

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/triadhq/triad/internal/dockerarchive"
)

// Tarball returns the cached root filesystem tarball for the current recipe,
// building it first when it is missing (which needs root, debootstrap and
// the Debian mirror, and takes minutes). It needs no Docker engine.
func Tarball(ctx context.Context, opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	tarball := TarballPath(opts.CacheDir)
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil
	}
	unlock, err := lock(ctx, opts.CacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil // another process built it while we waited
	}
	fmt.Fprintf(opts.Progress, "image: no cached root filesystem at %s; building it (several minutes)\n", tarball)
	if err := buildRootfs(ctx, opts, tarball); err != nil {
		return "", err
	}
	return tarball, nil
}

// ExportDockerArchive writes the sandbox image, tagged Tag(), to w as a
// one-layer docker-archive: the format of `docker save`, which
// `ctr images import` and `docker load` read. It is how a cluster without a
// registry gets the image (scripts/kube.sh). The layer is the cached root
// filesystem tarball itself, streamed once (internal/dockerarchive).
func ExportDockerArchive(ctx context.Context, w io.Writer, opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	tarball, err := Tarball(ctx, opts)
	if err != nil {
		return "", err
	}
	f, err := os.Open(tarball)
	if err != nil {
		return "", fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	tag := Tag()
	start := time.Now()
	c := Config()
	if _, err := dockerarchive.Write(ctx, w, dockerarchive.Image{
		Tag:       tag,
		Layer:     f,
		LayerSize: fi.Size(),
		Config:    dockerarchive.Config{Env: c.Env, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User},
		CreatedBy: "triad image export (" + recipeVersion + ", debootstrap " + Suite + ")",
	}); err != nil {
		return "", err
	}
	d := time.Since(start).Round(100 * time.Millisecond)
	fmt.Fprintf(opts.Progress, "image: exported %s (%d MiB) as a docker-archive in %s\n", tag, fi.Size()>>20, d)
	opts.Logger.InfoContext(ctx, "sandbox image exported", "tag", tag, "format", "docker-archive", "duration", d)
	return tag, nil
}
