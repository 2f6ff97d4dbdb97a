// Package templatetest gives tests a templates directory with a small real template, and builds template images once per test binary.
package templatetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/egress/egresstest"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/sandbox/image/imagetest"
	"github.com/triadhq/triad/sandbox/template"
)

// Tiny is the name of the template Dir writes: the sandbox image plus jq
// (a Debian package), the triad_tiny wheel from a wheelhouse (its module
// says HELLO = "tiny"), and /etc/triad-tiny.txt.
const Tiny = "tiny"

// TinyFile is the content of /etc/triad-tiny.txt in Tiny's image.
const TinyFile = "placed by the tiny template\n"

// Dir writes a templates directory holding Tiny and returns it. Its
// contents are the same for every test, so Tiny's image is built once per
// machine and cached by content.
func Dir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	wheels := filepath.Join(dir, "wheels")
	files := filepath.Join(dir, "files")
	for _, d := range []string{wheels, files} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	egresstest.MakeWheel(t, "triad_tiny", "1.0", "HELLO = \"tiny\"\n").WriteTo(t, wheels)
	if err := os.WriteFile(filepath.Join(files, "tiny.txt"), []byte(TinyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml := `description: The sandbox image plus jq, a wheel and a file (Triad's tests).
debian: [jq]
wheelhouse: wheels
wheels: [triad_tiny]
files:
  - src: files/tiny.txt
    dst: /etc/triad-tiny.txt
limits:
  pids: 300
`
	if err := os.WriteFile(filepath.Join(dir, Tiny+".yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Image builds (or imports from the cache) the image of the set's template
// name and returns its tag. A missing engine skips locally and fails
// under CI.
func Image(t testing.TB, set *template.Set, name string) string {
	t.Helper()
	imagetest.Tag(t)
	tm, err := set.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Variant == nil {
		return imagetest.Tag(t)
	}
	mu.Lock()
	defer mu.Unlock()
	tag, err := tm.Variant.Tag()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := built[tag]; ok {
		return tag
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (a template's image is built in a chroot)")
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if tag, err = image.EnsureVariant(ctx, cli, image.Options{Progress: os.Stderr}, *tm.Variant); err != nil {
		t.Fatalf("build template %s: %v", name, err)
	}
	built[tag] = tag
	return tag
}

// KubeImage imports the image of the set's template name into the test
// cluster's containerd (TRIAD_KUBE_CONTAINERD, from scripts/kube.sh env),
// as an operator does with `triad image export --template`, and returns
// its tag. A missing cluster skips locally and fails under CI.
func KubeImage(t testing.TB, set *template.Set, name string) string {
	t.Helper()
	sock := os.Getenv("TRIAD_KUBE_CONTAINERD")
	if sock == "" {
		testenv.Missing(t, `TRIAD_KUBE_CONTAINERD (eval "$(scripts/kube.sh up)")`)
	}
	tm, err := set.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := tm.Variant.Tag()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, ok := built["kube:"+tag]; ok {
		return tag
	}
	ref := "docker.io/library/" + tag
	ctr := func(args ...string) *exec.Cmd {
		return exec.Command("ctr", append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
	}
	if out, err := ctr("images", "ls", "-q", "name=="+ref).Output(); err != nil || !strings.Contains(string(out), ref) {
		cmd := ctr("images", "import", "-")
		w, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		_, xerr := image.ExportVariantDockerArchive(ctx, w, image.Options{Progress: os.Stderr}, *tm.Variant)
		w.Close()
		if err := cmd.Wait(); err != nil || xerr != nil {
			t.Fatalf("import %s into the cluster: %v %v: %s", tag, xerr, err, stderr.String())
		}
	}
	built["kube:"+tag] = tag
	return tag
}
