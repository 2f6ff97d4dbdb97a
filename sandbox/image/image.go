package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

//go:embed packages.txt
var packagesTxt []byte

// Recipe constants. They are part of the tag hash: change any of them (or
// the build steps in build.go, then bump recipeVersion) and the tag changes.
const (
	// recipeVersion names the build steps in build.go. Bump it whenever those
	// steps change what ends up in the root filesystem.
	recipeVersion = "triad-sandbox-builder/4"
	// Suite is the Debian release the image is built from.
	Suite = "trixie"
	// Repository is the image name; the tag is the recipe hash.
	Repository = "triad-sandbox"
	// UID and GID are the sandbox user's ids in the image. The Docker
	// backend may run kernels under another uid (the service's own, so it can
	// reach their sockets); the image does not depend on a passwd entry.
	UID = 1000
	GID = 1000
	// User is the sandbox user's name, E2B's: agents written for E2B's
	// sandboxes say `user` and /home/user.
	User = "user"
	// Work is where a kernel sees the run's files, its working directory
	// (the run's files are mounted here). It is also the sandbox user's
	// HOME, as in E2B's sandboxes, so relative paths, ~ and /home/user name
	// the same files from a cell, a command and every surface. /work is a
	// symlink to it, for code written against Triad's earlier layout. See
	// docs/DECISIONS.md, "One working directory: /home/user".
	Work = "/home/user"
	// Home is the sandbox user's home: the working directory.
	Home = Work
	// Scratch holds what tools keep for themselves and nobody asked to
	// keep (matplotlib's font cache, IPython's profile, Jupyter's runtime
	// files, Deno's module cache): on the container's /tmp tmpfs, so it is
	// neither harvested into the run's files nor counted in its quota.
	Scratch = "/tmp/home"
	// PythonDir is where a kernel finds Triad's own Python modules (rich
	// displays, the bash kernel, the Deno kernel's relay), mounted
	// read-only by the backend from WritePython; it is on PYTHONPATH.
	PythonDir = "/opt/triad/python"
	// MPLSeed holds a matplotlib font cache built at image build time; the
	// kernel copies it into MPLCONFIGDIR at start so that the first plot
	// does not spend a second scanning fonts.
	MPLSeed = "/opt/triad/mplconfig"
)

// Packages returns the Debian packages the image holds, in file order,
// without comments and blank lines.
func Packages() []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(packagesTxt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	return out
}

// Hash is the hex sha256 of the package list and the builder's recipe. It
// names both the image tag and the cached tarball.
func Hash() string { return hashOf(packagesTxt) }

func hashOf(list []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nsuite=%s uid=%d gid=%d user=%s home=%s work=%s mplseed=%s\n", recipeVersion, Suite, UID, GID, User, Home, Work, MPLSeed)
	for _, c := range changes() {
		fmt.Fprintln(h, c)
	}
	fmt.Fprintf(h, "deno=%s %s sudo=%x\n", denoVersion, denoIntegrity, sha256.Sum256(sudoShim))
	h.Write(list)
	return hex.EncodeToString(h.Sum(nil))
}

// Tag returns the image reference for the current package list and recipe,
// for example "triad-sandbox:0123456789ab".
func Tag() string { return Repository + ":" + Hash()[:12] }

// RunConfig is the image's run-time configuration: what `docker import`
// gets as Dockerfile instructions (changes) and what a docker-archive
// carries as its config (ExportDockerArchive). Both come from config(), so
// the Docker and Kubernetes images run kernels alike.
type RunConfig struct {
	// Env holds NAME=value pairs.
	Env []string
	// WorkingDir is the kernel's working directory.
	WorkingDir string
	// User is "uid:gid", numeric, so that runAsNonRoot can check it.
	User string
	// Cmd is the default command.
	Cmd []string
}

// Config returns the image's run-time configuration.
func Config() RunConfig {
	return RunConfig{
		Env: append([]string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
			"PYTHONDONTWRITEBYTECODE=1",
		}, KernelEnv()...),
		WorkingDir: Work,
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Cmd:        []string{"python3"},
	}
}

// KernelEnv is the environment every interpreter and command in a sandbox
// gets from both backends, beside PATH and LANG: HOME is the working
// directory, the caches tools keep for themselves live in Scratch, and
// Triad's Python modules are importable.
func KernelEnv() []string {
	return []string{
		"HOME=" + Home,
		"USER=" + User,
		"MPLCONFIGDIR=" + Scratch + "/.config/matplotlib",
		"MPLBACKEND=module://matplotlib_inline.backend_inline",
		"IPYTHONDIR=" + Scratch + "/.ipython",
		"JUPYTER_RUNTIME_DIR=" + Scratch + "/.local/share/jupyter/runtime",
		"JUPYTER_DATA_DIR=" + Scratch + "/.local/share/jupyter",
		"JUPYTER_CONFIG_DIR=" + Scratch + "/.jupyter",
		"XDG_CACHE_HOME=" + Scratch + "/.cache",
		"DENO_DIR=" + Scratch + "/.cache/deno",
		"DENO_NO_UPDATE_CHECK=1",
		"R_HISTFILE=" + Scratch + "/.Rhistory",
		"PYTHONPATH=" + PythonDir,
	}
}

