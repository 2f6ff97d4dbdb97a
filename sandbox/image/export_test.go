package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestExportDockerArchive exports a stand-in root filesystem from a cache
// directory and reads the archive back the way an importer does: through
// manifest.json to the config and the layer, whose digest the config names.
// scripts/kube.sh imports the real one into containerd, and
// deploy/kubernetes' tests run pods from it.
func TestExportDockerArchive(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	var rootfs bytes.Buffer
	tw := tar.NewWriter(&rootfs)
	for _, f := range []struct{ name, body string }{{"etc/os-release", "ID=debian\n"}, {"usr/bin/python3", "#!fake\n"}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.body))
	}
	tw.Close()
	path := TarballPath(cache)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, rootfs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	tag, err := ExportDockerArchive(t.Context(), &out, Options{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	if tag != Tag() {
		t.Errorf("got tag %q, want %q", tag, Tag())
	}

	files := map[string][]byte{}
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifest) != 1 || len(manifest[0].Layers) != 1 || !slices.Equal(manifest[0].RepoTags, []string{Tag()}) {
		t.Fatalf("got manifest %+v, want one image tagged %s with one layer", manifest, Tag())
	}
	layer, ok := files[manifest[0].Layers[0]]
	if !ok || !bytes.Equal(layer, rootfs.Bytes()) {
		t.Fatalf("layer %q: got %d bytes, want the %d bytes of the cached root filesystem", manifest[0].Layers[0], len(layer), rootfs.Len())
	}
	var config struct {
		OS     string `json:"os"`
		Config struct {
			Env        []string
			Cmd        []string
			WorkingDir string
			User       string
		} `json:"config"`
		RootFS struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[manifest[0].Config], &config); err != nil {
		t.Fatalf("config %q: %v", manifest[0].Config, err)
	}
	sum := sha256.Sum256(rootfs.Bytes())
	if want := []string{"sha256:" + hex.EncodeToString(sum[:])}; config.RootFS.Type != "layers" || !slices.Equal(config.RootFS.DiffIDs, want) {
		t.Errorf("rootfs: got %+v, want layers %v", config.RootFS, want)
	}
	if config.OS != "linux" {
		t.Errorf("os: got %q, want linux", config.OS)
	}
	// The same configuration docker import gets through changes().
	want := Config()
	got := RunConfig{Env: config.Config.Env, Cmd: config.Config.Cmd, WorkingDir: config.Config.WorkingDir, User: config.Config.User}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	for _, c := range changes() {
		if v, ok := strings.CutPrefix(c, "ENV "); ok && !slices.Contains(got.Env, v) {
			t.Errorf("docker import sets %q, the archive does not", v)
		}
	}
}
