package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"
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

// Archive entry names. Any names work: importers find the config and the
// layers through manifest.json.
const (
	archiveLayer    = "layer.tar"
	archiveConfig   = "config.json"
	archiveManifest = "manifest.json"
)

// ExportDockerArchive writes the sandbox image, tagged Tag(), to w as a
// one-layer docker-archive: the format of `docker save`, which
// `ctr images import` and `docker load` read. It is how a cluster without a
// registry gets the image (scripts/kube.sh). The layer is the cached root
// filesystem tarball itself, streamed once: its digest is computed on the way
// and the config that names it is written after it.
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
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: archiveLayer, Mode: 0o644, Size: fi.Size(), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return "", fmt.Errorf("export %s: %w", tag, err)
	}
	h := sha256.New()
	if err := copyCtx(ctx, io.MultiWriter(tw, h), f); err != nil {
		return "", fmt.Errorf("export %s: layer: %w", tag, err)
	}
	config, err := archiveConfigJSON("sha256:" + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: archiveConfig, RepoTags: []string{tag}, Layers: []string{archiveLayer}}})
	if err != nil {
		return "", err
	}
	for _, e := range []struct {
		name string
		data []byte
	}{{archiveConfig, config}, {archiveManifest, manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return "", fmt.Errorf("export %s: %w", tag, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return "", fmt.Errorf("export %s: %w", tag, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("export %s: %w", tag, err)
	}
	d := time.Since(start).Round(100 * time.Millisecond)
	fmt.Fprintf(opts.Progress, "image: exported %s (%d MiB) as a docker-archive in %s\n", tag, fi.Size()>>20, d)
	opts.Logger.InfoContext(ctx, "sandbox image exported", "tag", tag, "format", "docker-archive", "duration", d)
	return tag, nil
}

// archiveImage is the image config (the Docker and OCI image config JSON)
// an archive carries.
type archiveImage struct {
	Architecture string         `json:"architecture"`
	OS           string         `json:"os"`
	Config       archiveRun     `json:"config"`
	RootFS       archiveRootFS  `json:"rootfs"`
	History      []archiveEvent `json:"history"`
}

type archiveRun struct {
	Env        []string
	Cmd        []string
	WorkingDir string
	User       string
}

type archiveRootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type archiveEvent struct {
	CreatedBy string `json:"created_by"`
}

// archiveConfigJSON is the config of the one-layer image whose uncompressed
// layer has the digest diffID.
func archiveConfigJSON(diffID string) ([]byte, error) {
	c := Config()
	return json.Marshal(archiveImage{
		// The root filesystem is debootstrapped for the host's own
		// architecture.
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Config:       archiveRun{Env: c.Env, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User},
		RootFS:       archiveRootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []archiveEvent{{CreatedBy: "triad image export (" + recipeVersion + ", debootstrap " + Suite + ")"}},
	})
}

// copyCtx is io.Copy that stops between chunks once ctx is done.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) error {
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