// changes are the Dockerfile instructions applied on docker import; a plain
// import has no config at all. They are part of the tag hash.
func changes() []string {
	c := Config()
	var out []string
	for _, e := range c.Env {
		out = append(out, "ENV "+e)
	}
	cmd, _ := json.Marshal(c.Cmd)
	return append(out, "WORKDIR "+c.WorkingDir, "USER "+c.User, "CMD "+string(cmd))
}

// Options configure Ensure and Build. The zero value works.
type Options struct {
	// CacheDir holds the built root filesystem tarballs, under
	// CacheDir/image. Empty means ${TRIAD_CACHE:-$HOME/.cache/triad}.
	CacheDir string
	// Mirror is the Debian mirror debootstrap and apt use. Empty means the
	// first Debian mirror configured in /etc/apt, else deb.debian.org.
	Mirror string
	// Progress receives human-readable progress lines (steps and the
	// output of debootstrap and apt-get). Nil discards them.
	Progress io.Writer
	// Logger receives structured logs; nil is silent.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("TRIAD_CACHE")
	}
	if o.CacheDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return o, fmt.Errorf("no cache dir: set TRIAD_CACHE: %w", err)
		}
		o.CacheDir = filepath.Join(home, ".cache", "triad")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// TarballPath is where the root filesystem tarball for the current recipe is
// cached.
func TarballPath(cacheDir string) string {
	return filepath.Join(cacheDir, "image", Hash()+".tar")
}

// Client is the part of the moby client this package uses;
// *client.Client satisfies it.
type Client interface {
	ImageInspect(ctx context.Context, imageID string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
	ImageImport(ctx context.Context, source image.ImportSource, ref string, options image.ImportOptions) (io.ReadCloser, error)
}

var _ Client = (*client.Client)(nil)

// Ensure makes sure the engine has the image for the current recipe and
// returns its tag. It imports the cached tarball when there is one and
// builds it first when there is not (which needs root, debootstrap and the
// Debian mirror, and takes minutes). Concurrent callers on one machine wait
// for each other instead of building twice.
func Ensure(ctx context.Context, cli Client, opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	tag := Tag()
	if ok, err := present(ctx, cli, tag); err != nil || ok {
		return tag, err
	}
	unlock, err := lock(ctx, opts.CacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have imported it while we waited for the lock.
	if ok, err := present(ctx, cli, tag); err != nil || ok {
		return tag, err
	}
	tarball := TarballPath(opts.CacheDir)
	if _, err := os.Stat(tarball); err != nil {
		fmt.Fprintf(opts.Progress, "image: %s is missing and no cached root filesystem at %s; building it (several minutes)\n", tag, tarball)
		if err := buildRootfs(ctx, opts, tarball); err != nil {
			return "", err
		}
	} else {
		fmt.Fprintf(opts.Progress, "image: %s is missing; importing the cached root filesystem %s\n", tag, tarball)
	}
	if err := importTarball(ctx, cli, opts, tarball, tag); err != nil {
		return "", err
	}
	return tag, nil
}

// Build builds the root filesystem afresh (even when a tarball is cached),
// caches it and imports it as Tag(), replacing an image of that tag.
func Build(ctx context.Context, cli Client, opts Options) (string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	unlock, err := lock(ctx, opts.CacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	tag := Tag()
	tarball := TarballPath(opts.CacheDir)
	if err := buildRootfs(ctx, opts, tarball); err != nil {
		return "", err
	}
	if err := importTarball(ctx, cli, opts, tarball, tag); err != nil {
		return "", err
	}
	return tag, nil
}

func present(ctx context.Context, cli Client, tag string) (bool, error) {
	_, err := cli.ImageInspect(ctx, tag)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("inspect image %s: %w", tag, err)
	}
}

// lock takes an exclusive flock on the cache so two processes (two test
// binaries, a server and `triad image build`) never build at once. The wait
// is bounded by ctx.
func lock(ctx context.Context, cacheDir string) (func(), error) {
	dir := filepath.Join(cacheDir, "image")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("image cache lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("image cache lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another image build: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// importTarball streams the cached root filesystem into the engine.
func importTarball(ctx context.Context, cli Client, opts Options, tarball, tag string) error {
	return importWith(ctx, cli, opts, tarball, tag, "triad sandbox image, "+recipeVersion+", built by debootstrap "+Suite, changes())
}

// importWith imports a root filesystem tarball as tag, with a message and
// Dockerfile instructions.
func importWith(ctx context.Context, cli Client, opts Options, tarball, tag, message string, changes []string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
	start := time.Now()
	fmt.Fprintf(opts.Progress, "image: docker import %s as %s\n", tarball, tag)
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: f, SourceName: "-"}, tag, image.ImportOptions{
		Message: message,
		Changes: changes,
	})
	if err != nil {
		return fmt.Errorf("docker import %s: %w", tag, err)
	}
	defer rc.Close()
	// The engine answers with a JSON message stream; an error mid-stream
	// arrives as a message, not as an HTTP status.
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Status      string `json:"status"`
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("docker import %s: read reply: %w", tag, err)
		}
		if msg.Error != "" {
			return fmt.Errorf("docker import %s: %s", tag, msg.Error)
		}
	}
	if ok, err := present(ctx, cli, tag); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("docker import %s: the engine did not keep the image", tag)
	}
	d := time.Since(start).Round(100 * time.Millisecond)
	fmt.Fprintf(opts.Progress, "image: imported %s in %s\n", tag, d)
	opts.Logger.InfoContext(ctx, "sandbox image imported", "tag", tag, "tarball", tarball, "duration", d)
	return nil
}
