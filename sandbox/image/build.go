package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// defaultMirror is used when /etc/apt names no Debian mirror.
const defaultMirror = "http://deb.debian.org/debian"

// buildRootfs runs the recipe into a scratch directory next to the cache and
// leaves the tarball at dst. The steps are recorded by recipeVersion: change
// one and bump it.
func buildRootfs(ctx context.Context, opts Options, dst string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("building the sandbox image needs root (debootstrap and chroot); run `triad image build` as root, or copy a built tarball to " + dst)
	}
	for _, tool := range []string{"debootstrap", "chroot", "tar", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("building the sandbox image needs %s (apt-get install debootstrap): %w", tool, err)
		}
	}
	mirror := opts.Mirror
	if mirror == "" {
		mirror = hostMirror(opts)
	}
	start := time.Now()
	// The scratch dir sits next to the tarball so the final rename is
	// atomic and a crash leaves only a directory the next build removes.
	scratch := filepath.Join(filepath.Dir(dst), "build-"+Hash()[:12])
	if err := cleanScratch(scratch); err != nil {
		return err
	}
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	defer func() {
		if cerr := cleanScratch(scratch); cerr != nil && err == nil {
			err = cerr
		}
	}()
	root := filepath.Join(scratch, "rootfs")
	b := &builder{opts: opts, root: root}

	b.step("debootstrap --variant=minbase %s from %s", Suite, mirror)
	if err := b.run(ctx, "debootstrap", "--variant=minbase", Suite, root, mirror); err != nil {
		return err
	}
	// debootstrap leaves only "<suite> main"; updates and security fixes
	// belong in an image that runs untrusted code.
	sources := fmt.Sprintf("deb %[1]s %[2]s main\ndeb %[1]s %[2]s-updates main\ndeb %[3]s %[2]s-security main\n",
		mirror, Suite, securityMirror(mirror))
	if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return err
	}
	// Keep package scripts from starting daemons inside the chroot.
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	// Some postinst scripts (fontconfig, python byte-compilation) want
	// /proc; mount it for the chroot's lifetime only.
	if err := b.run(ctx, "mount", "-t", "proc", "proc", filepath.Join(root, "proc")); err != nil {
		return err
	}
	defer func() {
		if uerr := unmountUnder(root); uerr != nil && err == nil {
			err = uerr
		}
	}()

	b.step("apt-get update")
	if err := b.chroot(ctx, "apt-get", "update"); err != nil {
		return err
	}
	b.step("apt-get install --no-install-recommends (%d packages from packages.txt)", len(Packages()))
	args := append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, Packages()...)
	if err := b.chroot(ctx, args...); err != nil {
		return err
	}

	b.step("sandbox user %s (%d:%d), home %s, mount points, matplotlib font cache", User, UID, GID, Home)
	if err := b.chroot(ctx, "groupadd", "--gid", fmt.Sprint(GID), User); err != nil {
		return err
	}
	if err := b.chroot(ctx, "useradd", "--uid", fmt.Sprint(UID), "--gid", fmt.Sprint(GID),
		"--no-create-home", "--home-dir", Home, "--shell", "/bin/bash", User); err != nil {
		return err
	}
	// Work is the mount point of the run's files (and HOME); /work names
	// it too, for code written for Triad's earlier layout.
	for _, d := range []string{Work, "run/kernel", Scratch} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(root, Work), UID, GID); err != nil {
		return err
	}
	if err := os.Symlink(Work, filepath.Join(root, "work")); err != nil {
		return err
	}
	// The run-time rootfs is read-only, so matplotlib could never keep a
	// font cache; build it once here for the kernel to copy into its tmpfs.
	if err := b.chroot(ctx, "env", "MPLCONFIGDIR="+MPLSeed, "HOME=/root",
		"python3", "-c", "import matplotlib.font_manager as f; f.fontManager.findfont('DejaVu Sans')"); err != nil {
		return err
	}

	b.step("sudo shim, mount point %s; Deno %s for the JavaScript and TypeScript kernels", PythonDir, denoVersion)
	if err := installTriad(root); err != nil {
		return err
	}
	deno, err := denoTarball(ctx, b, opts.CacheDir)
	if err != nil {
		return err
	}
	if err := installDeno(deno, root); err != nil {
		return err
	}
	if err := b.chroot(ctx, "deno", "--version"); err != nil {
		return err
	}
	// IRkernel loads as it will at run time: a package that is missing or
	// broken fails the build, not a run.
	if err := b.chroot(ctx, "Rscript", "-e", "library(IRkernel)"); err != nil {
		return err
	}

	b.step("clean apt caches and docs")
	if err := b.chroot(ctx, "apt-get", "clean"); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(root, "usr/sbin/policy-rc.d")); err != nil {
		return err
	}
	for _, glob := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/log/*", "usr/share/man/*", "usr/share/info/*", "usr/share/doc/*", "tmp/*", "root/.cache"} {
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
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	d := time.Since(start).Round(time.Second)
	b.step("built %s (%d MiB) in %s", dst, fi.Size()>>20, d)
	opts.Logger.InfoContext(ctx, "sandbox image root filesystem built", "tarball", dst, "bytes", fi.Size(), "duration", d)
	return nil
}

// builder runs the recipe's commands, streaming their output to Progress
// and keeping the tail for error messages.
type builder struct {
	opts  Options
	root  string
	steps int
	t0    time.Time
}

func (b *builder) step(format string, args ...any) {
	if b.t0.IsZero() {
		b.t0 = time.Now()
	}
	b.steps++
	fmt.Fprintf(b.opts.Progress, "image: [%s] %s\n", time.Since(b.t0).Round(time.Second), fmt.Sprintf(format, args...))
}

func (b *builder) chroot(ctx context.Context, args ...string) error {
	return b.run(ctx, "chroot", append([]string{b.root}, args...)...)
}

func (b *builder) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"DEBIAN_FRONTEND=noninteractive",
		"LANG=C.UTF-8",
		"HOME=/root",
	}
	// Kill the whole process group on cancel: debootstrap and apt-get
	// leave dpkg and maintainer scripts running otherwise.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	tail := &tailWriter{max: 40}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(b.opts.Progress, "  %s\n", sc.Text())
			tail.add(sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("image build: %s %s: %w\n%s", name, strings.Join(args, " "), err, tail)
	}
	return nil
}

// output runs a command and returns its stdout; its stderr goes to
// Progress.
func (b *builder) output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"}
	cmd.Stderr = b.opts.Progress
	return cmd.Output()
}

type tailWriter struct {
	max   int
	lines []string
}

func (t *tailWriter) add(line string) {
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tailWriter) String() string { return strings.Join(t.lines, "\n") }

// cleanScratch removes a scratch build directory, first unmounting whatever
// an interrupted build left mounted inside it (debootstrap mounts /proc and
// /sys; RemoveAll on a mounted /proc would wander into the host's).
func cleanScratch(scratch string) error {
	if err := unmountUnder(scratch); err != nil {
		return err
	}
	if err := os.RemoveAll(scratch); err != nil {
		return fmt.Errorf("remove image build scratch: %w", err)
	}
	return nil
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return fmt.Errorf("list mounts: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		// /proc/self/mounts escapes spaces and the like as octal.
		p := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[1])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := unmount(p); err != nil {
			return err
		}
	}
	return nil
}

// unmount detaches path if something is mounted there; it is a no-op
// otherwise.
func unmount(path string) error {
	for range 3 {
		err := syscall.Unmount(path, syscall.MNT_DETACH)
		if err == nil {
			continue // a second mount may sit underneath
		}
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return nil // not a mount point (any more)
		}
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// hostMirror returns the first Debian archive mirror /etc/apt names
// (one-line or deb822 sources), skipping security and third-party
// repositories.
func hostMirror(opts Options) string {
	var files []string
	files = append(files, "/etc/apt/sources.list")
	more, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	files = append(files, more...)
	for _, f := range files {
		if !strings.HasSuffix(f, ".list") && !strings.HasSuffix(f, ".sources") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if m := mirrorIn(string(data)); m != "" {
			opts.Logger.Debug("debian mirror from apt sources", "file", f, "mirror", m)
			return m
		}
	}
	return defaultMirror
}

// mirrorIn finds a Debian archive URI in a sources file of either format.
func mirrorIn(text string) string {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		var uris []string
		switch {
		case strings.HasPrefix(line, "deb "):
			f := strings.Fields(line)
			for _, w := range f[1:] {
				if strings.HasPrefix(w, "[") || strings.HasSuffix(w, "]") || strings.Contains(w, "=") {
					continue
				}
				uris = []string{w}
				break
			}
		case strings.HasPrefix(line, "URIs:"):
			uris = strings.Fields(strings.TrimPrefix(line, "URIs:"))
		}
		for _, u := range uris {
			u = strings.TrimRight(u, "/")
			if strings.HasSuffix(u, "/debian") && (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
				return u
			}
		}
	}
	return ""
}

// securityMirror maps an archive mirror to its security sibling, the way
// deb.debian.org serves both (…/debian and …/debian-security).
func securityMirror(mirror string) string {
	return mirror + "-security"
}
