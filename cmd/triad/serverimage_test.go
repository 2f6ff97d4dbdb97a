package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/testenv"
)

// TestServerImage: a static triad exports its own image, which Docker
// loads and runs as the nonroot user; a dynamically linked triad refuses.
func TestServerImage(t *testing.T) {
	if _, err := exec.LookPath("docker"); err != nil {
		testenv.Missing(t, "the docker CLI")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		testenv.Missing(t, "a Docker engine (dockerd)")
	}
	dir := t.TempDir()
	ver := fmt.Sprintf("test-%d", time.Now().UnixNano())
	static := filepath.Join(dir, "triad")
	build := exec.Command("go", "build", "-o", static, "-ldflags", "-X github.com/triadhq/triad/internal/version.Version="+ver, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tag, err := exec.Command(static, "image", "tag", "--image", "server").Output()
	if err != nil || strings.TrimSpace(string(tag)) != "triad:"+ver {
		t.Fatalf("image tag --image server: got %q, %v, want triad:%s", tag, err, ver)
	}
	archive := filepath.Join(dir, "server.tar")
	if out, err := exec.Command(static, "image", "export", "--image", "server", "-o", archive).CombinedOutput(); err != nil {
		t.Fatalf("image export: %v\n%s", err, out)
	}
	if out, err := exec.Command("docker", "load", "-i", archive).CombinedOutput(); err != nil || !strings.Contains(string(out), "triad:"+ver) {
		t.Fatalf("docker load: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", "triad:"+ver).Run() })
	out, err := exec.Command("docker", "run", "--rm", "--network", "none", "triad:"+ver, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != ver {
		t.Errorf("docker run triad version: got %q, %v, want %s", out, err, ver)
	}
	out, err = exec.Command("docker", "image", "inspect", "--format", "{{.Config.User}} {{json .Config.Entrypoint}}", "triad:"+ver).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != `65532:65532 ["/triad"]` {
		t.Errorf("image config: got %q, %v, want user 65532 and entrypoint /triad", out, err)
	}

	dynamic := filepath.Join(dir, "triad-cgo")
	build = exec.Command("go", "build", "-o", dynamic, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(dynamic, "image", "export", "--image", "server", "-o", filepath.Join(dir, "x.tar")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CGO_ENABLED=0") {
		t.Errorf("a dynamically linked triad exported its image: %v\n%s", err, out)
	}
}
