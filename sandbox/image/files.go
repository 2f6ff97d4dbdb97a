package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
)

//go:embed python/*.py
var pythonFS embed.FS

// sudoShim is /usr/local/bin/sudo: the sandbox has no root to become.
//
//go:embed bin/sudo
var sudoShim []byte

// The Deno release the image carries, for the JavaScript and TypeScript
// kernels (`deno jupyter`). Debian has no Deno; the npm registry ships
// its Linux binary as @deno/linux-x64-glibc (MIT), which the builder
// fetches with npm and checks against this integrity before unpacking.
// See docs/DECISIONS.md, "Kernels in more languages".
const (
	denoPackage   = "@deno/linux-x64-glibc"
	denoVersion   = "2.9.6"
	denoIntegrity = "sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3iLP9vBQJtEgc116OAoQ=="
)

type pythonFile struct {
	name string
	data []byte
}

// pythonFiles are Triad's Python modules for the image's PythonDir,
// sorted by name.
func pythonFiles() []pythonFile {
	entries, err := fs.ReadDir(pythonFS, "python")
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []pythonFile
	for _, e := range entries {
		data, err := pythonFS.ReadFile(path.Join("python", e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, pythonFile{e.Name(), data})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// installTriad writes the sudo shim into the root filesystem and makes
// PythonDir, the mount point of Triad's Python modules.
func installTriad(root string) error {
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/sudo"), sudoShim, 0o755); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(root, PythonDir), 0o755)
}

// WritePython writes Triad's Python modules (rich displays, the bash
// kernel, the Deno kernel's relay) into dir, readable by every uid, for a
// backend to mount read-only at PythonDir. They ship with the binary, not
// the image: they are Triad's code and change with it, while the image
// changes only with its packages. See docs/DECISIONS.md, "Kernels in more
// languages".
func WritePython(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, f := range pythonFiles() {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o644); err != nil {
			return err
		}
		if err := os.Chmod(tmp, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return err
		}
	}
	return nil
}

// denoTarball returns the path of the Deno package in the cache, fetching
// it with npm when it is missing. Its integrity is checked either way.
func denoTarball(ctx context.Context, b *builder, cacheDir string) (string, error) {
	dir := filepath.Join(cacheDir, "image", "npm")
	dst := filepath.Join(dir, "deno-linux-x64-glibc-"+denoVersion+".tgz")
	if _, err := os.Stat(dst); err != nil {
		if _, err := exec.LookPath("npm"); err != nil {
			return "", fmt.Errorf("building the sandbox image needs npm to fetch %s@%s (apt-get install npm), or that package at %s: %w", denoPackage, denoVersion, dst, err)
		}
		tmp, err := os.MkdirTemp(filepath.Join(cacheDir, "image"), "npm-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		if err := b.run(ctx, "npm", "pack", "--silent", "--pack-destination", tmp, "--cache", filepath.Join(dir, "_cacache"), denoPackage+"@"+denoVersion); err != nil {
			return "", err
		}
		got, _ := filepath.Glob(filepath.Join(tmp, "*.tgz"))
		if len(got) != 1 {
			return "", fmt.Errorf("npm pack %s@%s left %d tarballs", denoPackage, denoVersion, len(got))
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		if err := os.Rename(got[0], dst); err != nil {
			return "", err
		}
	}
	if err := checkIntegrity(dst, denoIntegrity); err != nil {
		os.Remove(dst)
		return "", err
	}
	return dst, nil
}

func checkIntegrity(file, want string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := "sha512-" + base64.StdEncoding.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: integrity %s, want %s", file, got, want)
	}
	return nil
}

// installDeno unpacks the deno binary from the npm package into
// /usr/local/bin.
func installDeno(tarball, root string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s holds no package/deno", tarball)
		}
		if err != nil {
			return err
		}
		if h.Name != "package/deno" {
			continue
		}
		dst := filepath.Join(root, "usr/local/bin/deno")
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, tr); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
}
