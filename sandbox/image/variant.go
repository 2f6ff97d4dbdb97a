package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/triadhq/triad/internal/dockerarchive"
)

// Variant is an image built on the sandbox image, offline like it: extra
// Debian packages from the mirror, Python wheels from a local wheelhouse,
// files placed. A sandbox template (sandbox/template) is built as one. Its
// tag is a hash of the base image's recipe and everything the variant
// adds, file contents included, so a changed wheel or file is a new image
// and an unchanged one is never built twice.
type Variant struct {
	// Name names the variant: lower-case letters, digits and hyphens.
	Name string
	// Debian are extra Debian packages, installed with apt-get
	// --no-install-recommends.
	Debian []string
	// Wheelhouse is a host directory of wheels (*.whl); Wheels are the
	// requirements pip installs from it and from nothing else
	// (--no-index).
	Wheelhouse string
	Wheels     []string
	// Files are host files placed in the image.
	Files []VariantFile
}

// VariantFile is a host file placed in a variant's image.
type VariantFile struct {
	// Src is the file on the host.
	Src string
	// Dst is an absolute path in the image, outside the directories a
	// kernel's mounts hide (/work, /tmp, /run/kernel).
	Dst string
	// Mode is the file's permission bits; zero means 0644.
	Mode fs.FileMode
}

// variantRecipe names the variant build steps below; bump it when they
// change what ends up in the root filesystem.
const variantRecipe = "triad-sandbox-variant/1"

// ProvenancePath is where a variant's image records how it was built:
// its base, its inputs by hash, and what they installed.
const ProvenancePath = "/opt/triad/template.json"

