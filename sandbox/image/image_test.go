package image

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/triadhq/triad/internal/testenv"
)

func TestPackagesList(t *testing.T) {
	t.Parallel()
	pkgs := Packages()
	for _, want := range []string{"python3", "python3-ipykernel", "python3-jupyter-client", "python3-pandas", "weasyprint", "fonts-dejavu-core", "tzdata"} {
		if !slices.Contains(pkgs, want) {
			t.Errorf("Packages() lacks %q; got %v", want, pkgs)
		}
	}
	for _, p := range pkgs {
		if strings.ContainsAny(p, " #\t") {
			t.Errorf("package %q: comments and blanks must be stripped", p)
		}
	}
}

func TestTagNamesTheRecipe(t *testing.T) {
	t.Parallel()
	if got := Tag(); !regexp.MustCompile(`^triad-sandbox:[0-9a-f]{12}$`).MatchString(got) {
		t.Fatalf("Tag() = %q, want triad-sandbox:<12 hex>", got)
	}
	// A changed list must change the tag.
	before := Hash()
	if after := hashOf(append(slices.Clone(packagesTxt), []byte("python3-sympy\n")...)); after == before {
		t.Fatalf("Hash() did not change with the package list: %s", after)
	}
}

func TestDockerfileInstallsTheList(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FROM debian:trixie-slim", "COPY packages.txt", "$(grep -v '^#' /tmp/packages.txt)", "--uid 1000", "WORKDIR /home/user", "COPY bin/sudo", "package/deno"} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// Every ENV the importer sets must be in the Dockerfile too, so both
	// images behave alike.
	for _, c := range changes() {
		if v, ok := strings.CutPrefix(c, "ENV "); ok && !bytes.Contains(df, []byte(v)) {
			t.Errorf("Dockerfile lacks %q (set by docker import)", v)
		}
	}
}

func TestMirrorIn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, text, want string }{
		{"deb822", "Types: deb\n# comment\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n", "http://deb.debian.org/debian"},
		{"one-line with options", "deb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian/ bookworm main\n", "http://ftp.de.debian.org/debian"},
		{"security only", "URIs: http://deb.debian.org/debian-security\n", ""},
		{"third party", "deb https://packages.cloud.google.com/apt cloud-sdk main\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mirrorIn(tc.text); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestEnsure builds (or imports from the cache) the real image and runs a
// container from it, the way CI does before the Docker backend's tests.
func TestEnsure(t *testing.T) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		testenv.Missing(t, "a Docker engine (dockerd)")
	}
	var progress bytes.Buffer
	start := time.Now()
	tag, err := Ensure(ctx, cli, Options{Progress: &progress})
	if err != nil {
		if os.Geteuid() != 0 {
			testenv.Missing(t, "root (to debootstrap the sandbox image)")
		}
		t.Fatalf("Ensure: %v\n%s", err, tailOf(progress.String(), 3000))
	}
	t.Logf("Ensure(%s) took %s", tag, time.Since(start).Round(time.Millisecond))
	if tag != Tag() {
		t.Fatalf("got tag %q, want %q", tag, Tag())
	}
	inspect, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := inspect.Config.WorkingDir, "/home/user"; got != want {
		t.Errorf("WorkingDir: got %q, want %q", got, want)
	}
	if got, want := inspect.Config.User, "1000:1000"; got != want {
		t.Errorf("User: got %q, want %q", got, want)
	}
	t.Logf("image %s: %d MiB", tag, inspect.Size>>20)

	// The image must hold everything packages.txt promises, importable as
	// the sandbox user on a read-only root with no network.
	script := `import ipykernel, jupyter_client, numpy, pandas, scipy, statsmodels, matplotlib, seaborn, sklearn, jinja2, openpyxl, xlsxwriter, docx, reportlab, weasyprint, markdown, bs4, lxml, tabulate, plotly, matplotlib_inline, os
assert os.getuid() == 1000, os.getuid()
print("ok", ipykernel.__version__)`
	resp, err := cli.ContainerCreate(ctx, &container.Config{Image: tag, Cmd: []string{"python3", "-c", script}},
		&container.HostConfig{NetworkMode: "none", ReadonlyRootfs: true, Tmpfs: map[string]string{"/tmp": ""}}, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(context.WithoutCancel(ctx), resp.ID, container.RemoveOptions{Force: true})
	waitC, errC := cli.ContainerWait(ctx, resp.ID, container.WaitConditionNextExit)
	if err := cli.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	var code int64
	select {
	case w := <-waitC:
		code = w.StatusCode
	case err := <-errC:
		t.Fatal(err)
	}
	logs, err := cli.ContainerLogs(ctx, resp.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, logs); err != nil {
		t.Fatal(err)
	}
	if code != 0 || !bytes.HasPrefix(stdout.Bytes(), []byte("ok ")) {
		t.Fatalf("python in the image: exit %d\n%s%s", code, stdout.Bytes(), stderr.Bytes())
	}
	t.Logf("python in the image: %s", bytes.TrimSpace(stdout.Bytes()))
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
