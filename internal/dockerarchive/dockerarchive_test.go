package dockerarchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestWrite reads an archive back as an importer does: manifest.json to
// the config and the layer, whose digest the config and Write name.
func TestWrite(t *testing.T) {
	layer := []byte(strings.Repeat("layer bytes ", 1000))
	var out bytes.Buffer
	digest, err := Write(t.Context(), &out, Image{Tag: "x:1", Layer: bytes.NewReader(layer), LayerSize: int64(len(layer)),
		Config: Config{Entrypoint: []string{"/x"}, User: "1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(layer)
	if want := "sha256:" + hex.EncodeToString(sum[:]); digest != want {
		t.Errorf("digest: got %s, want %s", digest, want)
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
		files[h.Name], _ = io.ReadAll(tr)
	}
	var m []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files[ManifestName], &m); err != nil || len(m) != 1 || m[0].RepoTags[0] != "x:1" {
		t.Fatalf("manifest: %s, %v", files[ManifestName], err)
	}
	var c imageConfig
	if err := json.Unmarshal(files[m[0].Config], &c); err != nil {
		t.Fatal(err)
	}
	if c.RootFS.DiffIDs[0] != digest || c.Config.Entrypoint[0] != "/x" || c.Config.User != "1:1" || !bytes.Equal(files[m[0].Layers[0]], layer) {
		t.Errorf("config %+v or layer do not match", c)
	}
}

// TestShortLayer: a layer that ends before its stated size is an error,
// not a truncated image.
func TestShortLayer(t *testing.T) {
	_, err := Write(t.Context(), io.Discard, Image{Tag: "x:1", Layer: strings.NewReader("short"), LayerSize: 100})
	if err == nil || !strings.Contains(err.Error(), "ended after 5 of 100") {
		t.Errorf("got %v, want the short layer refused", err)
	}
}