var variantName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// debName is what a Debian package name may be (with an optional
// =version).
var debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$`)

// Validate checks a variant's names and paths; it reads nothing.
func (v Variant) Validate() error {
	if !variantName.MatchString(v.Name) {
		return fmt.Errorf("variant name %q: use lower-case letters, digits and hyphens", v.Name)
	}
	for _, d := range v.Debian {
		if !debName.MatchString(d) {
			return fmt.Errorf("variant %s: %q is not a Debian package name", v.Name, d)
		}
	}
	for _, w := range v.Wheels {
		if w == "" || strings.HasPrefix(w, "-") || strings.ContainsAny(w, " \t\n/\\") {
			return fmt.Errorf("variant %s: %q is not a requirement (a name, optionally with a version: pkg==1.2)", v.Name, w)
		}
	}
	if len(v.Wheels) > 0 && v.Wheelhouse == "" {
		return fmt.Errorf("variant %s: wheels need a wheelhouse directory to install them from", v.Name)
	}
	for _, f := range v.Files {
		clean := path.Clean(f.Dst)
		if !path.IsAbs(f.Dst) || clean == "/" {
			return fmt.Errorf("variant %s: file destination %q must be an absolute path", v.Name, f.Dst)
		}
		for _, hidden := range []string{"/work", "/tmp", "/run/kernel", "/proc", "/sys", "/dev"} {
			if clean == hidden || strings.HasPrefix(clean, hidden+"/") {
				return fmt.Errorf("variant %s: file destination %q is under %s, which a kernel's mounts hide", v.Name, f.Dst, hidden)
			}
		}
	}
	return nil
}

// Hash is the hex sha256 of the base image's recipe and the variant's
// inputs, file contents included. It reads the wheelhouse and the files.
func (v Variant) Hash() (string, error) {
	if err := v.Validate(); err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nbase=%s\nname=%s\n", variantRecipe, Hash(), v.Name)
	for _, d := range v.Debian {
		fmt.Fprintf(h, "deb %s\n", d)
	}
	for _, w := range v.Wheels {
		fmt.Fprintf(h, "wheel %s\n", w)
	}
	wheels, err := v.wheelFiles()
	if err != nil {
		return "", err
	}
	for _, w := range wheels {
		sum, err := fileSHA256(w)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "wheelhouse %s %s\n", filepath.Base(w), sum)
	}
	for _, f := range v.Files {
		sum, err := fileSHA256(f.Src)
		if err != nil {
			return "", fmt.Errorf("variant %s: %w", v.Name, err)
		}
		fmt.Fprintf(h, "file %s %o %s\n", path.Clean(f.Dst), f.mode(), sum)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (f VariantFile) mode() fs.FileMode {
	if f.Mode == 0 {
		return 0o644
	}
	return f.Mode & fs.ModePerm
}

// wheelFiles lists the wheelhouse's wheels, sorted.
func (v Variant) wheelFiles() ([]string, error) {
	if v.Wheelhouse == "" {
		return nil, nil
	}
	out, err := filepath.Glob(filepath.Join(v.Wheelhouse, "*.whl"))
	if err != nil {
		return nil, err
	}
	if len(out) == 0 && len(v.Wheels) > 0 {
		return nil, fmt.Errorf("variant %s: the wheelhouse %s holds no wheels", v.Name, v.Wheelhouse)
	}
	sort.Strings(out)
	return out, nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// VariantTag is the variant's image reference, e.g.
// "triad-sandbox-data:0123456789ab".
func (v Variant) Tag() (string, error) {
	hash, err := v.Hash()
	if err != nil {
		return "", err
	}
	return Repository + "-" + v.Name + ":" + hash[:12], nil
}

// variantTarball is where the variant's root filesystem is cached.
func variantTarball(cacheDir, hash string) string {
	return filepath.Join(cacheDir, "image", "variant-"+hash+".tar")
}

// EnsureVariant makes sure the engine has the variant's image and returns
// its tag, importing the cached root filesystem or building it first (from
// the base image's cached root filesystem, itself built when missing).
func EnsureVariant(ctx context.Context, cli Client, opts Options, v Variant) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	tag, err := v.Tag()
	if err != nil {
		return "", err
	}
	if ok, err := present(ctx, cli, tag); err != nil || ok {
		return tag, err
	}
	tarball, err := VariantTarball(ctx, opts, v)
	if err != nil {
		return "", err
	}
	unlock, err := lock(ctx, opts.CacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if ok, err := present(ctx, cli, tag); err != nil || ok {
		return tag, err
	}
	return tag, importVariant(ctx, cli, opts, tarball, tag, v)
}

// VariantTarball returns the variant's cached root filesystem, building it
// when missing. It needs no Docker engine.
func VariantTarball(ctx context.Context, opts Options, v Variant) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	hash, err := v.Hash()
	if err != nil {
		return "", err
	}
	dst := variantTarball(opts.CacheDir, hash)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	base, err := Tarball(ctx, opts)
	if err != nil {
		return "", err
	}
	unlock, err := lock(ctx, opts.CacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	fmt.Fprintf(opts.Progress, "image: building template %s on %s\n", v.Name, Tag())
	if err := buildVariant(ctx, opts, v, hash, base, dst); err != nil {
		return "", err
	}
	return dst, nil
}

// variantProvenance is ProvenancePath's content.
type variantProvenance struct {
	Recipe     string            `json:"recipe"`
	Template   string            `json:"template"`
	Hash       string            `json:"hash"`
	Base       string            `json:"base"`
	Debian     []string          `json:"debian,omitempty"`
	Wheels     []string          `json:"wheels,omitempty"`
	Wheelhouse map[string]string `json:"wheelhouse,omitempty"` // file -> sha256
	Files      map[string]string `json:"files,omitempty"`      // destination -> sha256
	Installed  json.RawMessage   `json:"installed_wheels,omitempty"`
	BuiltAt    time.Time         `json:"built_at"`
}

func buildVariant(ctx context.Context, opts Options, v Variant, hash, base, dst string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("building a template image needs root (chroot); run `triad image build --template` as root")
	}
	start := time.Now()
	scratch := filepath.Join(filepath.Dir(dst), "build-variant-"+hash[:12])
	if err := cleanScratch(scratch); err != nil {
		return err
	}
	root := filepath.Join(scratch, "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	defer func() {
		if cerr := cleanScratch(scratch); cerr != nil && err == nil {
			err = cerr
		}
	}()
	b := &builder{opts: opts, root: root}
	b.step("unpack the base root filesystem %s", filepath.Base(base))
	if err := b.run(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-xf", base); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	if err := b.run(ctx, "mount", "-t", "proc", "proc", filepath.Join(root, "proc")); err != nil {
		return err
	}
	defer func() {
		if uerr := unmountUnder(root); uerr != nil && err == nil {
			err = uerr
		}
	}()
	// Name resolution for apt-get in the chroot: the host's.
	if data, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		_ = os.WriteFile(filepath.Join(root, "etc/resolv.conf"), data, 0o644)
	}
	prov := variantProvenance{Recipe: variantRecipe, Template: v.Name, Hash: hash, Base: Tag(), Debian: v.Debian, Wheels: v.Wheels,
		Wheelhouse: map[string]string{}, Files: map[string]string{}, BuiltAt: time.Now().UTC()}
	if len(v.Debian) > 0 {
		b.step("apt-get install --no-install-recommends %s", strings.Join(v.Debian, " "))
		if err := b.chroot(ctx, "apt-get", "update"); err != nil {
			return err
		}
		if err := b.chroot(ctx, append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, v.Debian...)...); err != nil {
			return err
		}
	}
	if len(v.Wheels) > 0 {
		wheels, err := v.wheelFiles()
		if err != nil {
			return err
		}
		const inRoot = "/tmp/triad-wheelhouse"
		if err := os.MkdirAll(filepath.Join(root, inRoot), 0o755); err != nil {
			return err
		}
		for _, w := range wheels {
			sum, err := copyFile(w, filepath.Join(root, inRoot, filepath.Base(w)), 0o644)
			if err != nil {
				return err
			}
			prov.Wheelhouse[filepath.Base(w)] = sum
		}
		b.step("pip install --no-index from the wheelhouse: %s", strings.Join(v.Wheels, " "))
		args := append([]string{"python3", "-m", "pip", "install", "--no-index", "--find-links", inRoot, "--no-cache-dir",
			"--break-system-packages", "--root-user-action=ignore", "--disable-pip-version-check"}, v.Wheels...)
		if err := b.chroot(ctx, args...); err != nil {
			return err
		}
		out, err := b.output(ctx, "chroot", root, "python3", "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
		if err == nil && json.Valid(out) {
			prov.Installed = out
		}
		if err := os.RemoveAll(filepath.Join(root, inRoot)); err != nil {
			return err
		}
	}
	for _, f := range v.Files {
		d := filepath.Join(root, filepath.FromSlash(path.Clean(f.Dst)))
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			return err
		}
		b.step("place %s at %s", f.Src, f.Dst)
		sum, err := copyFile(f.Src, d, f.mode())
		if err != nil {
			return err
		}
		prov.Files[path.Clean(f.Dst)] = sum
	}
	pj, err := json.MarshalIndent(prov, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, path.Dir(ProvenancePath)), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, ProvenancePath), append(pj, '\n'), 0o644); err != nil {
		return err
	}
	b.step("clean apt caches")
	if len(v.Debian) > 0 {
		if err := b.chroot(ctx, "apt-get", "clean"); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(root, "usr/sbin/policy-rc.d"))
	for _, glob := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/log/*", "usr/share/man/*", "usr/share/doc/*", "tmp/*", "root/.cache"} {
		matches, _ := filepath.Glob(filepath.Join(root, glob))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	if err := unmountUnder(root); err != nil {
		return err
	}
	b.step("tar the root filesystem")
	tmp := dst + ".partial"
	if err := b.run(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	// The provenance also sits beside the cached tarball, for operators.
	_ = os.WriteFile(strings.TrimSuffix(dst, ".tar")+".json", append(pj, '\n'), 0o644)
	d := time.Since(start).Round(time.Second)
	b.step("built template %s (%s) in %s", v.Name, filepath.Base(dst), d)
	opts.Logger.InfoContext(ctx, "template image root filesystem built", "template", v.Name, "tarball", dst, "duration", d)
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return "", err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), out.Close()
}

// variantChanges are the import's Dockerfile instructions: the base
// image's, and labels naming the template.
func variantChanges(v Variant, hash string) []string {
	return append(changes(), "LABEL dev.triad.template="+v.Name, "LABEL dev.triad.template.hash="+hash, "LABEL dev.triad.base="+Tag())
}

func importVariant(ctx context.Context, cli Client, opts Options, tarball, tag string, v Variant) error {
	hash, err := v.Hash()
	if err != nil {
		return err
	}
	return importWith(ctx, cli, opts, tarball, tag, "triad sandbox template "+v.Name+", "+variantRecipe+" on "+Tag(), variantChanges(v, hash))
}

// ExportVariantDockerArchive writes the variant's image to w as a
// docker-archive, as ExportDockerArchive does the sandbox image's.
func ExportVariantDockerArchive(ctx context.Context, w io.Writer, opts Options, v Variant) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	tag, err := v.Tag()
	if err != nil {
		return "", err
	}
	tarball, err := VariantTarball(ctx, opts, v)
	if err != nil {
		return "", err
	}
	f, err := os.Open(tarball)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	c := Config()
	if _, err := dockerarchive.Write(ctx, w, dockerarchive.Image{
		Tag: tag, Layer: f, LayerSize: fi.Size(),
		Config:    dockerarchive.Config{Env: c.Env, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User},
		CreatedBy: "triad image export --template " + v.Name + " (" + variantRecipe + " on " + Tag() + ")",
	}); err != nil {
		return "", err
	}
	fmt.Fprintf(opts.Progress, "image: exported %s (%d MiB) as a docker-archive\n", tag, fi.Size()>>20)
	return tag, nil
}

// Digest returns the engine's id of an image (its config digest,
// "sha256:…"), which names exactly what a run ran on.
func Digest(ctx context.Context, cli Client, ref string) (string, error) {
	info, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %w", ref, err)
	}
	return info.ID, nil
}
