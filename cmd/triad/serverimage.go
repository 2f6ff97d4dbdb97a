package main

import (
	"archive/tar"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/triadhq/triad/internal/dockerarchive"
	"github.com/triadhq/triad/internal/version"
)

// serverUID runs Triad in its image, as deploy/kubernetes's Deployment
// does (runAsUser 65532, the customary "nonroot").
const serverUID = 65532

// serverTag is Triad's image reference for this build: triad:<version>,
// with characters a tag may not hold replaced.
func serverTag() string {
	v := regexp.MustCompile(`[^A-Za-z0-9_.-]`).ReplaceAllString(version.String(), "-")
	if len(v) > 120 {
		v = v[:120]
	}
	return "triad:" + v
}

// exportServer writes Triad's own image to w: one layer holding this very
// binary at /triad, the CA certificates from caFile, and passwd and group
// files naming the nonroot user; entrypoint /triad, command serve, user
// 65532. The binary must be static (CGO_ENABLED=0): the image has no C
// library.
func exportServer(ctx context.Context, w io.Writer, caFile string, progress io.Writer) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if err := checkStatic(self); err != nil {
		return "", err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return "", fmt.Errorf("CA certificates for the image: %w (give --ca-certs FILE)", err)
	}
	layer, err := os.CreateTemp("", "triad-server-layer-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	if err := serverLayer(layer, self, ca); err != nil {
		return "", fmt.Errorf("build the image layer: %w", err)
	}
	size, err := layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tag := serverTag()
	start := time.Now()
	if _, err := dockerarchive.Write(ctx, w, dockerarchive.Image{
		Tag:       tag,
		Layer:     layer,
		LayerSize: size,
		Config: dockerarchive.Config{
			Entrypoint: []string{"/triad"},
			Cmd:        []string{"serve"},
			User:       fmt.Sprintf("%d:%d", serverUID, serverUID),
			WorkingDir: "/",
			Env:        []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		},
		CreatedBy: "triad image export --image server (" + version.String() + ")",
	}); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "image: exported %s (%d MiB) as a docker-archive in %s\n", tag, size>>20, time.Since(start).Round(100*time.Millisecond))
	return tag, nil
}

// checkStatic refuses a dynamically linked binary: it names an ELF
// interpreter (the C library's loader), which the image does not have.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("this triad binary is dynamically linked (cgo); build a static one with `CGO_ENABLED=0 go build -o triad ./cmd/triad` and run its `image export --image server`")
		}
	}
	return nil
}

// serverLayer writes the image's root filesystem as a tar.
func serverLayer(w io.Writer, binary string, ca []byte) error {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	dir := func(name string, mode int64, uid int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid, ModTime: epoch})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []struct {
		name string
		mode int64
		uid  int
	}{{"etc/", 0o755, 0}, {"etc/ssl/", 0o755, 0}, {"etc/ssl/certs/", 0o755, 0}, {"tmp/", 0o1777, 0},
		{"home/", 0o755, 0}, {"home/nonroot/", 0o700, serverUID}, {"var/", 0o755, 0}, {"var/lib/", 0o755, 0}, {"var/lib/triad/", 0o700, serverUID}} {
		if err := dir(d.name, d.mode, d.uid); err != nil {
			return err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", serverUID, serverUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", serverUID)
	for _, f := range []struct {
		name string
		data []byte
	}{{"etc/passwd", []byte(passwd)}, {"etc/group", []byte(group)}, {"etc/ssl/certs/ca-certificates.crt", ca}} {
		if err := file(f.name, 0o644, f.data); err != nil {
			return err
		}
	}
	bin, err := os.Open(binary)
	if err != nil {
		return err
	}
	defer bin.Close()
	st, err := bin.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "triad", Mode: 0o755, Size: st.Size(), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, bin); err != nil {
		return err
	}
	return tw.Close()
}
