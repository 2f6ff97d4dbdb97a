// Package dockerarchive writes a one-layer image as a docker-archive, the format of `docker save` that `docker load` and `ctr images import` read.
//
// The layer is streamed once: its digest is computed on the way and the
// config that names it is written after it, so a layer of a gigabyte costs
// no memory and no second pass. Both of Triad's images are written this
// way: the sandbox image (sandbox/image, from the cached root
// filesystem) and Triad's own server image (cmd/triad, from the running
// binary), so that a cluster without a registry, or an operator pushing to
// one, needs no image builder.
package dockerarchive

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"time"
)

// Entry names in the archive. Importers find the config and the layer
// through manifest.json, so any names work.
const (
	LayerName    = "layer.tar"
	ConfigName   = "config.json"
	ManifestName = "manifest.json"
)

// Config is the image's run-time configuration.
type Config struct {
	Env        []string `json:",omitempty"`
	Entrypoint []string `json:",omitempty"`
	Cmd        []string `json:",omitempty"`
	WorkingDir string   `json:",omitempty"`
	User       string   `json:",omitempty"`
}

// Image is what Write writes.
type Image struct {
	// Tag is the image's reference, e.g. "triad:v1.2.3".
	Tag string
	// Layer is an uncompressed tar of the root filesystem, LayerSize bytes
	// long.
	Layer     io.Reader
	LayerSize int64
	Config    Config
	// CreatedBy goes into the image's history.
	CreatedBy string
}

type imageConfig struct {
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       Config    `json:"config"`
	RootFS       rootFS    `json:"rootfs"`
	History      []history `json:"history"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	CreatedBy string `json:"created_by"`
}

// Write writes img to w as a docker-archive and returns the layer's
// digest ("sha256:…").
func Write(ctx context.Context, w io.Writer, img Image) (string, error) {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: LayerName, Mode: 0o644, Size: img.LayerSize, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return "", fmt.Errorf("write image %s: %w", img.Tag, err)
	}
	h := sha256.New()
	n, err := copyCtx(ctx, io.MultiWriter(tw, h), io.LimitReader(img.Layer, img.LayerSize))
	if err != nil {
		return "", fmt.Errorf("write image %s: layer: %w", img.Tag, err)
	}
	if n != img.LayerSize {
		return "", fmt.Errorf("write image %s: the layer ended after %d of %d bytes", img.Tag, n, img.LayerSize)
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	config, err := json.Marshal(imageConfig{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Config:       img.Config,
		RootFS:       rootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []history{{CreatedBy: img.CreatedBy}},
	})
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: ConfigName, RepoTags: []string{img.Tag}, Layers: []string{LayerName}}})
	if err != nil {
		return "", err
	}
	for _, e := range []struct {
		name string
		data []byte
	}{{ConfigName, config}, {ManifestName, manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return "", fmt.Errorf("write image %s: %w", img.Tag, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return "", fmt.Errorf("write image %s: %w", img.Tag, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("write image %s: %w", img.Tag, err)
	}
	return diffID, nil
}

// copyCtx is io.Copy that stops between chunks once ctx is done.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, err := src.Read(buf)
		if m > 0 {
			if _, werr := dst.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
