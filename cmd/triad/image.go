package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/template"
)

const imageUsage = "usage: triad image build [--force] [--template NAME --templates DIR] | triad image tag [--image server] [--template NAME --templates DIR] | triad image export [--image sandbox|server] [--template NAME --templates DIR] --format docker-archive [-o FILE]"

// imageCmd is "triad image build|tag|export".
func imageCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", imageUsage)
	}
	switch args[0] {
	case "tag":
		var which string
		var tf templateFlags
		fs := newFlagSet("image tag")
		fs.StringVar(&which, "image", "sandbox", "which image: sandbox (kernels) or server (Triad itself)")
		tf.flags(fs)
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		v, err := tf.variant()
		if err != nil {
			return err
		}
		switch {
		case v != nil:
			tag, err := v.Tag()
			if err != nil {
				return err
			}
			fmt.Println(tag)
		case which == "sandbox":
			fmt.Println(image.Tag())
		case which == "server":
			fmt.Println(serverTag())
		default:
			return fmt.Errorf("--image %q: want sandbox or server", which)
		}
		return nil
	case "build":
		return imageBuild(ctx, args[1:])
	case "export":
		return imageExport(ctx, args[1:])
	}
	return fmt.Errorf("%s", imageUsage)
}

func imageBuild(ctx context.Context, args []string) error {
	var force bool
	var cacheDir string
	var tf templateFlags
	fs := newFlagSet("image build")
	fs.BoolVar(&force, "force", false, "rebuild the root filesystem even when a cached one exists")
	fs.str(&cacheDir, "cache", "", "cache directory for the root filesystem tarball (default ${TRIAD_CACHE:-$HOME/.cache/triad})")
	tf.flags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	v, err := tf.variant()
	if err != nil {
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
	if v != nil {
		if force {
			return fmt.Errorf("--force rebuilds the base image only; a template's image is rebuilt when its inputs change")
		}
		build = func(ctx context.Context, cli image.Client, opts image.Options) (string, error) {
			return image.EnsureVariant(ctx, cli, opts, *v)
		}
	}
	tag, err := build(ctx, cli, opts)
	if err != nil {
		return err
	}
	fmt.Println(tag)
	return nil
}

// imageExport writes an image as an archive another runtime imports
// without a registry, for example
// `triad image export --format docker-archive | ctr -n k8s.io images import -`.
// It needs no Docker engine. The sandbox image's layer is the cached root
// filesystem, built first when missing; the server image's is this binary
// (static, CGO_ENABLED=0) with CA certificates.
func imageExport(ctx context.Context, args []string) error {
	var format, out, cacheDir, which, caFile string
	var tf templateFlags
	fs := newFlagSet("image export")
	tf.flags(fs)
	fs.StringVar(&which, "image", "sandbox", "which image: sandbox (kernels) or server (Triad itself, tagged `triad image tag --image server`)")
	fs.StringVar(&caFile, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA certificate bundle the server image carries")
	fs.StringVar(&format, "format", "docker-archive", "archive format; docker-archive (the format of docker save) is the only one")
	fs.StringVar(&out, "o", "-", "output file; - is stdout")
	fs.str(&cacheDir, "cache", "", "cache directory for the root filesystem tarball (default ${TRIAD_CACHE:-$HOME/.cache/triad})")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if format != "docker-archive" {
		return fmt.Errorf("--format %q: want docker-archive", format)
	}
	if which != "sandbox" && which != "server" {
		return fmt.Errorf("--image %q: want sandbox or server", which)
	}
	v, err := tf.variant()
	if err != nil {
		return err
	}
	var w io.Writer = os.Stdout
	if out == "-" {
		if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return fmt.Errorf("refusing to write an image archive to a terminal; pipe it or give -o FILE")
		}
	} else {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	switch {
	case v != nil:
		_, err = image.ExportVariantDockerArchive(ctx, w, image.Options{CacheDir: cacheDir, Progress: os.Stderr}, *v)
	case which == "server":
		_, err = exportServer(ctx, w, caFile, os.Stderr)
	default:
		_, err = image.ExportDockerArchive(ctx, w, image.Options{CacheDir: cacheDir, Progress: os.Stderr})
	}
	if err != nil {
		if out != "-" {
			os.Remove(out)
		}
		return err
	}
	if f, ok := w.(*os.File); ok && out != "-" {
		return f.Close()
	}
	return nil
}

// templateFlags name a sandbox template whose image to build, tag or
// export.
type templateFlags struct {
	name, dir string
}

func (t *templateFlags) flags(fs *flagSet) {
	fs.StringVar(&t.name, "template", "", "a sandbox template's image instead of the base sandbox image (see --templates)")
	fs.str(&t.dir, "templates", "", "directory of sandbox templates, one NAME.yaml each (docs/sandboxes.md, \"Templates\")")
}

// variant returns the named template's image, nil when no template is
// named or the template adds nothing to the base image.
func (t *templateFlags) variant() (*image.Variant, error) {
	if t.name == "" {
		return nil, nil
	}
	if t.dir == "" {
		return nil, fmt.Errorf("--template %s needs --templates DIR (TRIAD_TEMPLATES)", t.name)
	}
	set, err := template.Load(t.dir, nil)
	if err != nil {
		return nil, err
	}
	tm, err := set.Get(t.name)
	if err != nil {
		return nil, fmt.Errorf("%w (templates: %s)", err, strings.Join(set.Names(), ", "))
	}
	if tm.Variant == nil {
		return nil, fmt.Errorf("template %s adds nothing to the sandbox image: it runs %s", tm.Name, image.Tag())
	}
	return tm.Variant, nil
}
